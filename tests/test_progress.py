"""The progress display's step tracking: what runs, what failed, which module compiles."""

from __future__ import annotations

import io

from builder.image.progress import Progress, StepTracker

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
