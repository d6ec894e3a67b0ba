"""Deploying pinned hosts, one or all: a rolling, health-gated deploy, and drift across them.

`roll` deploys the hosts one at a time, in name order (`deploy HOST --apply` is a roll of one,
gated and rolled back exactly as each host of `deploy --all --apply`). After each, a gate must
pass before the next host is touched: the server answers its health path through its URL (a pin
with no URL reachable from here: its container's state alone), then (where the stack's manifest
is at hand) the smoke judges its answers there. The first host that fails
stops the roll, and is put back on its previous pin (hosts/previous/HOST.yaml, kept by `pin`),
which must pass the same gate; the hosts after it are not touched. A host whose container
already ran as pinned was not changed, so a failure there stops the roll without a rollback.

The pin files are not rewritten: a host rolled back runs its previous pin while its pin still
names the new one, and `drift` says so, until the pin is fixed (pin again) and rolled again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from builder.engine import imageref
from builder.engine.progress import Say
from builder.engine.protocol import Container, Engine
from builder.errors import (
    EngineError,
    EngineUnreachable,
    OperationFailed,
    StackError,
    ToolMissing,
    engine_lost,
)
from builder.hosts.deploy import BeforeStart, MustRestart, NotStarted, apply
from builder.hosts.drift import Report, config_drifts, state_drifts
from builder.hosts.pins import Pin
from builder.hosts.superseded import remove_superseded
from builder.manifest.resolve import ResolvedStack
from builder.verify.health import wait_healthy
from builder.verify.smoke import run_smoke_url
from builder.verify.smoke_report import Check
from builder.warm.lifecycle import Proof

#: What a host came to: deployed and passed its gate; failed (and what happened after).
OK = "ok"
FAILED = "failed"
ROLLED_BACK = "rolled back"
#: The previous pin could not be started either (its engine stopped answering, say): nothing
#: may serve on the host, which the summary must not call rolled back.
ROLLBACK_FAILED = "rollback failed"
NOT_REACHED = "not reached"


@dataclass(frozen=True)
class GateResult:
    passed: bool
    detail: str


#: Judges a host just deployed: the pin it runs and its engine.
Gate = Callable[[Pin, Engine], GateResult]


@dataclass
class HostResult:
    host: str
    engine: str
    image: str
    status: str
    #: What was done (apply's words) and what the gate said.
    detail: str = ""
    #: After a failure: what putting the host back on its previous pin did, and its gate.
    rollback: str | None = None
    #: The error that stopped the host before any gate (its engine, the pull, the warm-cache
    #: restore), whole, with its hint: what the command prints as its own error.
    error: str | None = None
    #: That error was the command's input (a StackError): the command exits 2, as any
    #: command does for bad input; a gate that failed is exit status 1.
    bad_input: bool = False

    def to_json(self) -> dict[str, str | None]:
        return {
            "host": self.host,
            "engine": self.engine,
            "image": self.image,
            "status": self.status,
            "detail": self.detail,
            "rollback": self.rollback,
            "error": self.error,
        }


@dataclass
class Fleet:
    """How the roll reaches hosts; the CLI's defaults run for real, tests hand in their own."""

    connect: Callable[[Pin], Engine]
    gate: Gate
    #: The pin a host had before its current one (None: it never had another).
    previous: Callable[[str], Pin | None]
    describe: Callable[[Pin], str] = field(default=lambda pin: pin.engine or "local engine")
    log: Callable[[str], None] = print
    #: Run between a host's old container and its new one (the warm-cache restore).
    before_start: BeforeStart | None = None
    #: Why a host running as pinned restarts all the same (its cache volume holds what the
    #: trust policy refuses); None: none asked.
    must_restart: MustRestart | None = None
    #: Remove the images of pins the host no longer has, once it passed its gates
    #: (hosts/superseded.py); None: keep them.
    remove_superseded: bool = False


