"""What `deploy` and `drift` do for the hosts they are given, one or all (--all), each on the
engine its pin names: one path for both, so one host is deployed, gated, rolled back and
reported exactly as each host of the fleet.

The commands themselves are `deploy` and `drift` (builder.cli.hosts).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from builder.cli.app import Settings, out
from builder.engine import imageref
from builder.engine.hostprobe import gather
from builder.engine.protocol import Engine
from builder.errors import EXIT_BAD_INPUT, StackError, engine_check
from builder.evidence.trust import TrustPolicy
from builder.hosts import remote
from builder.hosts.drift import Report
from builder.hosts.drift import verify as verify_host
from builder.hosts.evidence_gate import vouch_for_deploy
from builder.hosts.fleet import (
    NOT_REACHED,
    OK,
    ROLLBACK_FAILED,
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
from builder.hosts.rendered import file_drifts, rendered_files
from builder.hosts.trustdrift import evidence_drifts, trust_drifts
from builder.hosts.warm_target import (
    WarmPolicy,
    live_checker,
    proof_of,
    restorer,
    target_of,
    warm_summary,
)
from builder.manifest.resolve import ResolvedStack

EXIT_FAILED = 1


def all_pins(hosts_dir: Path) -> list[Pin]:
    hosts = pinned_hosts(hosts_dir)
    if not hosts:
        raise StackError(
            f"no host pins in {hosts_dir}",
            hint="pin a host first: sm120-stacks pin HOST STACK",
        )
    return [load_pin(hosts_dir, host) for host in hosts]


def one_report(
    pin: Pin,
    default: str | None,
    trust: TrustPolicy | None = None,
    files_of: Callable[[Pin], Path] | None = None,
) -> Report:
    """drift for one pin, on its own engine (default: the command's, for a pin naming none),
    its prerequisites read on that host; its evidence's keys against the trust policy; its
    rendered files (compose.yaml, the unit) against the pin."""
    engine, why = remote.try_connect(pin, default)
    report = verify_host(pin, engine, why, gather(engine, why, remote.probe(pin, default)))
    if files_of is not None:
        files = rendered_files(pin, files_of(pin), default)
        edited = file_drifts(pin, files)
        report.drifts += edited
        if files and not edited:
            report.clean.append("files")
    keys = trust_drifts(pin, trust)
    revoked = any(drift.name == "revoked" for drift in keys)  # said once, not twice
    refused = keys if revoked else evidence_drifts(pin, trust)
    report.drifts += keys + ([] if revoked else refused)
    if engine is not None and "state" not in {d.name for d in report.drifts}:
        report.warm = _unread_warm(pin, engine) or warm_summary(pin, engine)
    return report


def _unread_warm(pin: Pin, engine: Engine) -> str | None:
    """Why the cache volume is not read: no container mounts it (drift creates nothing, and
    the engine makes a named volume a container asks for). Its evidence does not matter
    here: the volume is read by the tool's own helper image (warm/helper.py), so no code of
    the pinned image runs, verified or not (issue 43)."""
    target = target_of(pin)
    if target is not None and not engine.containers(volume=target.volume):
        return f"unknown (no container mounts {target.volume}: nothing read, nothing created)"
    return None


def drift_pins(
    pins: list[Pin],
    as_json: bool,
    default: str | None,
    every: bool,
    trust: TrustPolicy | None = None,
    files_of: Callable[[Pin], Path] | None = None,
) -> None:
    """Drift of the given hosts (one, or every pinned host with --all) in one table, printed
    alike for one host or many; exit 1 when any host drifts. JSON: the report of HOST, or the
    list of every host's with --all. files_of: the folder deploy wrote a host's files to,
    read for an image or volume edited into them (hosts/rendered.py)."""
    reports = [
        (pin, remote.describe(pin, default), one_report(pin, default, trust, files_of))
        for pin in pins
    ]
    if as_json:
        documents = [report.to_json() for _, _, report in reports]
        click.echo(json.dumps(documents if every else documents[0], indent=2))
    else:
        print_drift(reports, every)
    if any(report.drifts for _, _, report in reports):
        sys.exit(EXIT_FAILED)


def print_drift(reports: list[tuple[Pin, str, Report]], every: bool) -> None:
    """The one renderer of `drift`: a row per host (its warm column: how its server started),
    then each host's drifts, the checks it passed and its start, then the count (of drifts for
    one host, of hosts that drift for --all)."""
    table = Table("host", "engine", "stack", "image", "status", "drifts", "warm")
    for row in drift_rows(reports):
        table.add_row(*(escape(value) for value in row.values()))
    out.print(table)
    for pin, _, report in reports:
        for drift in report.drifts:
            click.echo(f"{pin.host}: DRIFT {drift.name}: {drift.detail}")
        if report.clean:
            click.echo(f"{pin.host}: as pinned: {', '.join(report.clean)}")
        if report.warm:
            click.echo(f"{pin.host}: start: {report.warm}")
    drifted = sum(bool(report.drifts) for _, _, report in reports)
    if not every:
        count = len(reports[0][2].drifts)
        click.echo(f"{count} drift(s)" if count else "no drift")
    else:
        click.echo(
            f"{drifted} of {len(reports)} host(s) drift" if drifted else "no drift on any host"
        )


def deploy_pins(
    settings: Settings,
    hosts_dir: Path,
    pins: list[Pin],
    out_of: Callable[[Pin], Path],
    apply_now: bool,
    smoke: bool,
    timeout_s: float | None,
    as_json: bool,
    warm: WarmPolicy,
) -> None:
    """Render each host's files (into out_of(pin)); with apply_now, roll them one host at a
    time (builder.hosts.fleet), stopping at the first failure. Each host's warm cache is
    restored before its start and its start proved after its gates (builder.hosts.warm_target).
    Exit status 1 when the roll stopped at a gate, 2 when at an error of the input (the
    restore refused, a pull that failed), as the error's own command would."""
    from builder.hosts.deploy import write_files

    for pin in pins:
        for path in write_files(pin, out_of(pin)):
            click.echo(path, err=as_json)
    if not apply_now:
        return
    say = (lambda text: click.echo(text, err=True)) if as_json else click.echo
    lines, trust = vouch_for_deploy(pins, hosts_dir)  # before any host is touched
    for line in lines:
        say(line)
    warm = dataclasses.replace(warm, trust=trust)  # a policy learned on first use counts too
    default = settings.engine_address()

    fleet = Fleet(
        connect=lambda pin: remote.connect(pin, default),
        gate=_gates(settings, default, smoke, timeout_s, as_json, say, warm),
        previous=lambda host: load_previous_pin(hosts_dir, host),
        describe=lambda pin: remote.describe(pin, default),
        log=say,
        before_start=restorer(warm),
        must_restart=live_checker(warm),
        remove_superseded=True,
    )
    results = roll(pins, fleet)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in results], indent=2))
    else:
        _print_results(results)
    stopped = next((r for r in results if r.status not in (OK, NOT_REACHED)), None)
    if stopped is None:
        return
    if stopped.error is not None:  # stderr, whole, as user_errors prints a command's error
        kind = "error" if stopped.bad_input else "failed"
        click.echo(f"{kind}: {host_named(stopped.host, stopped.error)}", err=True)
    sys.exit(EXIT_BAD_INPUT if stopped.bad_input else EXIT_FAILED)


