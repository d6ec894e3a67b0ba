"""`sm120-stacks docs [--check]`: write (or check) the generated tables of README.md and docs/;
the tables themselves are made by builder/report/tables.py."""

from __future__ import annotations

import click

from builder import REPO_ROOT
from builder.cli.app import Settings, cli, pass_settings, user_errors
from builder.files import write_atomic
from builder.report.tables import Stacks, stale_sections


@cli.command("docs")
@click.option("--check", is_flag=True, help="Change nothing; exit 1 when a table is stale.")
@pass_settings
@user_errors
def docs_command(settings: Settings, check: bool) -> None:
    """Write the generated tables of README.md and docs/ (stacks, rules) from the data."""
    stale = stale_sections(Stacks(settings.stacks_dir, settings.substitutions))
    for section, updated in stale:
        where = section.file.relative_to(REPO_ROOT)
        if check:
            click.echo(f"stale: the {section.name} of {where}", err=True)
        else:
            write_atomic(section.file, updated)
            click.echo(f"wrote the {section.name} of {where}")
    if check and stale:
        click.echo("run `sm120-stacks docs` (make docs) and commit the result", err=True)
        raise SystemExit(1)
