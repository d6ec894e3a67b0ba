"""`propose`: a new stack from an existing one and upstream releases' own requirements.

The new manifest extends the old stack and overrides only the pins that move (builder.upstream
.moves works them out); a proposal that drops a pin is a full copy instead, since `extends`
merges maps and cannot remove a key. It is resolved, checked and locked in a scratch copy of the
stacks folder; stacks/NEW.yaml and its lock are written only once all of that succeeded.

Where a rule fires on the proposal (on its pins, or on what its lock would install) and carries a
`remedy` (knowledge/rules.yaml), the remedy's pin joins the moves, with the pins its release
requires, or the start switches it names are set in the proposal (builder.upstream.settings), and
the proposal is resolved, locked and checked again; it is written only once no rule fires. The
moves table and the warnings say which rule's remedy made which pin or setting.

The lock's bases are the parent's where their reference is unchanged (builder.upstream
.carried_bases): a proposal made with no registry reachable checks clean as written.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.engine.protocol import Engine
from builder.engine.scratch import owned_mkdtemp
from builder.errors import StackError
from builder.files import write_atomic
from builder.judge.judgement import rules_on_manifest, rules_on_pins
from builder.lock.lockfile import Lock
from builder.lock.uv_compile import make_lock
from builder.lock.writing import write_lock
from builder.manifest.chain import STACK_NAME
from builder.manifest.check import CheckResult, violation_error
from builder.manifest.resolve import ResolvedStack, resolve
from builder.manifest.rules import Rule, SettingsRemedy, SwitchesRemedy
from builder.manifest.substitute import Substitutions
from builder.upstream.carried_bases import ProposedBase, carry_bases
from builder.upstream.index import IndexClient
from builder.upstream.moves import Move, plan_moves
from builder.upstream.proposal_manifest import manifest_text
from builder.upstream.releases import newest_matching
from builder.upstream.ruling import firing, mitigations, retired, stack_rules
from builder.upstream.settings import AppliedSettings, settings_for, settings_set


@dataclass(frozen=True)
class AppliedRemedy:
    """A rule that fired on the proposal, and the pin its remedy added."""

    rule: str
    package: str
    version: str
    #: The remedy's specifier the version is the newest release of.
    newest: str
    why: str

    def what(self) -> str:
        return f"{self.package} {self.version}"

    def describe(self) -> str:
        return (
            f"rule {self.rule} fired on the proposal; its remedy pins {self.package} "
            f"{self.version} (the newest release {self.newest}): {self.why}"
        )


@dataclass
class Proposal:
    name: str
    base: str
    moves: list[Move]
    manifest_text: str
    #: Rules that fire on the new stack and did not on the old one (only non-blocking ones
    #: can: a proposal that fails `check` is not written).
    applies: list[str] = field(default_factory=list)
    #: The old stack's rules the moves retire (it fired and no longer does, or the new pins are
    #: at or past its fixed_in, so a mitigation the stack carries can go).
    retires: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    lock: Lock | None = None
    written: list[Path] = field(default_factory=list)
    #: Remedies of rules that fired on the proposal, applied (their pins are among the moves).
    remedies: list[AppliedRemedy] = field(default_factory=list)
    #: Remedies of rules that fired on the proposal and set start switches (in its manifest).
    settings: list[AppliedSettings] = field(default_factory=list)
    #: The lock's bases and where their digests came from (none with --no-lock).
    bases: list[ProposedBase] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "from": self.base,
            "moves": [m.to_json() for m in self.moves],
            "rules_apply": self.applies,
            "rules_retire": self.retires,
            "remedies_applied": [dataclasses.asdict(r) for r in self.remedies],
            "settings_applied": [s.to_json() for s in self.settings],
            "warnings": self.warnings,
            "bases": [dataclasses.asdict(b) for b in self.bases],
            "locked_packages": len(self.lock.python.versions()) if self.lock else None,
            "written": [str(p) for p in self.written],
        }


def parse_sets(values: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`NAME=VERSION` pairs; an exact version each, a package once."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, version = value.partition("=")
        name, version = name.strip(), version.strip().removeprefix("=")
        if not sep or not name or not version:
            raise StackError(f"--set {value!r} is not NAME=VERSION", key="--set")
        if not STACK_NAME.match(name.lower()):
            raise StackError(f"--set {value!r}: {name!r} is not a package name", key="--set")
        try:
            Version(version)
        except InvalidVersion:
            raise StackError(
                f"--set {value!r}: {version!r} is not an exact version", key="--set"
            ) from None
        if canonicalize_name(name) in {canonicalize_name(n) for n in out}:
            raise StackError(f"--set names {name} twice", key="--set")
        out[name] = version
    return out


def propose(
    name: str,
    base: ResolvedStack,
    sets: dict[str, str],
    client: IndexClient,
    stacks_dir: Path,
    *,
    drops: list[str] | None = None,
    lock: bool = True,
    engine: Engine | None = None,
    substitutions: Substitutions | None = None,
    command: str = "",
) -> Proposal:
    """Work out, check and (unless lock=False) lock the new stack, then write it."""
    target_path = _new_stack_path(name, base, stacks_dir, sets, drops)
    moves, warnings = plan_moves(base, sets, drops or [], client)
    if not moves:
        pins = ", ".join(f"{n} {v}" for n, v in sets.items())
        raise StackError(f"nothing moves: {base.name} already pins {pins}", key="--set")
    settled = _settle(
        _Asked(name, base, sets, drops or [], client, stacks_dir, target_path),
        _Settled(moves, warnings),
        lock=lock,
        engine=engine,
        substitutions=substitutions,
        command=command,
    )
    remedies, switched, stack, made = (
        settled.remedies,
        settled.switched,
        settled.stack,
        settled.made,
    )
    assert stack is not None  # _settle returns once the proposal resolved
    applied: list[AppliedSettings | AppliedRemedy] = [*switched, *remedies]
    warnings = [remedy.describe() for remedy in applied] + settled.warnings
    bases: list[ProposedBase] = []
    if made is not None:
        made, bases = carry_bases(name, stack, made, base)
        warnings += [b.said for b in bases if b.said]
    applies, retires, retiring_said = _rule_changes(base, stack, made, settled.moves)
    proposal = Proposal(
        name=name,
        base=base.name,
        moves=settled.moves,
        manifest_text=settled.text,
        applies=applies,
        retires=retires,
        warnings=warnings + retiring_said,
        lock=made,
        remedies=remedies,
        settings=switched,
        bases=bases,
    )
    _write(proposal, target_path)
    return proposal


def _new_stack_path(
    name: str,
    base: ResolvedStack,
    stacks_dir: Path,
    sets: dict[str, str],
    drops: list[str] | None,
) -> Path:
    """Where the proposal goes: refused for a bad or taken name, or with nothing asked."""
    target_path = stacks_dir / f"{name}.yaml"
    if not STACK_NAME.match(name):
        raise StackError(f"{name!r} is not a stack name (lowercase letters, digits, . _ -)")
    if name == base.name:
        raise StackError(f"the proposed stack must have a new name, not {name!r}")
    # a lock alone names no stack (a propose killed between the two writes leaves one): it is
    # replaced; a manifest is somebody's proposal
    if target_path.exists():
        raise StackError(
            f"stacks/{name}.yaml already exists",
            file=target_path,
            hint="choose another name, or delete the old proposal first",
        )
    if not sets and not drops:
        raise StackError("nothing to propose: give --set NAME=VERSION (or --drop NAME)")
    return target_path


@dataclass(frozen=True)
class _Asked:
    """What the proposal was asked for, and where it is written."""

    name: str
    base: ResolvedStack
    sets: dict[str, str]
    drops: list[str]
    client: IndexClient
    stacks_dir: Path
    target_path: Path


@dataclass
class _Settled:
    """The proposal as it stands: its moves, warnings and the remedies and settings added;
    once settled, its manifest text, the stack resolved from it and its lock."""

    moves: list[Move]
    warnings: list[str]
    remedies: list[AppliedRemedy] = field(default_factory=list)
    switched: list[AppliedSettings] = field(default_factory=list)
    text: str = ""
    stack: ResolvedStack | None = None
    made: Lock | None = None


def _settle(
    asked: _Asked,
    now: _Settled,
    *,
    lock: bool,
    engine: Engine | None,
    substitutions: Substitutions | None,
    command: str,
) -> _Settled:
    """Resolve, check and lock the proposal in a scratch copy of the stacks folder, adding the
    remedies of the rules that fire, until none fires (or one fires with no remedy: an error)."""
    name, base, client = asked.name, asked.base, asked.client
    # named by this run, so a propose after a killed one removes the scratch copy it left
    scratch = owned_mkdtemp(f".propose-{name}.", asked.stacks_dir.parent)
    try:
        for manifest in asked.stacks_dir.glob("*.yaml"):
            shutil.copy2(manifest, scratch / manifest.name)
        while True:
            now.text = manifest_text(name, base, now.moves, command, now.switched)
            (scratch / f"{name}.yaml").write_text(now.text)
            try:
                now.stack = resolve(name, scratch, substitutions)
                result = rules_on_manifest(now.stack)  # judge's order, the lock made between
                now.made = None
                if result.ok and lock:
                    now.made = make_lock(now.stack, engine)
                    result = rules_on_pins(now.stack, now.made.python.versions())
                if result.ok:
                    return now
                more, more_settings = _remedies(
                    result, base, now.moves, [*now.remedies, *now.switched], client
                )
                if not more and not more_settings:
                    raise violation_error(result)
            except StackError as exc:
                raise _outside(exc, scratch, asked.target_path, now.moves) from None
            now.switched += more_settings
            if more:
                now.remedies += more
                now.moves, now.warnings = _with_remedies(
                    base, asked.sets, asked.drops, client, now.remedies
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _rule_changes(
    base: ResolvedStack, stack: ResolvedStack, made: Lock | None, moves: list[Move]
) -> tuple[list[str], list[str], list[str]]:
    """The rules the proposal brings (fire on it, not on its parent), those it retires, and a
    warning for each retiring rule whose workaround settings can go."""
    old_rules = stack_rules(base)
    before = {rule.id for rule in old_rules.firing}
    after = set(firing(stack, made.python.versions() if made else {}))
    retiring = before - after
    for move in moves:
        if move.new is not None:
            retiring.update(retired(old_rules, move.package, move.new))
    said = [
        f"{rule.id} retires: {', '.join(settings)}, set to work around it, can go "
        "(review, then edit the proposal)"
        for rule in old_rules.quiet
        if rule.id in retiring and (settings := mitigations(rule))
    ]
    return sorted(after - before), sorted(retiring - after), said


# --- remedies ----------------------------------------------------------------------------------


def _remedies(
    result: CheckResult,
    base: ResolvedStack,
    moves: list[Move],
    applied: list[AppliedRemedy | AppliedSettings],
    client: IndexClient,
) -> tuple[list[AppliedRemedy], list[AppliedSettings]]:
    """The remedies to apply for the rules that fire: pins, and start switches to set; none
    when one of the rules has no remedy (the proposal fails on it). A rule whose remedy was
    applied and that still fires, or whose remedy's package the proposal was asked to pin
    (--set, --drop), is an error of its own."""
    fired = [violation.rule for violation in result.violations]
    if any(rule.remedy is None for rule in fired):
        return [], []
    done = {remedy.rule: remedy for remedy in applied}
    asked = {canonicalize_name(m.package): m for m in moves if m.explicit}
    out: list[AppliedRemedy] = []
    switched: list[AppliedSettings] = []
    for rule in fired:
        remedy = rule.remedy
        assert remedy is not None
        if rule.id in done:
            raise StackError(
                f"rule {rule.id} still fires after its remedy ({done[rule.id].what()}): "
                f"{rule.error}",
                key=rule.key,
                hint=f"instead: {rule.alternative}",
            )
        if isinstance(remedy, SwitchesRemedy):
            switched.append(settings_for(rule, remedy, result.stack))
            continue
        if isinstance(remedy, SettingsRemedy):
            switched.append(settings_set(rule, remedy))
            continue
        move = asked.get(canonicalize_name(remedy.pin))
        if move is not None:
            raise StackError(
                f"rule {rule.id} fires, and its remedy would {remedy.describe()}, which "
                f"{move.why} {move.package} {move.new or '(dropped)'} overrules: {rule.error}",
                key=move.why,
                hint=f"leave {move.package} to the remedy, or set it to a release {remedy.newest}",
            )
        out.append(
            AppliedRemedy(
                rule=rule.id,
                package=remedy.pin,
                version=_newest(base, remedy.pin, remedy.newest, rule, client),
                newest=remedy.newest,
                why=" ".join(remedy.why.split()),
            )
        )
    return out, switched


def _newest(base: ResolvedStack, package: str, newest: str, rule: Rule, client: IndexClient) -> str:
    """The newest release of package on the stack's indexes that the specifier allows."""
    py = base.manifest.python
    indexes = [py.index_url, *py.extra_index_urls]
    versions = {v for p in client.projects(indexes, package) for v in p.available()}
    found = newest_matching(SpecifierSet(newest), versions)
    if found is None:
        raise StackError(
            f"rule {rule.id} fires, and its remedy finds no release of {package} {newest} on "
            f"{', '.join(indexes)}: {rule.error}",
            key=rule.key,
            hint=f"instead: {rule.alternative}",
        )
    return str(found)


