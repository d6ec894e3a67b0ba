"""The smoke test: serve the image's own command and ask it questions it must answer right.

The seeds' broken stacks all started and answered HTTP 200; what was wrong was the text
(commas, whitespace, '!!!!'), a kernel JIT-compiled at serve time, or speed. So the smoke
judges answers (the manifest's pattern, `verify.garbage`), reads the server log for runtime
compiles of every kind (`verify.compiles`: FlashInfer's ninja/nvcc, Triton, torch.compile,
CuTe-DSL, named by kind and name), and compares time to first token and tokens/s with the
manifest's floors.

The container runs the image's CMD unchanged (it is the manifest's serve command, rendered at
build time): testing a different command line would prove nothing about the image. The serve
port is published on a free 127.0.0.1 port, so nothing else on the host is exposed or needed.

Whether a GPU smoke may run at all (gpu_gate.py) is the caller's decision, not `run_smoke`'s:
a CLI skips or fails (--require-gpu), tests may run on CPU stacks.

`run_smoke_url` is the same judge for a server the tool did not start (`smoke STACK --url`):
already running at a URL, its log read from a file when one is given. This module runs the
two; the server's life and the questions asked of it are smoke_server.py's, the results once
it has answered smoke_judge.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from builder.engine.owner import reap_orphans
from builder.engine.progress import Say
from builder.engine.protocol import Container, Engine
from builder.manifest.resolve import ResolvedStack
from builder.verify.egress import judge_egress
from builder.verify.kernel_watch import CacheWatches
from builder.verify.smoke_judge import (
    collect_log,
    driver_cache_listing,
    judge_kernel_cache,
    keep_server_log,
    new_report,
    write_report,
)
from builder.verify.smoke_report import (
    SmokeReport,
    format_table,
)
from builder.verify.smoke_server import (
    ContainerServer,
    Endpoint,
    UrlServer,
    remove_container,
    start_container,
)


def run_smoke(
    engine: Engine,
    image_ref: str,
    stack: ResolvedStack,
    *,
    mounts: dict[str, str],
    gpu: bool,
    report_path: Path,
    log: Callable[[str], None] = print,
    after: AfterSmoke | None = None,
    kernel_cache: CacheWatches | None = None,
    progress: Say | None = None,
) -> SmokeReport:
    """Serve image_ref, judge its answers, write the JSON report and the server log; `after`
    (the soak) runs on the same server when the smoke passed so far. `kernel_cache` lists the
    server's disk cache of GPU-compiled kernels before the container starts and in it after the
    requests, and says which kernels were hits and which misses. `progress` hears, every few
    seconds of the health wait, how long it has waited and what the server last logged."""
    report = new_report(stack, image_ref, gpu, report_path)
    began = time.monotonic()
    if kernel_cache is not None:
        kernel_cache.before()
    reap_orphans(engine, log)  # what a run the engine lost left behind (engine/owner.py)
    container = start_container(engine, image_ref, stack, mounts, gpu, report, log)
    try:
        if container is not None:
            server = ContainerServer(container, stack, report, log, progress)
            if server.wait_ready():
                server.exercise()
                _run_after(server, after, container)
            server.check_alive()
    finally:
        if container is not None:
            if kernel_cache is not None:
                kernel_cache.after(container)
            report.driver_cache = driver_cache_listing(container)
            judge_egress(container, report, report_path)  # from process start to here
            collect_log(container, report, report_path)
            remove_container(container)
            judge_kernel_cache(report, kernel_cache)
        report.duration_s = round(time.monotonic() - began, 2)
        write_report(report, report_path)
    log(format_table(report))
    return report


def run_smoke_url(
    base_url: str,
    stack: ResolvedStack,
    *,
    report_path: Path,
    server_log: Path | None = None,
    log: Callable[[str], None] = print,
    after: AfterSmoke | None = None,
    model: str | None = None,
    kernel_cache: CacheWatches | None = None,
    api_key: str | None = None,
    progress: Say | None = None,
) -> SmokeReport:
    """The same judge for a server the tool did not start, already running at base_url.
    api_key: sent as `Authorization: Bearer KEY` with every chat request (never written to
    the report or the log).

    Its log is read from server_log when given (copied beside the report, then judged for
    runtime compiles); without one, compiles are not judged and the report says so. The
    server must run with `smoke_environment()` for FlashInfer's compiles to print at all. model: the
    name the server serves, where it is not the manifest's (served_model_name or model id).
    kernel_cache: the server's cache directory on this machine, listed before the first request
    and after the last (a kernel compiled while the server started before the smoke shows as
    a hit there, unless the log names its compile). progress: as run_smoke's (the last line of
    server_log, when one is given).
    """
    report = new_report(stack, f"server at {base_url}", stack.manifest.smoke.needs_gpu, report_path)
    report.target = "url"
    began = time.monotonic()
    if kernel_cache is not None:
        kernel_cache.before()
    try:
        server = UrlServer(base_url, stack, report, log, server_log, progress)
        server.model = model or server.model
        if api_key:
            server.headers["Authorization"] = f"Bearer {api_key}"
        log(f"smoke: judging the server at {server.root}")
        if server.wait_ready():
            server.exercise()
            _run_after(server, after, None)
        server.check_alive()
    finally:
        if kernel_cache is not None:
            kernel_cache.after(None)
        if server_log is not None:
            keep_server_log(report, server_log, report_path)
        judge_kernel_cache(report, kernel_cache)
        report.duration_s = round(time.monotonic() - began, 2)
        write_report(report, report_path)
    log(format_table(report))
    return report


@dataclass(frozen=True)
class LiveServer:
    """The server a smoke just judged, for a check that runs on it next (the soak)."""

    base_url: str
    model: str
    #: Whether it still runs: the container's state, or (a server the tool did not start)
    #: whether it answers HTTP at all.
    running: Callable[[], bool]
    #: The container the smoke started; None for a server at a URL.
    container: Container | None
    #: The smoke's report: the next check adds its checks to it.
    report: SmokeReport
    #: What every request sends besides the body (the server's API key).
    headers: dict[str, str] = field(default_factory=dict)


AfterSmoke = Callable[[LiveServer], None]


def _run_after(server: Endpoint, after: AfterSmoke | None, container: Container | None) -> None:
    """`after` on a server whose smoke passed so far; a failed smoke already has its verdict."""
    if after is None or server.base_url is None or server.died or not server.report.passed:
        return
    after(
        LiveServer(
            server.base_url,
            server.model,
            server._running,
            container,
            server.report,
            dict(server.headers),
        )
    )
