"""The smoke's "no outbound connection" check: a pinned server reaches nothing but itself.

A pinned digest promises the host runs what was tested; a server that asks the network at start
(a kernel-artifactory probe, a hub lookup, a usage report, an address probe) starts and behaves
differently on an offline host, and sends traffic nobody allowed. So every smoke server runs with
the egress watch (`egress_watch.py`, mounted as sitecustomize.py on PYTHONPATH: every Python
process of the container loads it at interpreter start, workers included), which records each
connect, datagram send and name lookup whose destination is not loopback, from process start to
the end of the smoke (the soak included). The check fails naming each destination and the module
that asked; it also fails when no process loaded the watch, since then it proved nothing.

It sees what Python's socket module does (requests, urllib3, httpx, aiohttp, asyncio,
huggingface_hub); a C library connecting by itself is outside it (docs/gpu-host.md says so).

`python -m builder.verify.egress EVENTS.jsonl` judges a file a server wrote elsewhere (the H200
bench: bench/h200_egress.sh), printing the verdict; exit 1 when it fails.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.engine.protocol import Container, Engine, Mount
from builder.errors import EngineError
from builder.files import write_atomic
from builder.verify import egress_watch

if TYPE_CHECKING:
    from builder.verify.smoke_report import SmokeReport

CHECK_EGRESS = "no outbound connection"
#: Where the watch lives in the container (a folder of its own, first on PYTHONPATH).
WATCH_DIR = "/opt/sm120-stacks-egress"
#: Where the container's processes append their lines (the container's own file system, read
#: back with the engine's archive call, which works on a stopped container too).
EVENTS_PATH = "/tmp/sm120-stacks-egress/events.jsonl"
#: How many distinct attempts the check's detail names (the raw file beside the report has all).
SHOWN = 20


@dataclass(frozen=True)
class EgressWatch:
    """What a smoke container gets so that its Python processes record their egress."""

    environment: dict[str, str]
    mount: Mount

    @classmethod
    def for_image(cls, engine: Engine, image_ref: str) -> EgressWatch:
        """The watch first on PYTHONPATH, before whatever PYTHONPATH the image sets."""
        image = engine.image(image_ref)
        config = (image.attrs.get("Config") or {}) if image is not None else {}
        image_env = dict(str(e).split("=", 1) for e in config.get("Env") or [] if "=" in str(e))
        earlier = image_env.get("PYTHONPATH", "")
        return cls(
            environment={
                "PYTHONPATH": f"{WATCH_DIR}:{earlier}" if earlier else WATCH_DIR,
                egress_watch.LOG_ENV: EVENTS_PATH,
            },
            mount=Mount(
                str(Path(egress_watch.__file__).resolve()),
                f"{WATCH_DIR}/sitecustomize.py",
                read_only=True,
            ),
        )


@dataclass
class EgressFindings:
    """The watch's lines, read: which processes it watched and what they tried to reach."""

    processes: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    unreadable: int = 0

    @property
    def passed(self) -> bool:
        return bool(self.processes) and not self.attempts

    def detail(self) -> str:
        if not self.processes:
            return (
                "the egress watch never loaded in the server, so nothing is proved: was its "
                "Python started with -I, -E or -S, or PYTHONPATH replaced?"
            )
        watched = f"{len(self.processes)} Python process(es) watched from start"
        if not self.attempts:
            return f"0 outbound attempts; {watched}"
        grouped = Counter(_describe(a) for a in self.attempts)
        lines = [f"{text} (x{count})" for text, count in grouped.most_common(SHOWN)]
        more = len(grouped) - SHOWN
        tail = [f"... and {more} more (the .egress.jsonl beside the report)"] if more > 0 else []
        head = f"{len(self.attempts)} outbound attempt(s), {len(grouped)} distinct; {watched}"
        return "\n".join([head, *lines, *tail])

    def to_json(self) -> dict[str, Any]:
        return {
            "processes": len(self.processes),
            "attempts": [
                {key: a.get(key) for key in ("event", "proto", "to", "caller", "pid")}
                for a in self.attempts
            ],
        }


def _describe(attempt: dict[str, Any]) -> str:
    modules = " < ".join(str(m) for m in attempt.get("modules") or [])
    return (
        f"{attempt.get('proto')} {attempt.get('event')} {attempt.get('to')} by "
        f"{attempt.get('caller')} in {str(attempt.get('process', '?'))[:80]!r}"
        + (f" [{modules}]" if modules else "")
    )


def parse_events(text: str) -> EgressFindings:
    """The watch's JSON lines; a line that is not one (a write cut by a kill) is counted."""
    findings = EgressFindings()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            findings.unreadable += 1
            continue
        if not isinstance(record, dict):
            findings.unreadable += 1
        elif record.get("event") == "watching":
            findings.processes.append(record)
        else:
            findings.attempts.append(record)
    return findings


def read_events(container: Container) -> str:
    """The events file out of the container; empty when no process wrote one."""
    try:
        data = b"".join(container.read_archive(EVENTS_PATH))
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            member = next((m for m in archive.getmembers() if m.isfile()), None)
            handle = archive.extractfile(member) if member is not None else None
            return handle.read().decode("utf-8", errors="replace") if handle else ""
    except (EngineError, tarfile.TarError, OSError):  # gone, or never written: "never loaded"
        return ""


def events_path(report_path: Path) -> Path:
    return report_path.with_name(report_path.stem + ".egress.jsonl")


def judge_egress(container: Container, report: SmokeReport, report_path: Path) -> EgressFindings:
    """Read the watch's file (kept beside the report as raw evidence) and add the check."""
    text = read_events(container)
    write_atomic(events_path(report_path), text)
    findings = parse_events(text)
    report.add(CHECK_EGRESS, findings.passed, findings.detail())
    return findings


def main(argv: list[str]) -> int:
    """Judge an events file a server wrote outside a smoke container (the H200 bench)."""
    if len(argv) != 1:
        print("usage: python -m builder.verify.egress EVENTS.jsonl", file=sys.stderr)
        return 2
    path = Path(argv[0])
    findings = parse_events(path.read_text(errors="replace") if path.is_file() else "")
    print(json.dumps({"passed": findings.passed, **findings.to_json()}, sort_keys=True))
    print(f"{CHECK_EGRESS}: {'PASS' if findings.passed else 'FAIL'}: {findings.detail()}")
    return 0 if findings.passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

__all__ = [
    "CHECK_EGRESS",
    "EVENTS_PATH",
    "EgressFindings",
    "EgressWatch",
    "events_path",
    "judge_egress",
    "parse_events",
    "read_events",
]
