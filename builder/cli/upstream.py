"""Commands for upstream releases: outdated, propose, diff.

`outdated` and `diff` change no file. `propose` writes stacks/NEW.yaml (and its lock) only once
the new stack resolved, passed its rules and locked. An index that is down or answers garbage
is bad input naming the index (exit 2); with several stacks, `outdated` reports it per row and
exits 1 after the table.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

import click
import yaml
from rich.markup import escape
from rich.table import Table

from builder.cli.app import Settings, ca_bundle_option, cli, out, pass_settings, user_errors
from builder.engine.protocol import Engine
from builder.errors import OperationFailed, StackError, ToolMissing
from builder.image.cabundle import resolve_ca_bundle
from builder.manifest.resolve import stack_names
from builder.upstream.audit import Audit, audit
from builder.upstream.diff import Change, StackDiff, diff_stacks
from builder.upstream.index import IndexClient
from builder.upstream.outdated import Outdated, Row, outdated
from builder.upstream.propose import Proposal, parse_sets, propose


def _client(ca_bundle: str | None) -> IndexClient:
    """An index client trusting the CA bundle builds get (`none`: requests' own settings)."""
    return IndexClient(resolve_ca_bundle(ca_bundle))


# --- outdated ----------------------------------------------------------------------------------


@cli.command("outdated")
@click.argument("stacks", nargs=-1)
@click.option(
    "--locked",
    "include_lock",
    is_flag=True,
    help="Also every package of the stack's lock (one index request each).",
)
@ca_bundle_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@pass_settings
@user_errors
def outdated_cmd(
    settings: Settings,
    stacks: tuple[str, ...],
    include_lock: bool,
    ca_bundle: str | None,
    as_json: bool,
) -> None:
    """Newer releases of each stack's pins on its own indexes (all stacks when none are
    named), as patch, minor or major moves, with the stack's rules each would retire.
    Changes no file."""
    client = _client(ca_bundle)
    names = list(stacks) or stack_names(settings.stacks_dir)
    results: list[Outdated] = []
    for name in names:
        try:
            results.append(outdated(settings.resolve(name), client, include_lock))
        except StackError as exc:
            if len(names) == 1:
                raise
            results.append(Outdated(stack=name, rows=[Row(name, "-", "pin", "-", error=str(exc))]))
    errors = [error for result in results for error in result.errors]
    if len(names) == 1 and errors:
        raise StackError(errors[0].removeprefix("error: "))
    if as_json:
        rows = [row.to_json() for result in results for row in result.rows]
        click.echo(json.dumps({"rows": rows}, indent=2))
    else:
        _print_outdated(results, several=len(names) > 1)
    if errors:
        raise OperationFailed(f"{len(errors)} error(s); the rows marked ERROR say which")


def _print_outdated(results: list[Outdated], several: bool) -> None:
    table = Table(title="newer releases on each stack's indexes (nothing changed)")
    if several:
        table.add_column("stack")
    for column in ("package", "pinned", "patch", "minor", "major", "newer", "retires rules"):
        table.add_column(column)
    for result in results:
        for row in result.rows:
            if row.source == "lock" and not (row.newer or row.error):
                continue
            cells = [escape(row.package), escape(row.pinned)]
            if row.error:
                cells += [f"ERROR: {escape(row.error)}", "", "", "", ""]
            elif row.note:
                cells += [escape(row.note), "", "", "", ""]
            else:
                cells += [
                    row.newest("patch") or "-",
                    row.newest("minor") or "-",
                    row.newest("major") or "-",
                    str(len(row.newer)) if row.newer else "up to date",
                    ", ".join(f"{rule} (>= {v})" for rule, v in row.retires().items()),
                ]
            if row.source != "pin":
                cells[0] += f" ({row.source})"
            table.add_row(*([escape(result.stack)] if several else []), *cells)
    out.print(table)


# --- propose -----------------------------------------------------------------------------------


@cli.command("propose")
@click.argument("name")
@click.option("--from", "base", required=True, metavar="STACK", help="The stack to start from.")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="NAME=VERSION",
    help="A release to move to (repeat); what it requires of the stack's pins follows.",
)
@click.option(
    "--drop",
    "drops",
    multiple=True,
    metavar="NAME",
    help="A pin to leave out (repeat); the proposal is then a full copy of STACK.",
)
@click.option("--no-lock", is_flag=True, help="Write the manifest only (no resolution, offline).")
@click.option(
    "--audit",
    "run_audit",
    is_flag=True,
    help="First audit each --set release against STACK (`audit`) and print its findings.",
)
@ca_bundle_option
@click.option("--json", "as_json", is_flag=True, help="Print the proposal as JSON.")
@pass_settings
@user_errors
def propose_cmd(
    settings: Settings,
    name: str,
    base: str,
    sets: tuple[str, ...],
    drops: tuple[str, ...],
    no_lock: bool,
    run_audit: bool,
    ca_bundle: str | None,
    as_json: bool,
) -> None:
    """Write stacks/NAME.yaml: STACK with the given releases, the pins they require (read from
    each release's metadata) and the pins released with them, checked against the rules and
    locked. Nothing is written unless all of that succeeded."""
    client = _client(ca_bundle)
    wanted = parse_sets(sets)
    if run_audit:
        for package, version in wanted.items():
            _print_audit(audit(f"{package}=={version}", settings.resolve(base), client,
                               settings.build_dir))  # fmt: skip
    command = "sm120-stacks " + shlex.join(sys.argv[1:]) if sys.argv[1:] else ""
    proposal = propose(
        name,
        settings.resolve(base),
        wanted,
        client,
        settings.stacks_dir,
        drops=list(drops),
        lock=not no_lock,
        engine=None if no_lock else _engine(settings),
        substitutions=settings.substitutions,
        command=command if "propose" in command else "",
    )
    if as_json:
        click.echo(json.dumps(proposal.to_json(), indent=2))
    else:
        _print_proposal(proposal)


