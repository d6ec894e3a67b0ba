"""The smoke harness, for real: ci-mini's image serves tiny models made here; no mocked HTTP.

One trained model must pass. The same harness must fail, for the right reason (the failed
check's name), on the same model with random weights (garbage, the seeds' symptom), on a model
that answers fluently but wrong, on a server that dies at startup, and on a server log that
shows a kernel compile. Models are made once per session, in seconds, on the CPU.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from builder.engine.address import from_environment
from builder.engine.docker_adapter import DockerEngine, connect_engine
from builder.engine.owner import OWNER_LABEL, owner
from builder.errors import ToolMissing
from builder.manifest.resolve import ResolvedStack, resolve
from builder.verify.gpu_gate import gpu_available, gpu_gate
from builder.verify.smoke import run_smoke
from builder.verify.smoke_judge import DRIVER_CACHE, server_log_path
from builder.verify.smoke_report import (
    CHECK_ANSWER,
    CHECK_GARBAGE,
    CHECK_JIT,
    CHECK_READY,
    CHECK_REQUEST,
    CHECK_START,
    CHECK_UP,
    SmokeReport,
    format_table,
)
from tests.engine.conftest import RIGHT

#: The harness labels its containers so that a test can find the one it started.
#: This run's smoke containers only: another clone's run on the same engine has its own.
SMOKE_LABEL = {"label": ["sm120-stacks.smoke", f"{OWNER_LABEL}={owner()}"]}

pytestmark = [pytest.mark.engine, pytest.mark.needs_ci_mini("the smoke against transformers serve")]

MODEL_PATH = "/models/tiny"
#: Short enough that a dead server mistaken for a slow one would show in the test's duration.
HEALTH_TIMEOUT_S = 90


@pytest.fixture(scope="session")
def smoke_stack(workspace: Path, ci_mini: dict[str, str]) -> ResolvedStack:
    """ci-mini as its manifest says, with a shorter health timeout."""
    stack = resolve("ci-mini", workspace / "stacks")
    smoke = stack.manifest.smoke.model_copy(update={"health_timeout_s": HEALTH_TIMEOUT_S})
    return dataclasses.replace(stack, manifest=stack.manifest.model_copy(update={"smoke": smoke}))


def smoke(
    api: Any,
    ci_mini: dict[str, str],
    stack: ResolvedStack,
    model: Path,
    report_dir: Path,
    extra_mounts: dict[str, str] | None = None,
) -> SmokeReport:
    mounts = {str(model): MODEL_PATH, **(extra_mounts or {})}
    return run_smoke(
        DockerEngine(api),
        ci_mini["ref"],
        stack,
        mounts=mounts,
        gpu=False,
        report_path=report_dir / "smoke.json",
        log=lambda line: None,
    )


def failed_names(report: SmokeReport) -> set[str]:
    return {check.name for check in report.failed()}


def test_passes_on_the_trained_model(
    api: Any,
    ci_mini: dict[str, str],
    smoke_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
) -> None:
    report = smoke(api, ci_mini, smoke_stack, models["trained"], tmp_path)
    assert report.passed, report.failed()
    assert report.mode == "streaming"
    judged = [c for c in report.completions if c.phase in ("cold", "warm", "batch")]
    assert len(judged) == 2 * len(smoke_stack.manifest.smoke.prompts) + 2
    assert all(c.text == RIGHT and c.finish_reason == "stop" for c in judged)
    assert report.ttft_s and report.single_stream_tok_s and report.batched_tok_s
    saved = json.loads((tmp_path / "smoke.json").read_text())
    assert saved["passed"] is True and saved["ttft_s"] == report.ttft_s
    # The CUDA driver's JIT cache was read in the container (a CPU server writes nothing).
    assert saved["driver_cache"] == {"path": DRIVER_CACHE, "files": 0, "bytes": 0}
    assert "CUDA driver JIT" in format_table(report)
    assert "Uvicorn running" in server_log_path(tmp_path / "smoke.json").read_text()
    assert not api.containers.list(all=True, filters=SMOKE_LABEL)


def test_random_weights_fail_as_garbage(
    api: Any,
    ci_mini: dict[str, str],
    smoke_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
) -> None:
    report = smoke(api, ci_mini, smoke_stack, models["random"], tmp_path)
    assert failed_names(report) == {CHECK_GARBAGE, CHECK_ANSWER}
    garbage = next(c for c in report.failed() if c.name == CHECK_GARBAGE)
    assert "U+FFFD" in garbage.detail


def test_a_fluent_wrong_answer_fails_as_wrong(
    api: Any,
    ci_mini: dict[str, str],
    smoke_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
) -> None:
    report = smoke(api, ci_mini, smoke_stack, models["wrong"], tmp_path)
    assert failed_names(report) == {CHECK_ANSWER}
    assert "Louisville" in report.failed()[0].detail


def test_a_server_that_dies_is_reported_dead_not_slow(
    api: Any,
    ci_mini: dict[str, str],
    smoke_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
) -> None:
    report = smoke(api, ci_mini, smoke_stack, models["empty"], tmp_path)
    assert failed_names(report) == {CHECK_UP}
    assert CHECK_READY not in {c.name for c in report.checks}
    died = report.failed()[0].detail
    assert died.startswith("server died during startup: exit code 1")
    assert report.exit_code == 1 and not report.completions
    assert report.duration_s < HEALTH_TIMEOUT_S
    assert server_log_path(tmp_path / "smoke.json").read_text().strip()


#: Printed by the server-side hook below when it holds the first chat request.
HELD_MARKER = "sm120-stacks-test: holding a chat request"

#: Loaded by site (a .pth line) in every Python of the container; acts only in the server. It
#: holds the first chat request until the test kills the container, so the kill cannot lose the
#: race against a tiny model's fast answers (it once did, on a fast CI machine).
HOLD_CHAT_HOOK = f"""
import sys
if "serve" in sys.argv:
    import time
    import fastapi

    _call = fastapi.FastAPI.__call__

    async def _hold_chat(self, scope, receive, send):
        if scope.get("path") == "/v1/chat/completions":
            sys.stderr.write({HELD_MARKER!r} + chr(10))
            sys.stderr.flush()
            time.sleep(600)
        await _call(self, scope, receive, send)

    fastapi.FastAPI.__call__ = _hold_chat