def roll(pins: Sequence[Pin], fleet: Fleet) -> list[HostResult]:
    """Deploy pins one host at a time, gated; stop at the first failure (see the module)."""
    results: list[HostResult] = []
    for index, pin in enumerate(pins):
        result = HostResult(pin.host, fleet.describe(pin), pin.image, FAILED)
        results.append(result)
        fleet.log(f"{pin.host}: deploying {pin.stack} {pin.image} on {result.engine}")
        try:
            engine = fleet.connect(pin)
        except (ToolMissing, StackError, OperationFailed) as exc:
            result.detail = f"engine not reached: {_message(exc)}"
            result.error, result.bad_input = str(exc), isinstance(exc, StackError)
            fleet.log(f"{pin.host}: FAILED, {result.detail}")
            _not_reached(pins[index + 1 :], results, fleet)
            break
        unchanged = _runs_as_pinned(pin, engine)
        restarted: list[str] = []  # why fleet.must_restart restarted it, where it did
        failure: Exception | None = None
        try:
            done = apply(pin, engine, fleet.before_start, _noting(fleet.must_restart, restarted))
        except (StackError, OperationFailed, ToolMissing, EngineError) as exc:
            failure = exc
            gate = GateResult(False, f"deploy failed: {_message(exc)}")
            result.error = _said(exc, result.engine)
            result.bad_input = isinstance(exc, StackError)
        else:
            fleet.log(f"{pin.host}: {done}")
            gate = _judge(fleet, pin, engine)
            gate = GateResult(gate.passed, f"{done}; {gate.detail}")
        result.detail = gate.detail
        if gate.passed:
            result.status = OK
            fleet.log(f"{pin.host}: ok ({gate.detail})")
            if fleet.remove_superseded:
                _remove_superseded(pin, engine, fleet)
            continue
        fleet.log(f"{pin.host}: FAILED: {gate.detail}")
        if unchanged and not restarted:  # what ran before the roll runs on, untouched
            result.rollback = "not needed: the host already ran this pin before the roll"
        elif isinstance(failure, NotStarted):
            result.rollback = (
                "not needed: the deploy stopped before it touched any container; what ran "
                "there before runs on"
            )
        else:
            result.rollback, started = _roll_back(pin, engine, fleet)
            result.status = ROLLED_BACK if started else ROLLBACK_FAILED
        fleet.log(f"{pin.host}: rollback: {result.rollback}")
        _not_reached(pins[index + 1 :], results, fleet)
        break
    return results


def _said(exc: Exception, engine: str) -> str:
    """The error as the command prints it: an engine that stopped answering mid-deploy (killed,
    restarted) with what to do, in errors.engine_lost's words."""
    if isinstance(exc, EngineUnreachable):
        return engine_lost(exc.explanation, "deploy again", engine)
    return exc.explanation if isinstance(exc, EngineError) else str(exc)


def _remove_superseded(pin: Pin, engine: Engine, fleet: Fleet) -> None:
    """The images of the host's earlier pins, but its previous pin's (a rollback's), removed."""
    try:
        previous = fleet.previous(pin.host)
        keep = [pin.image] + ([previous.image] if previous is not None else [])
        said = remove_superseded(engine, pin.stack, keep)
    except EngineError as exc:  # the host is deployed; its old images wait for the next roll
        said = f"old images not removed: {exc.explanation}"
    except StackError as exc:  # without the previous pin, which image a rollback needs is unknown
        said = f"old images not removed: {_message(exc)}"
    if said is not None:
        fleet.log(f"{pin.host}: {said}")


def _roll_back(pin: Pin, engine: Engine, fleet: Fleet) -> tuple[str, bool]:
    """What the rollback did, and whether it ended with the host in a state of its choosing
    (the previous pin started, or nothing left serving): False when it could not act."""
    try:
        previous = fleet.previous(pin.host)
    except StackError as exc:
        previous, why = None, f"its previous pin is unreadable ({_message(exc)})"
    else:
        why = "it has no previous pin"
    if previous is None:
        try:
            container = _container(engine, pin.container)
            if container is None:
                return f"{why}: nothing of it was started, so nothing serves there now", True
            container.remove(force=True)
        except EngineError as exc:
            return f"{why}, and its failed container could not be removed: {_message(exc)}", False
        return f"{why}: its failed container was removed, so nothing serves there now", True
    fleet.log(f"{pin.host}: back to its previous pin, {previous.stack} {previous.image}")
    try:
        done = apply(previous, engine, fleet.before_start, fleet.must_restart)
    except (StackError, OperationFailed, ToolMissing, EngineError) as exc:
        return f"FAILED to start the previous pin {previous.image}: {_message(exc)}", False
    gate = _judge(fleet, previous, engine)
    verdict = "passes its gate" if gate.passed else "FAILS its gate too"
    return f"{done}; the previous pin ({previous.stack}) {verdict}: {gate.detail}", True