def _engine(settings: Settings) -> Engine | None:
    """The engine asks registries for base digests; the lock says so when there is none."""
    try:
        return settings.connect()
    except ToolMissing:
        return None


def _print_proposal(proposal: Proposal) -> None:
    table = Table("package", "from", "to", "move", "why", title=f"{proposal.name}: what moved")
    for move in proposal.moves:
        section = "" if move.section == "packages" else " (override)"
        table.add_row(
            escape(move.package) + section,
            move.old or "-",
            move.new or "(dropped)",
            move.kind,
            escape(move.why),
        )
    out.print(table)
    out.print(f"rules that now apply: {', '.join(proposal.applies) or 'none'}")
    out.print(f"rules that retire:    {', '.join(proposal.retires) or 'none'}")
    for warning in proposal.warnings:
        out.print(f"warning: {escape(warning)}")
    for path in proposal.written:
        out.print(f"wrote {path}")
    if proposal.lock is None:
        out.print(f"not locked (--no-lock): `sm120-stacks lock {proposal.name}` before building")
    else:
        out.print(f"locked: {len(proposal.lock.python.versions())} packages")
    out.print(
        f"next: sm120-stacks diff {proposal.base} {proposal.name}; "
        f"make stack STACK={proposal.name}"
    )


# --- audit -------------------------------------------------------------------------------------


@cli.command("audit")
@click.argument("release")
@click.option("--against", "stack", required=True, metavar="STACK", help="The stack to audit for.")
@click.option(
    "--no-device-code", is_flag=True, help="Leave out the device-code reading (no cuobjdump)."
)
@ca_bundle_option
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@pass_settings
@user_errors
def audit_cmd(
    settings: Settings,
    release: str,
    stack: str,
    no_device_code: bool,
    ca_bundle: str | None,
    as_json: bool,
) -> None:
    """What RELEASE (vllm==0.34.0) changes for STACK's GPUs, read from its wheel and the wheel of
    STACK's own release (downloaded once into build/wheels): device code per library and
    kernel family, pins the stack's indexes lack or that move, VLLM_* switches, knowledge
    citations that moved, and the MoE fallback list; each with FILE:LINE in a wheel, then the
    candidate knowledge entries as YAML. Needs no GPU; changes no file outside build/."""
    result = audit(
        release,
        settings.resolve(stack),
        _client(ca_bundle),
        settings.build_dir,
        device_code=not no_device_code,
    )
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    _print_audit(result)
    click.echo("# candidate knowledge entries")
    click.echo(yaml.safe_dump(result.candidate(), sort_keys=False, width=100))


