"""A smoke container left behind by a run the engine lost (restarted mid-test:
bench/results/faults/3-test-restarted.state.txt) is removed by the next smoke or check on the
host, and only that one: a live run's container, a running one of a label without this boot,
and another host's stay; a running one labelled with this boot and a dead pid goes.

Each case is a real container on the real engine with the owner label set by hand: a pid of a
process that has ended, of one that lives (a `sleep` started here), and a label naming another
host. The next smoke is a real `run_smoke` that the engine refuses at start (GPUs asked of an
engine without them), so nothing is served and it costs seconds.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.engine.docker_adapter import DockerEngine
from builder.engine.owner import OWNER_LABEL, boot_id, reap_orphans
from builder.manifest.resolve import resolve
from builder.verify.gpu_gate import gpu_available
from builder.verify.smoke import run_smoke
from builder.verify.smoke_report import CHECK_START
from tests.engine.conftest import unique

pytestmark = pytest.mark.engine


def ended_pid() -> int:
    """The pid of a process of this host that has ended (reaped, so not a zombie)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    process = subprocess.Popen(["sleep", "600"])
    yield process.pid
    process.kill()
    process.wait()


@pytest.fixture
def containers(api: Any, local_base: str) -> Iterator[Any]:
    """make(case, owner, running): a container of `case` with that owner label; all removed
    at the end by name, whatever the test did to them."""
    made: list[str] = []

    def make(case: str, owner: str, *, running: bool = False) -> Any:
        name = unique(f"sm120-orphan-{case}")
        made.append(name)
        with contextlib.suppress(Exception):
            api.containers.get(name).remove(force=True)
        container = api.containers.run(
            local_base,
            ["sleep", "infinity"] if running else ["true"],
            name=name,
            labels={"sm120-stacks.smoke": "ci-mini", OWNER_LABEL: owner},
            network_mode="none",
            detach=True,
        )
        if not running:
            container.wait(timeout=60)
        return container

    yield make
    for name in made:
        with contextlib.suppress(Exception):
            api.containers.get(name).remove(force=True)


def exists(api: Any, name: str) -> bool:
    return bool(api.containers.list(all=True, filters={"name": f"^/{name}$"}))


def test_an_exited_container_of_a_dead_run_is_removed_and_no_other(
    api: Any, engine: DockerEngine, containers: Any, live_pid: int
) -> None:
    here = socket.gethostname()
    dead = f"{here}:{ended_pid()}"
    orphan = containers("dead", dead)
    alive = containers("alive", f"{here}:{live_pid}")
    running = containers("running", dead, running=True)
    elsewhere = containers("elsewhere", f"another-host-{unique('h')}:{ended_pid()}")
    # Labelled as this run labels (host:pid@boot): running and dead, it goes too (a push
    # SIGKILLed mid-listing left one running: bench/results/kill-sweep/).
    running_now = containers("running-boot", f"{here}:{ended_pid()}@{boot_id()}", running=True)
    other_boot = containers("other-boot", f"{here}:{ended_pid()}@{'0' * 16}", running=True)
    said: list[str] = []
    removed = {o.name: o for o in reap_orphans(engine, said.append)}
    assert not exists(api, running_now.name)
    assert exists(api, other_boot.name), "a running container of another boot was removed"
    # Others' orphans on this engine may go too (a push SIGKILLed by the fault tests leaves
    # its listing container behind): that is the reaper's job. Ours must, the kept ones not.
    # Another run's reaper on this shared engine (every throwaway reaps first) may have been
    # quicker: then it is gone all the same.
    assert not exists(api, orphan.name)
    if orphan.name in removed:
        assert removed[orphan.name].owner == dead and removed[orphan.name].state == "exited"
        assert any(orphan.name in line and dead in line for line in said), said
    assert not {alive.name, running.name, elsewhere.name, other_boot.name} & set(removed)
    for kept in (alive, running, elsewhere, other_boot):
        assert exists(api, kept.name), f"{kept.name} was removed"
    assert len(said) == len(removed)


def test_the_next_smoke_removes_what_a_dead_run_left(
    api: Any,
    engine: DockerEngine,
    local_base: str,
    containers: Any,
    live_pid: int,
    workspace: Path,
    tmp_path: Path,
) -> None:
    if gpu_available(engine):
        pytest.skip("this host has a GPU: the smoke asked for one would really serve")
    here = socket.gethostname()
    orphan = containers("smoke-dead", f"{here}:{ended_pid()}")
    alive = containers("smoke-alive", f"{here}:{live_pid}")
    said: list[str] = []
    report = run_smoke(
        engine,
        local_base,
        resolve("ci-mini", workspace / "stacks"),
        mounts={},
        gpu=True,
        report_path=tmp_path / "smoke.json",
        log=said.append,
    )
    assert {c.name for c in report.failed()} == {CHECK_START}  # the engine has no GPUs
    assert not exists(api, orphan.name)  # by this smoke's reaper, or another run's first
    assert exists(api, alive.name)
