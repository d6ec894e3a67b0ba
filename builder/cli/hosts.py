"""Commands that pin serving hosts to tested images: lock, pin, deploy, verify, doctor.

Registered on the main `cli` group when builder.cli.app imports this module. Bad input exits 2
(user_errors); drift (verify) and missing prerequisites (doctor) exit 1, since they describe the
host, not the command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from builder.cli.app import Settings, cli, pass_settings, user_errors
from builder.errors import StackError, ToolMissing
from builder.hosts.deploy import apply, write_files
from builder.hosts.drift import verify as verify_host
from builder.hosts.hostcheck import Finding, check, gather, requirements_for
from builder.hosts.pins import PinOptions, load_pin, make_pin, write_pin
from builder.image.engine import engine_api
from builder.image.records import load_record
from builder.image.registry import Registry
from builder.lock.lockfile import lock_path, make_lock, read_lock, write_lock
from builder.render.context import render

EXIT_DRIFT = 1

hosts_dir_option = click.option(
    "--hosts-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Folder of host pins (default: hosts/ beside the stacks folder).",
)


def _hosts_dir(settings: Settings, value: Path | None) -> Path:
    return value if value is not None else settings.stacks_dir.parent / "hosts"


def _engine() -> tuple[Any | None, str | None]:
    try:
        return engine_api(), None
    except ToolMissing as exc:
        return None, exc.message


@cli.command()
@click.argument("stack")
@click.option(
    "--versions-from",
    "versions_from",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Another lock whose versions to keep wherever this stack allows (a local variant "
    "of a flagship: its lock); what had to move is listed and recorded.",
)
@pass_settings
@user_errors
def lock(settings: Settings, stack: str, versions_from: Path | None) -> None:
    """Write stacks/STACK.lock: base digests and every Python package, hash-pinned (uv)."""
    resolved = settings.checked(stack)
    prefer = read_lock(versions_from) if versions_from is not None else None
    api, why = _engine()
    made = make_lock(resolved, api, prefer)
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


@cli.command()
@click.argument("host")
@click.argument("stack")
@click.option("--registry", help="The registry the host pulls from (when pushed to several).")
@click.option("--gpus", default="all", show_default=True, help="all, none, or indices: 0,1.")
@click.option("--port", "ports", multiple=True, help="[IP:]HOST_PORT:CONTAINER_PORT (repeat).")
@click.option(
    "--volume",
    "volumes",
    multiple=True,
    help="SOURCE:TARGET[:ro] (repeat); default: /var/lib/sm120-stacks/models:/models.",
)
@click.option("--env", "env", multiple=True, help="NAME=VALUE added to the manifest's env.")
@click.option(
    "--restart",
    type=click.Choice(["always", "unless-stopped", "on-failure"]),
    default="unless-stopped",
    show_default=True,
)
@hosts_dir_option
@pass_settings
@user_errors
def pin(
    settings: Settings,
    host: str,
    stack: str,
    registry: str | None,
    gpus: str,
    ports: tuple[str, ...],
    volumes: tuple[str, ...],
    env: tuple[str, ...],
    restart: str,
    hosts_dir: Path | None,
) -> None:
    """Pin HOST to the tested, pushed image of STACK's current content: hosts/HOST.yaml."""
    resolved = settings.checked(stack)
    content_hash = render(resolved).content_hash()
    record = load_record(settings.build_dir, stack, content_hash)
    repository = Registry.parse(registry).repository if registry else None
    options = PinOptions(gpus=gpus, ports=ports, volumes=volumes, env=env, restart=restart)
    made = make_pin(host, resolved, content_hash, record, repository, options)
    path = write_pin(_hosts_dir(settings, hosts_dir), made)
    click.echo(f"pinned {host} to {made.image}\n  {path}")
    if (record.smoke or "").startswith("skipped"):
        click.echo(
            f"warning: the image passed its static checks but its smoke prompt was "
            f"{record.smoke}; run `sm120-stacks test {stack} --require-gpu` on a host with "
            "the stack's GPU before serving from it",
            err=True,
        )


@cli.command()
@click.argument("host")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where to write compose.yaml and the systemd unit (default: BUILD_DIR/hosts/HOST).",
)
@click.option("--apply", "apply_now", is_flag=True, help="Also run the pin on this engine.")
@hosts_dir_option
@pass_settings
@user_errors
def deploy(
    settings: Settings, host: str, out: Path | None, apply_now: bool, hosts_dir: Path | None
) -> None:
    """Render HOST's compose file and systemd unit from its pin; --apply runs it here."""
    pinned = load_pin(_hosts_dir(settings, hosts_dir), host)
    for path in write_files(pinned, out or settings.build_dir / "hosts" / host):
        click.echo(path)
    if apply_now:
        click.echo(apply(pinned, engine_api()))


@cli.command()
@click.argument("host")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@hosts_dir_option
@pass_settings
@user_errors
def verify(settings: Settings, host: str, as_json: bool, hosts_dir: Path | None) -> None:
    """Compare what runs on this host with HOST's pin; every drift is reported, nothing changed.

    Exit status: 0 as pinned, 1 drift, 2 bad input.
    """
    pinned = load_pin(_hosts_dir(settings, hosts_dir), host)
    api, why = _engine()
    report = verify_host(pinned, api, why, gather(api, why))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(f"{host}: {pinned.stack} {pinned.image}")
        for drift in report.drifts:
            click.echo(f"DRIFT {drift.name}: {drift.detail}")
        if report.clean:
            click.echo(f"as pinned: {', '.join(report.clean)}")
        click.echo(f"{len(report.drifts)} drift(s)" if report.drifts else "no drift")
    if report.drifts:
        sys.exit(EXIT_DRIFT)


@cli.command()
@click.option("--host", help="Check against this host's pin (its GPUs, driver minimum).")
@click.option("--stack", help="Check against this stack's GPU targets and CUDA driver minimum.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@hosts_dir_option
@pass_settings
@user_errors
def doctor(
    settings: Settings,
    host: str | None,
    stack: str | None,
    as_json: bool,
    hosts_dir: Path | None,
) -> None:
    """Host prerequisites for serving: engine, NVIDIA driver, GPUs, container runtime.

    Exit status: 0 all present, 1 something is missing (each with its fix), 2 bad input.
    """
    if host and stack:
        raise StackError("give --host or --stack, not both", key="--host")
    needs, selected = None, None
    if host:
        pinned = load_pin(_hosts_dir(settings, hosts_dir), host)
        needs, selected = pinned.needs.requirements(), pinned.gpu_indices
    elif stack:
        resolved = settings.resolve(stack)
        needs = requirements_for(list(resolved.manifest.gpus), resolved.arch.min_driver)
    api, why = _engine()
    findings = check(gather(api, why), needs, selected)
    _print_findings(findings, as_json)
    if not all(f.ok for f in findings):
        sys.exit(EXIT_DRIFT)


def _print_findings(findings: list[Finding], as_json: bool) -> None:
    if as_json:
        rows = [{"name": f.name, "ok": f.ok, "detail": f.detail, "fix": f.fix} for f in findings]
        click.echo(json.dumps(rows, indent=2))
        return
    for f in findings:
        click.echo(f"{'ok  ' if f.ok else 'FAIL'}  {f.name}: {f.detail}")
        if not f.ok and f.fix:
            click.echo(f"      fix: {f.fix}")
    failed = sum(not f.ok for f in findings)
    click.echo(f"{failed} prerequisite(s) missing" if failed else "all prerequisites present")
