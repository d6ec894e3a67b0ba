"""`deploy --all` and `verify --all`: every pinned host, each on the engine its pin names.

The commands themselves are `deploy` and `verify` (builder.cli.hosts); this module holds what
they do for the whole fleet, so the per-host paths stay as they were.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.table import Table

from builder.cli.app import Settings, out
from builder.errors import StackError
from builder.hosts import remote
from builder.hosts.drift import Report
from builder.hosts.drift import verify as verify_host
from builder.hosts.fleet import (
    OK,
    Fleet,
    Gate,
    HostResult,
    both,
    drift_rows,
    health_gate,
    roll,
    smoke_gate,
    warm_gate,
)
from builder.hosts.pins import Pin, load_pin, load_previous_pin, pinned_hosts
from builder.hosts.warmth import WarmPolicy, proof_of, restorer, warm_summary
from builder.image.hostprobe import gather
from builder.spec.resolve import ResolvedStack

EXIT_FAILED = 1


def all_pins(hosts_dir: Path) -> list[Pin]:
    hosts = pinned_hosts(hosts_dir)
    if not hosts:
        raise StackError(
            f"no host pins in {hosts_dir}",
            hint="pin a host first: sm120-stacks pin HOST STACK",
        )
    return [load_pin(hosts_dir, host) for host in hosts]


def one_report(pin: Pin, default: str | None) -> Report:
    """verify for one pin, on its own engine (default: the command's, for a pin naming none),
    its prerequisites read on that host."""
    engine, why = remote.try_connect(pin, default)
    report = verify_host(pin, engine, why, gather(engine, why, remote.probe(pin, default)))
    if engine is not None and "state" not in {d.name for d in report.drifts}:
        report.warm = warm_summary(pin, engine)
    return report


def verify_all(hosts_dir: Path, as_json: bool, default: str | None) -> None:
    """Drift of every pinned host in one table; exit 1 when any host drifts."""
    reports = [
        (pin, remote.describe(pin, default), one_report(pin, default))
        for pin in all_pins(hosts_dir)
    ]
    if as_json:
        click.echo(json.dumps([report.to_json() for _, _, report in reports], indent=2))
    else:
        table = Table("host", "engine", "stack", "image", "status", "drifts", "warm")
        for row in drift_rows(reports):
            table.add_row(*row.values())
        out.print(table)
        for pin, _, report in reports:
            for drift in report.drifts:
                click.echo(f"{pin.host}: DRIFT {drift.name}: {drift.detail}")
        drifted = sum(bool(report.drifts) for _, _, report in reports)
        click.echo(
            f"{drifted} of {len(reports)} host(s) drift" if drifted else "no drift on any host"
        )
    if any(report.drifts for _, _, report in reports):
        sys.exit(EXIT_FAILED)


def deploy_all(
    settings: Settings,
    hosts_dir: Path,
    out_dir: Path,
    apply_now: bool,
    smoke: bool,
    timeout_s: float | None,
    as_json: bool,
    warm: WarmPolicy,
) -> None:
    """Render every host's files; with apply_now, roll them one host at a time (builder.hosts.
    fleet), stopping at the first failure; exit 1 then. Each host's warm cache is restored
    before its start and its start proved after its gates (builder.hosts.warmth)."""
    from builder.hosts.deploy import write_files

    pins = all_pins(hosts_dir)
    for pin in pins:
        for path in write_files(pin, out_dir / pin.host):
            click.echo(path, err=as_json)
    if not apply_now:
        return
    say = (lambda text: click.echo(text, err=True)) if as_json else click.echo
    default = settings.engine_address()

    def url(pin: Pin) -> str:
        return remote.server_url(pin, default)

    waiting = None if as_json else (lambda text: click.echo(text, err=True))
    gate: Gate = health_gate(url, timeout_s, waiting)
    if smoke:
        report_dir = settings.build_dir / "fleet" / "smoke"
        gate = both(gate, smoke_gate(url, _stack_of(settings), report_dir, say))
    gate = both(gate, warm_gate(proof_of, warm.require))
    fleet = Fleet(
        connect=lambda pin: remote.connect(pin, default),
        gate=gate,
        previous=lambda host: load_previous_pin(hosts_dir, host),
        describe=lambda pin: remote.describe(pin, default),
        log=say,
        before_start=restorer(warm),
    )
    results = roll(pins, fleet)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in results], indent=2))
    else:
        _print_results(results)
    if any(r.status != OK for r in results):
        sys.exit(EXIT_FAILED)


def _stack_of(settings: Settings) -> Callable[[str], ResolvedStack | None]:
    def find(name: str) -> ResolvedStack | None:
        if not (settings.stacks_dir / f"{name}.yaml").is_file():
            return None
        return settings.resolve(name)

    return find


def _print_results(results: list[HostResult]) -> None:
    table = Table("host", "engine", "image", "status", "detail")
    for r in results:
        detail = r.detail if r.rollback is None else f"{r.detail}\nrollback: {r.rollback}"
        table.add_row(r.host, r.engine, r.image.rsplit("@", 1)[-1][:19], r.status, detail)
    out.print(table)
    failed = [r for r in results if r.status not in (OK, "not reached")]
    if failed:
        r = failed[0]
        click.echo(
            f"the roll stopped at {r.host} ({r.status}); its pin still names {r.image}: fix it "
            f"(pin {r.host} again) and deploy again; `verify --all` shows what runs where"
        )
    else:
        click.echo(f"rolled {len(results)} host(s), every gate passed")
