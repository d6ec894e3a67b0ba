"""The soak: a server under concurrent streaming chat for a while, judged for what a smoke's
handful of requests cannot show.

The seeds' worst failures came late and under load: FlashInfer's sampler froze every stream of
a busy sm12x server after minutes while /health still answered (rule
flashinfer-sampler-freeze-sm12x), and servers grew until the OOM killer came. The soak keeps
`concurrency` streams open (OpenAI-compatible /v1/chat/completions, stream=true) for `seconds`,
each worker cycling through prompts of mixed lengths, and fails on:

- a stall: no token on any open stream for `stall_s` while the server is up (a stream that
  has not produced its first token counts from when it was opened);
- errors: failed requests over all requests above `max_error_rate`;
- memory growth: the server's memory past its level at the end of the warm-up by more than
  `max_memory_growth_mb` (the container's, from the engine's stats, page cache left out; for a
  server at a URL, the resident set of the process tree `--server-pid` names).

A stall, growth past the bound or a server that stops ends the soak at once: its verdict can no
longer change. Requests still open when the soak ends are left out of the counts. It reports
time to first token and inter-token latency (p50, p99), tokens/s over time and the memory
curve: a JSON summary, a CSV a plot reads (one row per time bucket) and a PNG chart
(`soak_files.png`, where the plotting library is installed), written beside the smoke's
report. Its checks join the smoke's, so a failed soak fails `test`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.engine.progress import Say
from builder.files import write_atomic
from builder.manifest.resolve import ResolvedStack
from builder.verify import soak_files
from builder.verify.smoke import (
    AfterSmoke,
    LiveServer,
)
from builder.verify.soak_load import (
    MemoryProbe,
    SoakRun,
    SoakSettings,
    process_tree_rss,
    soak_prompts,
)
from builder.verify.soak_verdict import (
    soak_checks,
    soak_rows,
    soak_summary,
)


@dataclass
class SoakResult:
    settings: SoakSettings
    passed: bool
    summary: dict[str, Any]
    checks: list[tuple[str, bool, str]]


def after_smoke(
    stack: ResolvedStack,
    seconds: float | None,
    report_base: Path,
    *,
    server_pid: int | None = None,
    log: Callable[[str], None] = print,
    progress: Say | None = None,
) -> AfterSmoke | None:
    """The soak as the smoke's next step (`run_smoke(after=...)`), or None when it is not to
    run (0 seconds, the manifest's default unless `seconds` says otherwise). Memory is the
    container's; for a server the tool did not start, that of server_pid's process tree.
    progress: a line every PROGRESS_EVERY_S of the soak (streams, tokens/s, TTFT, memory)."""
    settings = SoakSettings.for_stack(stack, seconds)
    if settings.seconds <= 0:
        return None

    def soak(server: LiveServer) -> None:
        memory: MemoryProbe | None = None
        if server.container is not None:
            memory, source = server.container.memory_bytes, "container memory (engine stats)"
        elif server_pid is not None:
            pid = server_pid
            memory = lambda: process_tree_rss(pid)  # noqa: E731
            source = f"resident set of process {pid} and its children"
        else:
            source = "not measured (give --server-pid)"
        run_soak(
            server,
            stack,
            settings,
            report_base,
            memory=memory,
            memory_source=source,
            log=log,
            progress=progress,
        )

    return soak


def run_soak(
    server: LiveServer,
    stack: ResolvedStack,
    settings: SoakSettings,
    report_base: Path,
    *,
    memory: MemoryProbe | None = None,
    memory_source: str = "not measured",
    log: Callable[[str], None] = print,
    progress: Say | None = None,
) -> SoakResult:
    """Soak the server, add the soak's checks to its smoke report, write JSON, CSV and PNG
    (report_base + .json/.csv/.png)."""
    log(
        f"soak: {settings.concurrency} streams for {settings.seconds:.0f} s against "
        f"{server.base_url} (stall after {settings.stall_s:g} s; memory: {memory_source})"
    )
    soak = SoakRun(server, settings, soak_prompts(stack), memory, progress)
    soak.run()
    checks = soak_checks(soak, memory_source)
    summary = soak_summary(soak, memory_source)
    kinds = _FILES if soak_files.can_plot() else _FILES[:2]
    paths = {kind: report_base.with_name(f"{report_base.name}.{kind}") for kind in kinds}
    summary["files"] = {kind: str(path) for kind, path in paths.items()}
    passed = all(ok for _, ok, _ in checks)
    summary["passed"] = passed
    summary["checks"] = [{"name": n, "passed": ok, "detail": d} for n, ok, d in checks]
    rows = soak_rows(soak)
    write_atomic(paths["csv"], soak_files.csv_text(rows))
    chart = soak_files.Chart(
        stack=stack.name,
        streams=settings.concurrency,
        ran_s=soak.ran_s,
        stopped=soak.stopped,
        passed=passed,
        memory=list(soak.memory_samples),
        memory_bound_mb=(
            soak.baseline_mb + settings.max_memory_growth_mb
            if settings.max_memory_growth_mb is not None and soak.baseline_mb is not None
            else None
        ),
    )
    if "png" in paths:
        write_atomic(paths["png"], soak_files.png(chart, rows))
    write_atomic(paths["json"], json.dumps(summary, indent=2, sort_keys=True) + "\n")
    for name, ok, detail in checks:
        server.report.add(name, ok, detail)
    server.report.soak = summary
    log(soak_files.summary_line(summary))
    return SoakResult(settings, passed, summary, checks)


_FILES = ("json", "csv", "png")