def _with_remedies(
    base: ResolvedStack,
    sets: dict[str, str],
    drops: list[str],
    client: IndexClient,
    remedies: list[AppliedRemedy],
) -> tuple[list[Move], list[str]]:
    """The moves again, with the remedies' pins asked for too (so what their releases require
    of the stack's pins follows), each remedy's move labelled with its rule."""
    by_package = {canonicalize_name(r.package): r for r in remedies}
    wanted = {**sets, **{r.package: r.version for r in remedies}}
    moves, warnings = plan_moves(base, wanted, drops, client)
    labelled = []
    for move in moves:
        remedy = by_package.get(canonicalize_name(move.package))
        if remedy is not None and move.explicit:
            why = f"remedy of rule {remedy.rule}: the newest {remedy.package} {remedy.newest}"
            move = dataclasses.replace(move, why=why, explicit=False)
        labelled.append(move)
    return labelled, warnings


def _write(proposal: Proposal, target_path: Path) -> None:
    """The lock, then the manifest: the manifest is what makes the stack, so a run killed
    between the two leaves only a lock, which names no stack and the next propose replaces;
    a failure removes whatever of the two was written."""
    written: list[Path] = []
    lock_path = target_path.with_name(f"{proposal.name}.lock")
    try:
        if proposal.lock is not None:
            write_lock(lock_path, proposal.lock)
            written.append(lock_path)
        else:
            lock_path.unlink(missing_ok=True)  # a killed propose's: not this manifest's lock
        write_atomic(target_path, proposal.manifest_text)
        written.insert(0, target_path)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    proposal.written = written


def _outside(exc: StackError, scratch: Path, target: Path, moves: list[Move]) -> StackError:
    """An error raised in the scratch folder, told about the stack that was not written."""
    file = exc.file
    if file is not None and Path(file).resolve().parent == scratch.resolve():
        file = target.with_name(Path(file).name)
    return dataclasses.replace(
        exc,
        message=f"the proposed stack ({_summary(moves)}) fails: {exc.message}",
        file=file,
        hint=(exc.hint + "; " if exc.hint else "") + "nothing was written",
    )


def _summary(moves: list[Move]) -> str:
    return ", ".join(f"{m.package} {m.old or '(new)'} -> {m.new or '(dropped)'}" for m in moves)
