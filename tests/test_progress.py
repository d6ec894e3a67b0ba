"""Progress: the build display's step tracking (what runs, what failed, which module compiles),
and the lines of long work (pushes and pulls per layer, the health wait, the soak)."""

from __future__ import annotations

import io

from builder.image.docker_engine import parse_progress_stream
from builder.image.engine import LayerEvent
from builder.image.progress import LayerProgress, Progress, StepTracker, Throttle

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
