"""`sm120-stacks lock STACK`: base digests and every Python package, hash-pinned.

Its own module (not hosts.py, where it sat beside the pins) so that the command imports only
the lock step's modules; registered on the main `cli` group when builder.cli.app imports it.
"""

from __future__ import annotations

from pathlib import Path

import click

from builder.cli.app import Settings, cli, engine_option, pass_settings, user_errors
from builder.errors import StackError
from builder.lock.bases import refresh_bases as refresh_base_digests
from builder.lock.inputs import lock_path
from builder.lock.lockfile import UNPINNED
from builder.lock.reading import current_lock, read_lock
from builder.lock.uv_compile import make_lock
from builder.lock.writing import write_lock


@cli.command()
@click.argument("stack")
@click.option(
    "--versions-from",
    "versions_from",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Another lock whose versions to keep wherever this stack allows (a local variant "
    "of a flagship: its lock); what had to move is listed and recorded.",
)
@click.option(
    "--refresh-bases",
    is_flag=True,
    help="Only ask the registry for the base images' digests again and update the lock "
    "where it answers (the packages are not resolved again).",
)
@engine_option
@pass_settings
@user_errors
def lock(settings: Settings, stack: str, versions_from: Path | None, refresh_bases: bool) -> None:
    """Write stacks/STACK.lock: base digests and every Python package, hash-pinned (uv)."""
    resolved = settings.checked(stack)
    if refresh_bases:
        existing = current_lock(resolved)
        if existing is None:
            raise StackError(
                f"{stack} has no lock to refresh",
                key="--refresh-bases",
                hint=f"make one first: sm120-stacks lock {stack}",
            )
        engine, why = settings.connect_or_why()
        refreshed, said = refresh_base_digests(resolved, existing, engine)
        write_lock(lock_path(resolved), refreshed)
        for line in said:
            click.echo(f"  {line}")
        if why:
            click.echo(f"  (no engine: {why})")
        return
    prefer = read_lock(versions_from) if versions_from is not None else None
    engine, why = settings.connect_or_why()
    made = make_lock(resolved, engine, prefer)
    path = lock_path(resolved)
    write_lock(path, made)
    py = made.python
    click.echo(
        f"wrote {path}: {len(py.heavy) + len(py.packages)} packages "
        f"({len(py.heavy)} in the heavy layer) for {py.platform}, Python {py.version}"
    )
    for role, base in (("build", made.bases.build), ("runtime", made.bases.runtime)):
        click.echo(f"  {role} base {base.reference}: {base.note}")
    if made.python.versions_from is not None:
        source = made.python.versions_from
        click.echo(f"  versions of {versions_from} kept but for {len(source.differs)}:")
        for name, change in source.differs.items():
            click.echo(f"    {name}: {change}")
    if why:
        click.echo(f"  (no engine: {why})")
    for role, base in (("build", made.bases.build), ("runtime", made.bases.runtime)):
        if base.unpinned:
            why_not = base.note.removeprefix(UNPINNED)
            click.echo(
                f"warning: {role} base {base.image} is NOT pinned by digest ({why_not}): "
                "builds take whatever its tag points to that day; lock again where the "
                "registry answers",
                err=True,
            )