def _print_audit(result: Audit) -> None:
    title = f"{result.release} against {result.stack} ({result.against})"
    if result.libraries:
        table = Table("library", "gpu", "machine code", "PTX", "on the GPU", "before",
                      title=f"{title}: device code, read by {result.reader}")  # fmt: skip
        for row in result.libraries:
            table.add_row(escape(row.library), row.gpu, " ".join(row.sass), " ".join(row.ptx),
                          escape(row.on_gpu), escape(row.before))  # fmt: skip
        out.print(table)
        table = Table("gpu", "family", "finding", "where", title=f"{title}: device code findings")
        for device in result.device:
            table.add_row(device.gpu, device.family, escape(device.text), escape(device.where))
        out.print(table)
    for kind in ("requirement", "switch", "module", "citation", "backend"):
        rows = [f for f in result.findings if f.kind == kind]
        table = Table(kind, "finding", "where", title=f"{title}: {kind}s ({len(rows)})")
        for found in rows:
            table.add_row(escape(found.subject), escape(found.text), escape(found.where))
        out.print(table)


# --- diff --------------------------------------------------------------------------------------


@cli.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON.")
@pass_settings
@user_errors
def diff_cmd(settings: Settings, a: str, b: str, as_json: bool) -> None:
    """Two stacks side by side: resolved manifests, derived flags and JIT modules, locks
    package by package, the rules each trips, and the rendered Dockerfiles."""
    result = diff_stacks(settings.resolve(a), settings.resolve(b))
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, default=str))
        return
    _print_diff(result)


def _print_diff(d: StackDiff) -> None:
    _print_changes(d, "manifest (resolved)", d.manifest)
    _print_changes(d, "derived", d.derived)
    for side, stack in (("only_a", d.a), ("only_b", d.b)):
        if d.jit_modules[side]:
            out.print(f"JIT modules only in {stack}: {', '.join(d.jit_modules[side])}")
    locks = d.locks
    if locks.a is None or locks.b is None:
        missing = [s for s, state in ((d.a, locks.a), (d.b, locks.b)) if state is None]
        out.print(f"locks: not compared ({', '.join(missing)} has no lock)")
    else:
        for stack, state in ((d.a, locks.a), (d.b, locks.b)):
            if state != "locked":
                out.print(f"lock of {stack}: {escape(state)}")
        table = Table("package", d.a, d.b, "change", title=f"locks ({locks.same} the same)")
        for p in locks.packages:
            change = f"{p.kind} (down)" if p.down else p.kind or p.change
            table.add_row(p.package, p.a or "-", p.b or "-", change)
        if locks.packages:
            out.print(table)
        else:
            out.print(f"locks: the same {locks.same} packages")
    out.print(f"rules on {d.a}: {', '.join(d.rules['a']) or 'none'}")
    out.print(f"rules on {d.b}: {', '.join(d.rules['b']) or 'none'}")
    for side, error in d.render_errors.items():
        out.print(f"Dockerfile of {d.a if side == 'a' else d.b} not rendered: {escape(error)}")
    if d.dockerfile:
        click.echo("\n".join(d.dockerfile))
    elif not d.render_errors:
        out.print("Dockerfiles: the same")


def _print_changes(d: StackDiff, title: str, changes: list[Change]) -> None:
    if not changes:
        out.print(f"{title}: the same")
        return
    table = Table("key", d.a, d.b, title=title)
    for change in changes:
        table.add_row(
            escape(change.key),
            "(absent)" if change.only == "b" else escape(_value(change.a)),
            "(absent)" if change.only == "a" else escape(_value(change.b)),
        )
    out.print(table)


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 70 else text[:67] + "..."