def _judge(fleet: Fleet, pin: Pin, engine: Engine) -> GateResult:
    """The gate's verdict; a gate that could not ask (the engine gone, a bad URL) failed."""
    try:
        return fleet.gate(pin, engine)
    except (StackError, OperationFailed, ToolMissing, EngineError) as exc:
        return GateResult(False, f"the gate could not run: {_message(exc)}")


def _not_reached(rest: Sequence[Pin], results: list[HostResult], fleet: Fleet) -> None:
    for pin in rest:
        results.append(
            HostResult(
                pin.host,
                fleet.describe(pin),
                pin.image,
                NOT_REACHED,
                "not touched: the roll stopped at an earlier host",
            )
        )


def _runs_as_pinned(pin: Pin, engine: Engine) -> bool:
    container = _container(engine, pin.container)
    if container is None:
        return False
    attrs = container.attrs
    return not state_drifts(attrs) and not config_drifts(pin, engine, attrs)


def _noting(must_restart: MustRestart | None, said: list[str]) -> MustRestart | None:
    """must_restart, its reasons kept in said: a host restarted for one is no longer what ran
    before the roll, so a failure after it rolls back."""
    if must_restart is None:
        return None
    decide = must_restart

    def noted(pin: Pin, engine: Engine) -> str | None:
        why = decide(pin, engine)
        if why is not None:
            said.append(why)
        return why

    return noted


def _container(engine: Engine, name: str) -> Container | None:
    try:
        return engine.container(name)
    except EngineError:
        return None


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or getattr(exc, "explanation", None) or str(exc)
    return " ".join(str(text).split())[:400]


# --- gates -------------------------------------------------------------------------------------


def health_gate(
    url_of: Callable[[Pin], str], timeout_s: float | None = None, progress: Say | None = None
) -> Gate:
    """The server answers 2xx on the pin's health path through its URL, within the pin's start
    period (or timeout_s); a container that stops or restarts meanwhile fails at once.
    progress: every few seconds, how long the host has been waited for and its last log line."""

    def gate(pin: Pin, engine: Engine) -> GateResult:
        try:
            url = url_of(pin).rstrip("/") + pin.health.path
        except StackError as exc:  # no URL to ask: the container's own word is all there is
            return state_gate(pin, engine, _message(exc))
        limit = timeout_s if timeout_s is not None else pin.health.start_period_s
        seen: list[Container] = []

        def stopped() -> str | None:
            container = engine.container(pin.container)
            if container is None:
                return f"{pin.container} is gone"
            seen[:] = [container]
            drifts = [d for d in state_drifts(container.attrs) if d.name in ("state", "restarts")]
            return f"{pin.container} {drifts[0].detail}" if drifts else None

        def describe(waited: float, last: str) -> str:
            logged = _last_logged(seen[0]) if seen else "(nothing yet)"
            return (
                f"{pin.host}: waiting for {url}, {waited:.0f} s of {limit:.0f} s ({last}); "
                f"the server last logged: {logged}"
            )

        health = wait_healthy(lambda: url, limit, stopped, progress, describe)
        if health.stopped is not None:
            return GateResult(False, health.stopped)
        if health.ok:
            return GateResult(True, f"{url} answered {health.status} after {health.waited_s:.0f} s")
        return GateResult(False, f"no 2xx from {url} within {limit:.0f} s (last: {health.last})")

    return gate


def state_gate(pin: Pin, engine: Engine, why: str) -> GateResult:
    """A pin whose server cannot be reached through a URL from here (no published serve port,
    or one on a remote host's loopback) is gated on its container's state alone: running and
    not restarted, as the engine says at once after the start. Its health path is not asked;
    the gate says so, rather than waiting out a start period for an answer that cannot come."""
    container = engine.container(pin.container)
    if container is None:
        return GateResult(False, f"{pin.container} is gone")
    stopped = [d for d in state_drifts(container.attrs) if d.name in ("state", "restarts")]
    if stopped:
        return GateResult(False, f"{pin.container} {stopped[0].detail}")
    return GateResult(
        True, f"{why}: gated on the container's state alone ({pin.container} running)"
    )


