"""Progress: the build display's step tracking (what runs, what failed, which module compiles),
and the lines of long work (pushes and pulls per layer, the health wait, the soak)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from builder import REPO_ROOT
from builder.engine import progress
from builder.engine.docker_adapter import parse_progress_stream
from builder.engine.progress import LayerProgress, Progress, StepTracker, Throttle
from builder.engine.protocol import LayerEvent
from builder.hosts.fleet import health_gate
from builder.manifest.resolve import resolve
from builder.verify import soak_load
from builder.verify.smoke import LiveServer, run_smoke_url
from builder.verify.smoke_report import SmokeReport
from builder.verify.soak import run_soak
from builder.verify.soak_load import SoakSettings
from tests.support.fake_chat import Behaviour, fake_chat_server, url_of

LOG = """\
#5 [toolchain 2/2] RUN python3.11 -m venv /opt/venv
#5 DONE 9.0s
#12 [jit-cache 1/1] RUN python /opt/sm120-stacks/tools/flashinfer_jit.py precompile norm
#12 0.30 flashinfer_jit: [1/2] compiling fused_moe_120 for 12.0f with MAX_JOBS=2
#12 812.4 [37/97] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile x.cu
#8 [packages 2/3] RUN pip install -r heavy.txt
#8 ERROR: executor failed running [/bin/bash -o pipefail -c pip install]: exit code: 1
"""


def test_tracker_names_the_failing_step_and_the_compile_progress() -> None:
    tracker = StepTracker()
    lines = LOG.splitlines()
    for line in lines[:5]:
        tracker.feed(line)
    assert tracker.current is not None and tracker.current.startswith("[jit-cache 1/1]")
    assert tracker.detail.startswith("[37/97] /usr/local/cuda/bin/nvcc")
    for line in lines[5:]:
        tracker.feed(line)
    assert tracker.failed is not None
    assert tracker.failed[0].startswith("[packages 2/3]")
    assert "exit code: 1" in tracker.failed[1]
    assert tracker.finished == 1


def test_plain_progress_echoes_every_line() -> None:
    stream = io.StringIO()
    with Progress("ci-mini", live=False, stream=stream) as progress:
        for line in LOG.splitlines():
            progress.line(line)
    assert stream.getvalue() == LOG


def test_a_canceled_build_names_the_step_and_where_the_compile_was() -> None:
    tracker = StepTracker()
    for line in LOG.splitlines()[:5] + ["#12 CANCELED"]:
        tracker.feed(line)
    assert tracker.failed is not None
    assert tracker.failed[0].startswith("[jit-cache 1/1]")
    assert tracker.failed[1].startswith("canceled (last: [37/97]")


# --- long work: throttled lines, layer progress ------------------------------------------------


class _Clock:
    """Time that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_throttle_lets_one_line_through_every_interval_and_nothing_when_quiet() -> None:
    clock, said = _Clock(), []
    throttle = Throttle(said.append, every_s=5, clock=clock)
    for step in range(21):  # 0..10 s in half seconds
        clock.now = step / 2
        throttle.line(f"at {clock.now}")
    assert said == ["at 5.0", "at 10.0"]
    throttle.line("the end", force=True)
    assert said[-1] == "the end"
    quiet = Throttle(None, every_s=0, clock=clock)
    assert not quiet.due()
    quiet.line("nobody hears this", force=True)  # --json: no line at all, not even forced


def test_layer_progress_names_each_moving_layers_bytes_and_percent() -> None:
    clock, said = _Clock(), []
    progress = LayerProgress("push", "r:5000/s:t", said.append, every_s=3, clock=clock)
    events = [
        (0.0, LayerEvent("", "The push refers to repository [r:5000/s]")),
        (0.1, LayerEvent("aaaaaaaaaaaa", "Preparing")),
        (0.1, LayerEvent("bbbbbbbbbbbb", "Preparing")),
        (0.2, LayerEvent("bbbbbbbbbbbb", "Layer already exists")),
        (1.0, LayerEvent("aaaaaaaaaaaa", "Pushing", 1_000_000_000, 4_000_000_000)),
        (3.5, LayerEvent("aaaaaaaaaaaa", "Pushing", 3_000_000_000, 4_000_000_000)),
        (4.0, LayerEvent("aaaaaaaaaaaa", "Pushed")),
    ]
    for at, event in events:
        clock.now = at
        progress(event)
    assert said == [
        "push r:5000/s:t: 1 of 2 layers done; aaaaaaaaaaaa pushing 3.00 GB of 4.00 GB (75%)"
    ]
    clock.now = 10.0
    progress.finish()
    assert said[-1] == "push r:5000/s:t: 2 layers done (4.00 GB moved) in 10 s"


def test_the_engine_adapter_turns_stream_lines_into_layer_events() -> None:
    lines = [
        {"status": "Pulling fs layer", "id": "c0ffee"},
        {"status": "Downloading", "id": "c0ffee", "progressDetail": {"current": 5, "total": 9}},
        {"status": "Digest: sha256:" + "a" * 64},
    ]
    seen: list[LayerEvent] = []
    parse_progress_stream(iter(lines), seen.append)
    assert seen == [
        LayerEvent("c0ffee", "Pulling fs layer"),
        LayerEvent("c0ffee", "Downloading", 5, 9),
        LayerEvent("", "Digest: sha256:" + "a" * 64),
    ]


