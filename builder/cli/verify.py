"""`sm120-stacks test STACK`: validate the stack's current image and print the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from builder.cli.app import Settings, cli, out, pass_settings, user_errors
from builder.errors import StackError
from builder.image.engine import engine_api
from builder.spec.resolve import ResolvedStack
from builder.verify.report import TestReport
from builder.verify.validate import validate


def print_report(report: TestReport) -> None:
    table = Table("check", "result", "detail", title=f"{report.stack}  {report.image}")
    for check in report.checks:
        result = "skip" if check.skipped else ("pass" if check.passed else "FAIL")
        table.add_row(escape(check.name), result, escape(check.detail[:150]))
    out.print(table)
    if report.jit_cache:
        cache = Table("module", "arch", "size", "status", "detail", title="FlashInfer JIT cache")
        for row in report.jit_cache:
            cache.add_row(
                escape(row.module),
                " ".join(row.archs),
                f"{row.bytes / 1e6:.1f} MB",
                row.status,
                row.detail[:80],
            )
        out.print(cache)
    if report.smoke_skipped:
        out.print(f"GPU smoke: SKIPPED - {report.smoke_skipped}")
    elif report.smoke is not None:
        out.print(f"smoke: {'pass' if report.smoke.get('passed') else 'FAIL'}")
    out.print(f"{'PASSED' if report.passed else 'FAILED'}  report: {report.path}")


@cli.command("test")
@click.argument("stack")
@click.option("--require-gpu", is_flag=True, help="Fail instead of skipping the GPU smoke.")
@click.option(
    "--mount",
    "mounts",
    multiple=True,
    metavar="HOST:CONTAINER",
    help="Bind mount for the smoke server (e.g. a model directory).",
)
@click.option(
    "--ca-bundle",
    type=click.Path(path_type=Path),
    envvar="SM120_STACKS_CA_BUNDLE",
    help="The proxy CA given to builds: the image must hold none of it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_settings
@user_errors
def test_command(
    settings: Settings,
    stack: str,
    require_gpu: bool,
    mounts: tuple[str, ...],
    ca_bundle: Path | None,
    as_json: bool,
) -> None:
    """Validate the stack's current image: static checks, JIT cache, smoke prompt."""
    resolved = settings.checked(stack)
    api = engine_api()
    smoke = _smoke_runner(api, resolved, _parse_mounts(mounts), require_gpu, as_json)
    report = validate(api, resolved, settings.build_dir, ca_bundle, smoke)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print_report(report)
    if not report.passed:
        raise SystemExit(1)


def _parse_mounts(mounts: tuple[str, ...]) -> dict[str, str]:
    parsed = {}
    for mount in mounts:
        host, sep, container = mount.partition(":")
        if not sep or not container.startswith("/") or not Path(host).exists():
            raise StackError(
                f"mount {mount!r} is not HOST:CONTAINER with an existing HOST path", key="--mount"
            )
        parsed[str(Path(host).resolve())] = container
    return parsed


def _smoke_runner(
    api: Any, stack: ResolvedStack, mounts: dict[str, str], require_gpu: bool, as_json: bool
) -> Any:
    """A callable for validate(): runs the smoke prompt, or says why it was skipped. With --json,
    stdout carries the JSON report alone, so the smoke's own table goes to stderr."""

    def run(image_ref: str, report_dir: Path) -> dict[str, Any] | str:
        from builder.verify import smoke  # imports requests: paid only when a smoke runs

        needs_gpu = stack.manifest.smoke.needs_gpu
        if needs_gpu:
            skip = smoke.gpu_gate(api, require_gpu=require_gpu)
            if skip is not None:
                return skip
        if not stack.manifest.smoke.prompts:
            return "the manifest lists no smoke prompts"
        result = smoke.run_smoke(
            api,
            image_ref,
            stack,
            mounts=mounts,
            gpu=needs_gpu,
            report_path=report_dir / f"{stack.name}-smoke.json",
            log=lambda line: click.echo(line, err=True),
        )
        table = smoke.format_table(result)
        if as_json:
            click.echo(table, err=True)
        else:
            out.print(table)
        return dict(result.to_json())

    return run
