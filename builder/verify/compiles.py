"""Runtime compiles in a server's log, by kind and name (patterns: knowledge/runtime_compiles.yaml).

A vLLM server can compile at serve time in several places: FlashInfer's JIT (ninja + nvcc, what
the image's JIT cache is for), Triton kernels (vLLM's Kernel JIT monitor), torch.compile graphs,
CuTe-DSL kernels. Each costs seconds to minutes on the first start and some only on the first
request. The smoke names every one it finds, fails on the kinds the image promised to hold
precompiled, and tells a compile from a load out of a disk cache.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

from builder.knowledge.runtime_compiles import COMPILING, Event, compile_kinds


@cache
def _compiled() -> list[tuple[str, Event, re.Pattern[str]]]:
    return [
        (kind, pattern.event, re.compile(pattern.regex))
        for kind, entry in compile_kinds().items()
        for pattern in entry.patterns
    ]


@dataclass(frozen=True)
class LogEvent:
    """One log line that a pattern named."""

    kind: str
    event: str
    name: str | None
    seconds: float | None
    line_no: int
    line: str


@dataclass
class KindSummary:
    """What one kind did in one log: compiles (names, in order, repeated once each), loads."""

    kind: str
    title: str
    fails_smoke: bool
    compiles: int = 0
    loads: int = 0
    names: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    #: Seconds the log itself reports for this kind's compiles (and its own totals, if any);
    #: None where no compile line gave a duration: unknown, never counted as 0.
    compile_seconds: float | None = None
    total_seconds: float | None = None
    first_line: str = ""

    @property
    def failing(self) -> bool:
        return self.fails_smoke and self.compiles > 0

    def describe(self) -> str:
        parts = []
        if self.compiles:
            names = ", ".join(self.names[:6]) + (" ..." if len(self.names) > 6 else "")
            parts.append(f"{self.compiles} compile line(s)" + (f": {names}" if names else ""))
        if self.loads:
            parts.append(f"{self.loads} cache load(s)")
        seconds = self.total_seconds if self.total_seconds is not None else self.compile_seconds
        if seconds:
            parts.append(f"{seconds:.1f} s by the log")
        return f"{self.kind}: " + ("; ".join(parts) or "none")


def find_events(text: str) -> list[LogEvent]:
    """Every line a pattern names; the first matching pattern names a line."""
    events = []
    patterns = _compiled()
    for number, line in enumerate(text.splitlines(), 1):
        for kind, event, regex in patterns:
            match = regex.search(line)
            if match is None:
                continue
            groups = match.groupdict()
            seconds = groups.get("seconds")
            events.append(
                LogEvent(
                    kind=kind,
                    event=event,
                    name=groups.get("name"),
                    seconds=float(seconds) if seconds else None,
                    line_no=number,
                    line=line.strip()[:500],
                )
            )
            break
    return events


def summarize(events: list[LogEvent]) -> list[KindSummary]:
    """One summary per kind that appears in the log, in the knowledge file's order."""
    kinds = compile_kinds()
    summaries: dict[str, KindSummary] = {}
    for item in events:
        entry = kinds[item.kind]
        summary = summaries.setdefault(
            item.kind, KindSummary(item.kind, entry.title, entry.fails_smoke)
        )
        if item.event in COMPILING:
            summary.compiles += 1
            summary.first_line = summary.first_line or item.line
            if item.seconds is not None:
                summary.compile_seconds = (summary.compile_seconds or 0.0) + item.seconds
            if item.name and item.name not in summary.names:
                summary.names.append(item.name)
        elif item.event == "load":
            summary.loads += 1
            if item.name and item.name not in summary.loaded:
                summary.loaded.append(item.name)
        elif item.event == "total" and item.seconds is not None:
            summary.total_seconds = (summary.total_seconds or 0.0) + item.seconds
    return [summaries[kind] for kind in kinds if kind in summaries]


@dataclass
class CompileFindings:
    """The smoke's view of one server log: per kind, and whether the smoke passes on it."""

    kinds: list[KindSummary]
    events: list[LogEvent]

    @property
    def failing(self) -> list[KindSummary]:
        return [k for k in self.kinds if k.failing]

    def detail(self) -> str:
        """The check's detail: the failing kinds first, then what else compiled."""
        if not any(k.compiles for k in self.kinds):
            loads = [k for k in self.kinds if k.loads]
            return "none" + (" (" + "; ".join(k.describe() for k in loads) + ")" if loads else "")
        ordered = self.failing + [k for k in self.kinds if not k.failing]
        text = "; ".join(k.describe() for k in ordered if k.compiles or k.loads)
        first = next((k.first_line for k in self.failing), "")
        return text + (f"\nfirst: {first[:300]}" if first else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "kinds": [{**asdict(k), "failing": k.failing, "title": k.title} for k in self.kinds],
            "events": [asdict(e) for e in self.events],
        }


def find_compiles(text: str) -> CompileFindings:
    events = find_events(text)
    return CompileFindings(summarize(events), events)


def smoke_environment() -> dict[str, str]:
    """What the smoke's servers run with so that each kind's compiles print a line: every
    kind's `visible_with`, except a kind whose lines would flood the log (`smoke_sets: false`;
    a server started by hand may still set it)."""
    env: dict[str, str] = {}
    for entry in compile_kinds().values():
        if entry.smoke_sets:
            env.update(entry.visible_with)
    return env


__all__ = [
    "CompileFindings",
    "KindSummary",
    "LogEvent",
    "find_compiles",
    "find_events",
    "smoke_environment",
    "summarize",
]
