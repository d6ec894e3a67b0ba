"""The smoke's results once the server has answered: the floors, the server log kept beside the
report, the compiles it names, the kernel cache's verdict and the driver cache's listing, and
the report written.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from builder.engine.protocol import Container
from builder.errors import EngineError
from builder.files import write_atomic
from builder.manifest.resolve import ResolvedStack
from builder.verify.compiles import CompileFindings, find_compiles
from builder.verify.kernel_watch import CacheWatches
from builder.verify.smoke_report import (
    CHECK_JIT,
    SmokeReport,
)

#: Where the smoke's servers keep the CUDA driver's JIT cache (CUDA_CACHE_PATH): what the driver
#: compiled from PTX while the server started and served is named there, since nothing logs it.
DRIVER_CACHE = "/var/cache/sm120-stacks/cuda-driver"


def judge_floor(report: SmokeReport, name: str, value: float | None, floor: float) -> None:
    if floor > 0:
        ok = value is not None and value >= floor
        report.add(name, ok, f"{value} tok/s (floor {floor})")


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def log_text(container: Container) -> str:
    try:
        raw = container.logs(stdout=True, stderr=True)
    except Exception as exc:  # the log is evidence, never a reason to lose the report
        return f"(could not read the container log: {exc})"
    return bytes(raw).decode("utf-8", errors="replace")


def collect_log(container: Container, report: SmokeReport, report_path: Path) -> None:
    """Keep the whole log beside the report, and fail on any JIT compile line in it."""
    text = log_text(container)
    path = server_log_path(report_path)
    write_atomic(path, text)
    report.server_log = str(path)
    judge_compiles(report, text)


def judge_compiles(report: SmokeReport, text: str) -> CompileFindings:
    """Name every runtime compile in the log; fail on the kinds the image promised to hold."""
    findings = find_compiles(text)
    report.runtime_compiles = findings.to_json()
    report.add(CHECK_JIT, not findings.failing, findings.detail())
    return findings


def judge_kernel_cache(report: SmokeReport, watch: CacheWatches | None) -> None:
    """Hit or miss per cached kernel, held against the log's compile lines: shown and counted,
    never a failed check (a miss is what a first start on an empty cache does). It runs in the
    smoke's `finally`, before the report is written: a judgement that raises is a note in the
    report, never a lost report."""
    if watch is None:
        return
    try:
        report.kernel_cache = watch.result(report.runtime_compiles).to_json()
    except Exception as exc:
        report.kernel_cache = watch.failed_result(exc).to_json()


def driver_cache_listing(container: Container) -> dict[str, Any] | None:
    """Files and bytes the CUDA driver wrote into CUDA_CACHE_PATH (its PTX JIT): None where the
    container is gone or has no shell."""
    script = f"find {DRIVER_CACHE} -type f 2>/dev/null | wc -l; du -sb {DRIVER_CACHE} 2>/dev/null"
    try:
        code, out = container.exec(["sh", "-c", script])
    except EngineError:
        return None
    words = out.split()
    if code != 0 or not words or not words[0].isdigit():
        return {"path": DRIVER_CACHE, "files": 0, "bytes": 0}
    size = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    return {"path": DRIVER_CACHE, "files": int(words[0]), "bytes": size}


def server_log_path(report_path: Path) -> Path:
    return report_path.with_name(report_path.stem + ".server.log")


def write_report(report: SmokeReport, report_path: Path) -> None:
    write_atomic(report_path, json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")


def new_report(stack: ResolvedStack, image: str, gpu: bool, report_path: Path) -> SmokeReport:
    """The report a smoke fills in, with what the manifest says it is judged by."""
    smoke = stack.manifest.smoke
    return SmokeReport(
        stack=stack.name,
        image=image,
        gpu=gpu,
        started_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        concurrency=smoke.concurrency,
        floors=smoke.floors.model_dump(),
        report_path=str(report_path),
    )


def keep_server_log(report: SmokeReport, server_log: Path, report_path: Path) -> None:
    """A server-at-a-URL's log (`smoke --url --server-log`): copied beside the report and
    judged for runtime compiles; a missing or empty one fails the compile check."""
    text = server_log.read_text(errors="replace") if server_log.is_file() else ""
    path = server_log_path(report_path)
    write_atomic(path, text)
    report.server_log = str(path)
    if text:
        judge_compiles(report, text)
    else:
        report.add(CHECK_JIT, False, f"server log {server_log} is missing or empty")
