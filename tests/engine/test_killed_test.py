"""A `test` SIGKILLed while its throwaway kernel-cache listing or device-code scan runs leaves a
container that the next run reaps (builder/engine/throwaway.py, engine/owner.py).

The killed process is a real one running `test`'s own code on the real engine: the device-code
scan (verify/device_code.scan_image) or the kernel-cache watch's listing before the smoke
(verify/kernel_watch ContainerWatch.before). Their image is the small local base with its
/opt/venv/bin/python made slow (it sleeps, then runs python3), so the container is still at
work when the tool dies. The test then waits for that container to end, checks it is still
there (the dead run could not remove it), and runs the next throwaway, which must remove it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from builder import REPO_ROOT
from builder.engine.docker_adapter import DockerEngine
from builder.engine.owner import OWNER_LABEL, STOPPED, boot_id, owned
from builder.engine.protocol import Container, ContainerSpec
from builder.engine.throwaway import ThrowawayFailed, run_throwaway
from builder.errors import EngineNotFound
from builder.manifest.resolve import resolve
from builder.render.context import VENV
from builder.verify.kernel_watch import container_watch
from tests.conftest import STACKS
from tests.engine.conftest import LOCAL_BASE, unique

pytestmark = pytest.mark.engine

#: Seconds the image's python waits before it runs: the window in which the tool is killed.
SLOW_S = 6

#: `test`'s two throwaways, each run as the killed process would run it.
CHILD = """
import sys
from pathlib import Path
from builder.engine.address import from_environment
from builder.engine.docker_adapter import connect_engine
from builder.manifest.resolve import resolve

kind, image, stacks = sys.argv[1], sys.argv[2], Path(sys.argv[3])
engine = connect_engine(from_environment())
if kind == "device-scan":
    from builder.verify.device_code import scan_image
    print(scan_image(engine, resolve("ci-mini", stacks), image))
else:
    from builder.verify.kernel_watch import container_watch
    watches = container_watch(engine, image, resolve("vllm-0.33-marlin", stacks))
    assert watches is not None, "vllm-0.33-marlin's FlashInfer has a known cache layout"
    watches.before()
"""


@pytest.fixture(scope="module")
def slow_python_image(api: Any) -> Iterator[str]:
    """The local base with a python at the image venv's path that starts SLOW_S late."""
    from docker.errors import ImageNotFound

    try:
        api.images.get(LOCAL_BASE)
    except ImageNotFound:
        subprocess.run([str(REPO_ROOT / "scripts" / "make-base-local.sh")], check=True)
    script = (
        f"mkdir -p {VENV}/bin && printf '#!/bin/sh\\nsleep {SLOW_S}\\nexec python3 \"$@\"\\n' "
        f"> {VENV}/bin/python && chmod +x {VENV}/bin/python"
    )
    tag = unique("slow-python")
    container = api.containers.run(LOCAL_BASE, ["sh", "-c", script], detach=True)
    try:
        assert container.wait(timeout=60)["StatusCode"] == 0, container.logs()
        container.commit(repository="sm120-stacks", tag=tag)
    finally:
        container.remove(force=True)
    yield f"sm120-stacks:{tag}"
    with contextlib.suppress(Exception):
        api.images.remove(f"sm120-stacks:{tag}", noprune=False)


def _owned_by(engine: DockerEngine, pid: int) -> list[Container]:
    """The containers the run with this pid labelled as its own (host:pid@boot)."""
    return engine.containers(label=f"{OWNER_LABEL}={socket.gethostname()}:{pid}@{boot_id()}")


def _until(what: str, found: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s} s")


@pytest.fixture
def killed_run(engine: DockerEngine, api: Any) -> Iterator[Callable[[str, str], int]]:
    """start(kind, image): the throwaway of `kind` started by a process that is SIGKILLed as
    soon as its container exists; that process's pid. What it left is removed at the end."""
    pids: list[int] = []

    def start(kind: str, image: str) -> int:
        stacks = REPO_ROOT / "stacks"
        argv = [sys.executable, "-c", CHILD, kind, image, str(stacks)]
        child = subprocess.Popen(argv, cwd=REPO_ROOT, env=dict(os.environ))
        pids.append(child.pid)
        try:
            _until(f"{kind}'s container", lambda: _owned_by(engine, child.pid), 60)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        return child.pid

    yield start
    for pid in pids:
        for left in _owned_by(engine, pid):
            with contextlib.suppress(Exception):
                api.containers.get(left.id).remove(force=True)


def _ended(container: Container) -> bool:
    """Stopped, or already removed (by another run's reaper on this shared engine)."""
    try:
        container.reload()
    except EngineNotFound:
        return True
    return container.attrs["State"]["Status"] in STOPPED


@pytest.mark.parametrize("kind", ["device-scan", "kernel-cache"])
def test_a_killed_tests_throwaway_is_reaped_by_the_next_run(
    kind: str, engine: DockerEngine, slow_python_image: str, killed_run: Any
) -> None:
    pid = killed_run(kind, slow_python_image)
    (left,) = _owned_by(engine, pid)  # the dead run could not remove it
    assert left.attrs["Config"]["Image"] == slow_python_image
    assert left.attrs["Config"]["Cmd"][0] == f"{VENV}/bin/python"  # the throwaway itself
    # Running, or only created when the kill fell between the engine's create and start: a
    # created one never starts, and is as much an orphan as an exited one.
    assert left.attrs["State"]["Status"] in {"created", "running", "exited"}
    _until("the orphan's end", lambda: _ended(left), SLOW_S + 60)
    # Still there once stopped (unless another run on this engine reaped it meanwhile): only
    # a reaper removes it now, and the next throwaway reaps first.
    orphaned = bool(_owned_by(engine, pid))
    said: list[str] = []
    run_throwaway(engine, slow_python_image, ["true"], timeout_s=60, log=said.append)
    assert _owned_by(engine, pid) == []
    if orphaned:
        assert any(left.name in line and f":{pid}" in line for line in said), said


def test_a_throwaway_says_its_status_its_output_and_its_result(
    engine: DockerEngine, slow_python_image: str
) -> None:
    script = "echo progress; echo '{\"rows\": 1}'; echo '{\"result\": 2}'; echo why >&2; exit 3"
    said: list[str] = []
    done = run_throwaway(engine, LOCAL_BASE, ["sh", "-c", script], timeout_s=60, log=said.append)
    assert (done.status, done.stderr) == (3, "why\n")
    assert done.last_json() == {"result": 2}  # the last JSON line, not the rows before it
    with pytest.raises(ThrowawayFailed, match="exit status 3: 'why"):
        done.checked()
    assert _owned_by(engine, os.getpid()) == []  # removed by its own run


def test_the_kernel_cache_watch_lists_the_smoke_container_through_its_own_exec(
    engine: DockerEngine, slow_python_image: str
) -> None:
    """The listing after the smoke runs in the running container itself (Container.exec): it
    finds the workspace that container's environment names, not the image's default."""
    watches = container_watch(engine, slow_python_image, resolve("vllm-0.33-marlin", STACKS))
    assert watches is not None
    workspace = f"/{unique('smoke-workspace')}"
    spec = ContainerSpec(
        image=slow_python_image,
        command=("sleep", "infinity"),
        environment={"FLASHINFER_WORKSPACE_BASE": workspace},
        network_mode="none",
    )
    container = engine.run(owned(spec))
    try:
        watches.after(container)
    finally:
        container.remove(force=True)
    for watch in watches.watches:
        assert watch.failures == [], watch.failures
        assert watch.after_listing is not None
        assert watch.after_listing.root.startswith(f"{workspace}/.cache/flashinfer")