"""


def test_a_server_killed_while_serving_is_reported_dead(
    ci_mini: dict[str, str],
    smoke_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
    api: Any,
) -> None:
    """As a CUDA fault kills a real server: SIGKILL while the first chat request is in it."""
    site = site_packages(api, ci_mini, smoke_stack)
    hook = tmp_path / "zz_hold_chat.py"
    hook.write_text(HOLD_CHAT_HOOK)
    pth = tmp_path / "zz_hold_chat.pth"
    pth.write_text("import zz_hold_chat\n")
    for path in (hook, pth):
        path.chmod(0o644)
    mounts = {str(hook): f"{site}/zz_hold_chat.py", str(pth): f"{site}/zz_hold_chat.pth"}
    earlier = {c.id for c in api.containers.list(all=True, filters=SMOKE_LABEL)}
    killed = threading.Event()
    killer = threading.Thread(target=kill_when_held, args=(earlier, killed), daemon=True)
    killer.start()
    report = smoke(api, ci_mini, smoke_stack, models["trained"], tmp_path / "report", mounts)
    killer.join(timeout=5)
    assert killed.is_set()
    assert CHECK_UP in failed_names(report) <= {CHECK_UP, CHECK_REQUEST}
    died = next(c for c in report.failed() if c.name == CHECK_UP).detail
    assert died.startswith("server died while serving: exit code 137")
    assert not report.passed


def kill_when_held(earlier: set[str], killed: threading.Event) -> None:
    """Its own engine client: the harness's client is busy in another thread. Containers in
    `earlier` are skipped: an earlier test's may still be on its way out, and asking for its logs
    then fails (409), which once ended this thread before it killed anything."""
    from docker.errors import APIError

    own = connect_engine(from_environment()).sdk
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        for container in own.containers.list(filters=SMOKE_LABEL):
            if container.id in earlier:
                continue
            try:
                if HELD_MARKER.encode() in container.logs():
                    container.kill()
                    killed.set()
                    return
            except APIError:
                continue
        time.sleep(0.2)


def site_packages(api: Any, ci_mini: dict[str, str], stack: ResolvedStack) -> str:
    """Where the image's server Python looks for .pth files."""
    env = dict(e.split("=", 1) for e in api.images.get(ci_mini["ref"]).attrs["Config"]["Env"])
    return f"{env['VIRTUAL_ENV']}/lib/python{stack.manifest.python.version}/site-packages"


def test_a_kernel_compile_in_the_server_log_fails(
    api: Any,
    ci_mini: dict[str, str],
    smoke_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
) -> None:
    """A .pth file makes the server's Python print a ninja/nvcc line, as a FlashInfer JIT would."""
    site = f"{site_packages(api, ci_mini, smoke_stack)}/zz_fake_jit.pth"
    line = "[1/3] /usr/local/cuda/bin/nvcc -gencode=arch=compute_120f,code=sm_120f -c norm.cu"
    pth = tmp_path / "fake_jit.pth"
    pth.write_text(f"import sys; sys.stderr.write({line!r} + chr(10))\n")
    pth.chmod(0o644)
    report_dir = tmp_path / "report"
    report = smoke(api, ci_mini, smoke_stack, models["trained"], report_dir, {str(pth): site})
    assert failed_names(report) == {CHECK_JIT}
    assert "norm.cu" in report.failed()[0].detail


def test_gpu_smoke_is_skipped_here_unless_required(engine: DockerEngine) -> None:
    if gpu_available(engine):
        pytest.skip("this host has a GPU and a GPU-capable engine")
    message = gpu_gate(engine, require_gpu=False)
    assert message is not None and message.startswith("GPU smoke skipped: no NVIDIA GPU")
    with pytest.raises(ToolMissing, match="required"):
        gpu_gate(engine, require_gpu=True)


def test_a_gpu_request_reaches_the_engine(
    engine: DockerEngine, ci_mini: dict[str, str], smoke_stack: ResolvedStack, tmp_path: Path
) -> None:
    """gpu=True really asks the engine for GPUs: here the engine refuses, and that is a failure."""
    if gpu_available(engine):
        pytest.skip("this host has a GPU and a GPU-capable engine")
    report = run_smoke(
        engine,
        ci_mini["ref"],
        smoke_stack,
        mounts={},
        gpu=True,
        report_path=tmp_path / "smoke.json",
        log=lambda line: None,
    )
    assert failed_names(report) == {CHECK_START}
    assert "gpu" in report.failed()[0].detail.lower()
    assert json.loads((tmp_path / "smoke.json").read_text())["passed"] is False