# --- the health wait, the soak, the fleet's gate -----------------------------------------------

WAITING = re.compile(
    r"smoke: waiting for /health, (\d+) s of \d+ s; the server last logged: "
    r"INFO loading weights: shard (\d+)"
)


@pytest.fixture
def often(monkeypatch: pytest.MonkeyPatch) -> None:
    """A progress line every half second: a test's server starts in seconds, not minutes."""
    monkeypatch.setattr(progress, "EVERY_S", 0.5)
    monkeypatch.setattr(soak_load, "PROGRESS_EVERY_S", 0.5)


def test_a_slow_server_shows_the_health_wait_with_its_last_log_line(
    often: None, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    stack = resolve("ci-mini", REPO_ROOT / "stacks")
    lines: list[str] = []
    with fake_chat_server(Behaviour(answers=True, healthy_after_s=4, startup_log=log)) as server:
        report = run_smoke_url(
            url_of(server),
            stack,
            report_path=tmp_path / "smoke.json",
            server_log=log,
            log=lambda line: None,
            progress=lines.append,
        )
    assert report.checks[0].name == "server ready" and report.checks[0].passed
    waits = [m for m in map(WAITING.match, lines) if m]
    assert len(waits) >= 2, lines  # the wait polls once a second
    shards = [int(m.group(2)) for m in waits]
    assert shards == sorted(shards) and shards[-1] > shards[0]  # the log's newest line each time
    assert not any("soak" in line for line in lines)


def test_with_json_the_health_wait_says_nothing(
    often: None, tmp_path: Path, stacks_dir: Path
) -> None:
    from tests.conftest import cli

    log = tmp_path / "server.log"
    (stacks_dir / "slow-start.yaml").write_text(
        "extends: vllm-0.22-b12x\n"
        "smoke: {concurrency: 2, floors: {single_stream_tok_s: 0, batched_tok_s: 0}}\n"
    )
    report = tmp_path / "smoke.json"
    with fake_chat_server(Behaviour(answers=True, healthy_after_s=2, startup_log=log)) as server:
        args = ["--stacks-dir", str(stacks_dir), "smoke", "slow-start", "--url", url_of(server)]
        args += ["--server-log", str(log), "--report", str(report)]
        quiet = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert quiet.exit_code == 0, quiet.output
    assert json.loads(quiet.stdout)["passed"]
    assert "waiting for /health" not in quiet.output
    with fake_chat_server(Behaviour(answers=True, healthy_after_s=2, startup_log=log)) as server:
        args[args.index("--url") + 1] = url_of(server)
        said = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert said.exit_code == 0, said.output
    assert "smoke: waiting for /health" in said.stderr and "loading weights" in said.stderr


def test_the_soak_says_a_line_per_interval(often: None, tmp_path: Path) -> None:
    stack = resolve("ci-mini", REPO_ROOT / "stacks")
    report = SmokeReport(stack="ci-mini", image="fake", gpu=False, started_at="now")
    lines: list[str] = []
    settings = SoakSettings(
        seconds=2.5, concurrency=2, stall_s=1.0, max_error_rate=0.0, max_memory_growth_mb=100.0
    )
    with fake_chat_server(Behaviour()) as server:
        run_soak(
            LiveServer(url_of(server), "tiny", lambda: True, None, report),
            stack,
            settings,
            tmp_path / "ci-mini-soak",
            memory=lambda: 500_000_000,
            memory_source="a test's numbers",
            log=lambda line: None,
            progress=lines.append,
        )
    line = re.compile(
        r"soak: \d+ s of 2 s: (\d) streams open, ([\d.]+) tok/s, ttft p50 \d+ ms p99 \d+ ms, "
        r"memory 500 MB \(\+0 MB\), \d+ requests done"
    )
    matched = [m for m in map(line.fullmatch, lines) if m]
    assert len(matched) >= 3 and len(matched) == len(lines), lines
    assert all(m.group(1) == "2" for m in matched) and float(matched[-1].group(2)) > 0


def test_the_fleets_health_gate_says_how_long_and_what_the_server_logged(
    often: None, stacks_dir: Path, tmp_path: Path
) -> None:
    from tests.test_fleet import _pin

    pin = _pin(stacks_dir, tmp_path)

    class Running:
        attrs: ClassVar[dict[str, Any]] = {"State": {"Status": "running"}}

        def logs(self, *, stdout: bool = True, stderr: bool = True) -> bytes:
            return b"INFO loading weights: shard 3\n\n"

    class Engine:
        def container(self, name: str) -> Running:
            return Running()

    lines: list[str] = []
    with fake_chat_server(Behaviour(healthy_after_s=2)) as server:
        gate = health_gate(lambda pin: url_of(server), 10, lines.append)
        result = gate(pin, Engine())  # type: ignore[arg-type]
    assert result.passed, result.detail
    assert len(lines) >= 2, lines
    assert all(
        line.startswith(f"{pin.host}: waiting for {url_of(server)}/health")
        and "(HTTP 503)" in line
        and line.endswith("the server last logged: INFO loading weights: shard 3")
        for line in lines[1:]
    ), lines
