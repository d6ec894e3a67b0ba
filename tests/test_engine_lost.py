"""A build whose client loses the engine (restarted under it: bench/FAULTS.md) is told apart
from a failed step: the message names the step that was running, the client's last word, and
that a retry resumes from the build cache; nothing is tagged (the caller tags only after)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from builder.image.build import BuildFailed, _run_build
from builder.image.buildclient import BuildClient

#: What the classic client printed when its engine was restarted mid-step (bench/results/faults/).
LOST = """\
#9 [jit-cache 1/1] RUN python /opt/sm120-stacks/tools/flashinfer_jit.py precompile
#9 0.572 flashinfer_jit: [1/1] compiling norm for 12.0f with MAX_JOBS=1
cannot write /tmp/sm120-build-x/iid because server did not provide an image ID
"""
FAILED_STEP = """\
#9 [jit-cache 1/1] RUN python /opt/sm120-stacks/tools/flashinfer_jit.py precompile
#9 ERROR: process "/bin/sh -c python ..." did not complete successfully: exit code: 1
"""


def client_printing(text: str) -> tuple[list[str], BuildClient]:
    argv = [sys.executable, "-c", f"import sys; sys.stdout.write({text!r}); sys.exit(1)"]
    return argv, BuildClient("test", tuple(argv))


def test_a_lost_engine_is_not_blamed_on_a_step(tmp_path: Path) -> None:
    argv, client = client_printing(LOST)
    with pytest.raises(BuildFailed) as caught:
        _run_build("s", argv, client, tmp_path / "s.log", live=False)
    message = str(caught.value)
    assert "stopped during step [jit-cache 1/1] RUN python" in message
    assert "with no step failing: the build client lost the engine" in message
    assert "server did not provide an image ID" in message and "no image was tagged" in message
    assert "\n" not in message, "one line"


def test_a_failed_step_is_still_named_as_failed(tmp_path: Path) -> None:
    argv, client = client_printing(FAILED_STEP)
    with pytest.raises(BuildFailed, match=r"failed at step \[jit-cache 1/1\]"):
        _run_build("s", argv, client, tmp_path / "s.log", live=False)


def test_a_stream_cut_off_by_the_engine_is_the_engine_unreachable() -> None:
    """A push whose engine restarted under it ended in urllib3's ProtocolError, a traceback
    (bench/results/faults/, before the fix): it is EngineUnreachable, which a push retries."""
    import urllib3

    from builder.engine.docker_adapter import _engine_errors
    from builder.errors import EngineUnreachable

    cut = pytest.raises(EngineUnreachable, match="dropped the connection mid-stream")
    with cut, _engine_errors():
        raise urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead(0 bytes)")
