"""`sm120-stacks report STACK`: an HTML page per tested image of the stack (builder.report)."""

from __future__ import annotations

from pathlib import Path

import click

from builder.cli.app import Settings, cli, pass_settings, user_errors


@cli.command("report")
@click.argument("stack")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Folder for the pages (default: BUILD_DIR/STACK/reports, beside the test reports).",
)
@click.option(
    "--no-registry",
    is_flag=True,
    help="Do not ask the registries an image was pushed to for its evidence and SBOM.",
)
@pass_settings
@user_errors
def report_command(settings: Settings, stack: str, out_dir: Path | None, no_registry: bool) -> None:
    """Write one self-contained HTML page per tested image of STACK (verdicts, image checks, the
    JIT table, runtime compiles, smoke answers and speeds, the soak's chart, evidence and SBOM);
    print each page's path. Exit status 2 when STACK is unknown or was never tested."""
    from builder.report.gather import add_evidence, find_tested
    from builder.report.page import write_page

    settings.resolve(stack)  # an unknown stack is named as such, with the stacks folder
    for tested in find_tested(settings.build_dir, stack):
        if not no_registry:
            add_evidence(tested, stack)
        written = write_page(tested, out_dir or settings.build_dir / stack / "reports")
        click.echo(f"{written.path}  ({written.content_hash[:16]}: {written.verdict})")
