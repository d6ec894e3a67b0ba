"""What a smoke found, and how a person reads it: the checks, the report, the table.

Plain data and its rendering, apart from the run (verify/smoke.py) that fills it, so that the
soak, the fleet gate and the served verdict read a report without starting anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from builder.knowledge.runtime_compiles import compile_kinds
from builder.verify.chat import Completion
from builder.verify.kernel_cache import summary_lines

# --- check names (the reasons a smoke fails) ---------------------------------------------------
CHECK_START = "container starts"
CHECK_READY = "server ready"
#: Fails with a detail starting "server died" when the container exits at any point.
CHECK_UP = "server stays up"
CHECK_REQUEST = "request succeeds"
CHECK_ANSWER = "correct answer"
CHECK_GARBAGE = "not garbage"
CHECK_JIT = "no JIT compile while serving"
CHECK_TTFT = "time to first token"
CHECK_SINGLE = "single-stream tok/s floor"
CHECK_BATCHED = "batched tok/s floor"


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class SmokeReport:
    stack: str
    image: str
    gpu: bool
    started_at: str
    checks: list[Check] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    #: "streaming" or "non-streaming" (a server without SSE answers JSON to stream=true).
    mode: str | None = None
    #: Worst time to first token of the warm single-stream pass; the cold one separately.
    ttft_s: float | None = None
    ttft_cold_s: float | None = None
    single_stream_tok_s: float | None = None
    batched_tok_s: float | None = None
    concurrency: int = 0
    floors: dict[str, float | None] = field(default_factory=dict)
    server_log: str | None = None
    #: Runtime compiles found in the server log, per kind (`verify.compiles`); None: no log read.
    runtime_compiles: dict[str, Any] | None = None
    #: The kernels a disk cache held before the smoke and after it, each hit or miss
    #: (`verify.kernel_cache`); None: no cache listed.
    kernel_cache: dict[str, Any] | None = None
    #: What the CUDA driver compiled from PTX into CUDA_CACHE_PATH during the smoke (files,
    #: bytes); None: not read (a server the tool did not start).
    driver_cache: dict[str, Any] | None = None
    #: The soak's summary when one ran after the smoke (`verify.soak`); its checks are above.
    soak: dict[str, Any] | None = None
    #: "container" (the tool served the image) or "url" (a server it did not start).
    target: str = "container"
    report_path: str | None = None
    exit_code: int | None = None
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks)

    def failed(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    def add(self, name: str, passed: bool, detail: str = "") -> None:
        self.checks.append(Check(name, passed, detail))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        for item, completion in zip(data["completions"], self.completions, strict=True):
            item["decode_tok_s"] = completion.decode_tok_s
        return data


def format_table(report: SmokeReport) -> str:
    """What a person reads: the verdict, one line per check, the numbers, where the files are."""
    verdict = "PASSED" if report.passed else "FAILED"
    lines = [
        f"smoke {report.stack} ({report.image}): {verdict} in {report.duration_s:.1f} s"
        f", {report.mode or 'no requests'}, {'GPU' if report.gpu else 'no GPU'}",
    ]
    for check in _condensed(report.checks):
        lines.append(f"  {'pass' if check.passed else 'FAIL'}  {check.name:<30} {check.detail}")
    lines.append(
        f"  ttft {_num(report.ttft_s, 's')} (cold {_num(report.ttft_cold_s, 's')})"
        f" | single-stream {_num(report.single_stream_tok_s, 'tok/s')}"
        f" | batched {_num(report.batched_tok_s, 'tok/s')} at {report.concurrency} concurrent"
    )
    lines += _compile_lines(report)
    if report.driver_cache is not None:
        cache = report.driver_cache
        lines.append(
            f"  CUDA driver JIT (PTX compiled at load, no log line): {cache['files']} file(s), "
            f"{cache['bytes']} bytes written under CUDA_CACHE_PATH"
        )
    lines += summary_lines(report.kernel_cache)
    lines.append(f"  report {report.report_path}; server log {report.server_log}")
    return "\n".join(lines)


def _compile_lines(report: SmokeReport) -> list[str]:
    """Runtime compiles by kind: every kind the knowledge file knows, found or not."""
    if report.runtime_compiles is None:
        return ["  runtime compiles: not judged (no server log; give one with --server-log FILE)"]
    found = {k["kind"]: k for k in report.runtime_compiles.get("kinds", [])}
    lines = ["  runtime compiles in the server log:"]
    for kind in compile_kinds():
        item = found.get(kind)
        if item is None:
            text = "none"
        else:
            names = ", ".join(item["names"][:4]) + (" ..." if len(item["names"]) > 4 else "")
            text = f"{item['compiles']} compile(s)" + (f" ({names})" if names else "")
            if item["loads"]:
                text += f", {item['loads']} cache load(s)"
            seconds = item["total_seconds"] or item["compile_seconds"]
            if seconds:
                text += f", {seconds:.1f} s by the log"
        flag = "FAIL" if item and item["failing"] else "    "
        lines.append(f"  {flag}    {kind:<14} {text}")
    if report.target == "url":
        needed = " ".join(
            f"{k}={v}" for e in compile_kinds().values() for k, v in e.visible_with.items()
        )
        lines.append(f"  (a server started by hand shows every kind only with {needed})")
    return lines


def _condensed(checks: list[Check]) -> list[Check]:
    """Repeated passing checks collapse into one line; every failure keeps its own line."""
    out: list[Check] = []
    passes: dict[str, int] = {}
    for check in checks:
        if check.passed:
            passes[check.name] = passes.get(check.name, 0) + 1
            if passes[check.name] > 1:
                continue
        first_line = check.detail.splitlines()[0] if check.detail else ""
        out.append(Check(check.name, check.passed, first_line[:100]))
    return [_with_count(c, passes.get(c.name, 0)) for c in out]


def _with_count(check: Check, passes: int) -> Check:
    if not check.passed or passes < 2:
        return check
    return Check(check.name, True, f"{passes} x, first: {check.detail}")


def _num(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.2f} {unit}" if unit == "s" else f"{value:.1f} {unit}"


__all__ = [
    "CHECK_ANSWER",
    "CHECK_BATCHED",
    "CHECK_GARBAGE",
    "CHECK_JIT",
    "CHECK_READY",
    "CHECK_REQUEST",
    "CHECK_SINGLE",
    "CHECK_START",
    "CHECK_TTFT",
    "CHECK_UP",
    "Check",
    "SmokeReport",
    "format_table",
]