def _last_logged(container: Container) -> str:
    try:
        text = container.logs().decode("utf-8", errors="replace")
    except EngineError as exc:
        return f"(its log could not be read: {exc.explanation[:100]})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(nothing yet)"


def smoke_gate(
    url_of: Callable[[Pin], str],
    stack_of: Callable[[str], ResolvedStack | None],
    report_dir: Path,
    log: Callable[[str], None] = print,
) -> Gate:
    """The stack's smoke (its prompts and their expected answers, its speed floors) against the
    server's URL (`run_smoke_url`), its report under report_dir. A pin whose stack manifest is
    not at hand (pins are self-contained; the serving side may have no stacks/) is judged by
    the health gate alone, and says so."""

    def gate(pin: Pin, engine: Engine) -> GateResult:
        stack = stack_of(pin.stack)
        if stack is None:
            return GateResult(True, f"no smoke: no manifest of {pin.stack} here")
        if not stack.manifest.smoke.prompts:
            return GateResult(True, f"no smoke: {pin.stack} lists no smoke prompts")
        try:
            url = url_of(pin)
        except StackError as exc:
            return GateResult(True, f"no smoke: {_message(exc)}")
        stamp = time.strftime("%Y%m%dT%H%M%S")
        report_path = report_dir / f"{pin.host}-{pin.content_hash[:16]}-{stamp}.json"
        key = read_api_key(pin)
        report = run_smoke_url(url, stack, report_path=report_path, log=log, api_key=key)
        if report.passed:
            return GateResult(True, f"smoke passed ({report_path})")
        return GateResult(False, f"smoke failed: {_failures(report.failed())} ({report_path})")

    return gate


def read_api_key(pin: Pin) -> str | None:
    """The pin's API key, where its file is on this machine (the host deploys itself, or a
    copy sits at the same path); a host whose key is elsewhere answers 401 and the gate says
    so."""
    if pin.api_key_file is None or not Path(pin.api_key_file).is_file():
        return None
    return Path(pin.api_key_file).read_text().strip() or None


def _failures(checks: Sequence[Check]) -> str:
    """Each failed check once, with its first detail and how often it failed."""
    first: dict[str, str] = {}
    count: dict[str, int] = {}
    for check in checks:
        first.setdefault(check.name, " ".join(check.detail.split())[:200])
        count[check.name] = count.get(check.name, 0) + 1
    return "; ".join(
        f"{name}{f' ({count[name]}x)' if count[name] > 1 else ''}: {detail}"
        for name, detail in first.items()
    )


def warm_gate(prove: Callable[[Pin, Engine], Proof | None], require: bool) -> Gate:
    """What the server compiled since its start (builder/warm/lifecycle.py prove), once it is
    healthy and smoked: reported always; with require, a cold start or any compile fails."""

    def gate(pin: Pin, engine: Engine) -> GateResult:
        proof = prove(pin, engine)
        if proof is None:
            passed = not require
            return GateResult(passed, "no cache volume: start not proved warm")
        passed = not require or (proof.warm and proof.zero)
        return GateResult(passed, proof.summary())

    return gate


def both(first: Gate, then: Gate) -> Gate:
    """first, and then only if it passed."""

    def gate(pin: Pin, engine: Engine) -> GateResult:
        one = first(pin, engine)
        if not one.passed:
            return one
        two = then(pin, engine)
        return GateResult(two.passed, f"{one.detail}; {two.detail}")

    return gate


# --- drift across the fleet --------------------------------------------------------------------


def drift_rows(reports: Sequence[tuple[Pin, str, Report]]) -> list[dict[str, str]]:
    """One row per host for `drift --all`'s table: engine, stack, image and its drifts."""
    rows = []
    for pin, engine, report in reports:
        names = sorted({d.name for d in report.drifts})
        rows.append(
            {
                "host": pin.host,
                "engine": engine,
                "stack": pin.stack,
                "image": imageref.digest_of(pin.image)[:19],
                "status": "DRIFT" if report.drifts else "as pinned",
                "drifts": ", ".join(names) or "-",
                "warm": report.warm or "-",
            }
        )
    return rows