def _gates(
    settings: Settings,
    default: str | None,
    smoke: bool,
    timeout_s: float | None,
    as_json: bool,
    say: Callable[[str], None],
    warm: WarmPolicy,
) -> Gate:
    """What each host passes after its start, in order: its health path (waiting lines on
    stderr unless --json), the stack's smoke through its URL (unless --no-smoke), then the
    proof that its start was warm where its policy requires it. default: the engine address
    of this machine, for pins that name none."""

    def url(pin: Pin) -> str:
        return remote.server_url(pin, default)

    waiting = None if as_json else (lambda text: click.echo(text, err=True))
    gate: Gate = health_gate(url, timeout_s, waiting)
    if smoke:
        report_dir = settings.build_dir / "fleet" / "smoke"
        gate = both(gate, smoke_gate(url, _stack_of(settings), report_dir, say))
    return both(gate, warm_gate(proof_of, warm.require))


def host_named(host: str, error: str) -> str:
    """error led by its host, once: an error raised for the host names it already ("HOST: warm
    required, ..."), and "error: HOST: HOST: ..." read as two hosts."""
    return error if error.startswith(f"{host}: ") else f"{host}: {error}"


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
        cells = (r.host, r.engine, imageref.digest_of(r.image)[:19], r.status, detail)
        table.add_row(*(escape(cell) for cell in cells))  # an error's [:ro] is no markup
    out.print(table)
    failed = [r for r in results if r.status not in (OK, NOT_REACHED)]
    if failed:
        r = failed[0]
        down = (
            " nothing may serve there now (its previous pin did not start either);"
            if r.status == ROLLBACK_FAILED
            else ""
        )
        # one line to act on: the error's own (on stderr, after this) where the host stopped at
        # an error, this one where it stopped at its gate
        said = "" if r.error is not None else "failed: "
        click.echo(
            f"{said}the roll stopped at {r.host} ({r.status}); its pin still names "
            f"{r.image};{down} once its engine answers ({engine_check(r.engine)}), fix "
            f"what the detail says (pin {r.host} again for a failed gate) and deploy again; "
            "`drift --all` shows what runs where"
        )
    else:
        click.echo(f"deployed {len(results)} host(s), every gate passed")
