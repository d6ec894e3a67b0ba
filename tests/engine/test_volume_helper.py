"""No code of the pinned image runs to read or write its cache volume (issue 43), on the real
engine and registry.

The pinned image here is a planting one: its `sleep`, `sh`, `find` and `cat` each write
live/triton/planted.cubin into any volume mounted at /w before doing their job (an attack an
earlier helper, a container of the pinned image with entrypoint `sleep`, ran as root on the
volume: the file was then loaded by the signed server after a re-pin). Its evidence is signed
by a key trust.yaml names, so every command gets past its gate to the volume: `deploy --apply`
(its restore), `drift`, `doctor --host`, `cache list/prove/capture`. Each leaves live/ as the
server made it, with nothing planted: the volume is read and written by the tool's own helper
image (builder/warm/helper.py), never the pinned one.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.evidence.keys import generate_key_pair
from builder.hosts.pins import LABEL_HOST, Pin, write_pin
from builder.image.registry import Registry
from tests.engine.conftest import LOCAL_BASE, RUN, unique
from tests.engine.test_warm import server_pin
from tests.support.health import wait_healthy
from tests.support.net import free_port
from tests.support.signed_evidence import attach_evidence

pytestmark = pytest.mark.engine

PLANTED = "live/triton/planted.cubin"
#: What each wrapped program of the planting image runs before the real one.
PLANT = f'if [ -d /w ]; then mkdir -p /w/live/triton && echo "$0" > /w/{PLANTED}; fi\n'


@pytest.fixture(scope="module")
def planting_image(
    api: Any, engine: Any, registry: Registry, local_base: str, tmp_path_factory: Any
) -> Iterator[str]:
    """The local base with sleep, sh, find and cat wrapped to plant first, in the registry by
    digest (what a pin names), in a repository of this run's own."""
    context = tmp_path_factory.mktemp("planting")
    wrapped = {"/usr/bin/sleep": "/usr/bin/sleep.real", "/usr/bin/find": "/usr/bin/find.real"}
    wrapped |= {"/bin/cat": "/bin/cat.real", "/bin/sh": "/bin/dash"}
    steps = []
    for program, real in wrapped.items():
        name = Path(program).name
        (context / name).write_text(f'#!/bin/dash\n{PLANT}exec {real} "$@"\n')
        (context / name).chmod(0o755)  # COPY keeps it
        # /bin/sh is a link to dash, which stays (a COPY onto the link would write dash)
        steps.append(f"RUN rm {program}" if program == "/bin/sh" else f"RUN mv {program} {real}")
        steps.append(f"COPY {name} {program}")
    (context / "Dockerfile").write_text(f"FROM {LOCAL_BASE}\n" + "\n".join(steps) + "\n")
    repository = f"{registry.host}/sm120-helper-test-{RUN}/planting"
    api.images.build(path=str(context), tag=f"{repository}:1", rm=True)
    digest = engine.push(repository, "1")
    try:
        yield f"{repository}@{digest}"
    finally:
        with contextlib.suppress(Exception):
            api.images.remove(f"{repository}:1")


@pytest.fixture(scope="module")
def trusted(workspace: Path, planting_image: str) -> Iterator[None]:
    """The planting image's evidence signed by a key trust.yaml names for builds and warm
    caches on cpu: it passes every gate (removed afterwards: the hosts folder is the
    session's)."""
    folder = workspace / "hosts"
    keys = folder / f"helper-test-keys-{RUN}"
    if not (keys / "ops.key").exists():
        generate_key_pair(keys, "ops")
    attach_evidence(planting_image, "warm-test", "0" * 64, keys / "ops.key")
    document = {
        "version": 1,
        "keys": {"ops": f"{keys.name}/ops.pub"},
        "purposes": {"build": ["ops"], "warm": {"cpu": ["ops"]}},
    }
    (folder / "trust.yaml").write_text(json.dumps(document))  # JSON is YAML
    yield
    (folder / "trust.yaml").unlink(missing_ok=True)


@pytest.fixture
def planted_host(
    workspace: Path, planting_image: str, trusted: None, api: Any
) -> Iterator[tuple[Pin, int]]:
    port = free_port()
    host = unique("helper-planted")
    pin = server_pin(host, planting_image, port, "sm120-helper")
    write_pin(workspace / "hosts", pin)
    yield pin, port
    for container in api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={host}"}):
        container.remove(force=True)
    with contextlib.suppress(Exception):
        api.volumes.get(f"sm120-helper-{host}").remove(force=True)
    (workspace / "hosts" / f"{host}.yaml").unlink(missing_ok=True)


def _volume(api: Any, volume: str) -> list[str]:
    """Every file of the volume with its size and mtime, read by the local base (read-only)."""
    out = api.containers.run(
        LOCAL_BASE,
        ["find", "/w", "-type", "f", "-printf", "%P %s %T@\\n"],
        entrypoint=[],
        remove=True,
        volumes={volume: {"bind": "/w", "mode": "ro"}},
        network_mode="none",
    ).decode()
    return sorted(out.splitlines())


def _live(listing: list[str]) -> list[str]:
    return [line for line in listing if line.startswith("live/")]


def test_the_planting_image_plants_when_its_own_sleep_runs(api: Any, planting_image: str) -> None:
    """The attack is real: the helper of an earlier tool (this image, entrypoint `sleep`,
    the volume at /w) leaves the file behind."""
    volume = unique("helper-scratch")
    try:
        api.containers.run(
            planting_image,
            ["0"],
            entrypoint=["sleep"],
            remove=True,
            volumes={volume: {"bind": "/w", "mode": "rw"}},
            network_mode="none",
            user="0:0",
        )
        assert any(line.startswith(f"{PLANTED} ") for line in _volume(api, volume))
    finally:
        with contextlib.suppress(Exception):
            api.volumes.get(volume).remove(force=True)


def test_no_command_runs_the_pinned_image_on_its_cache_volume(
    planted_host: tuple[Pin, int], cli_process: Callable[..., Any], api: Any
) -> None:
    pin, port = planted_host
    volume = f"sm120-helper-{pin.host}"
    deployed = cli_process("deploy", pin.host, "--apply")  # its restore opens the volume
    assert "no warm cache in the registry for this image: a cold start" in deployed.stdout
    wait_healthy(f"http://127.0.0.1:{port}/health", 60)
    before = _volume(api, volume)
    assert _live(before) and not any(PLANTED in line for line in before), before

    drift = cli_process("drift", pin.host, check=False)
    assert "start: cold" in drift.stdout, drift.stdout + drift.stderr  # it read the volume
    doctor = cli_process("doctor", "--host", pin.host, check=False)
    assert f"cache volume {volume}: no damaged cache entry" in doctor.stdout, doctor.stdout
    listed = cli_process("cache", "list", pin.host)
    assert f"{pin.host}: key sha256:" in listed.stdout
    proved = cli_process("cache", "prove", pin.host, check=False)
    assert "cold: compiled since the start: triton 1" in proved.stdout, proved.stdout
    captured = cli_process("cache", "capture", pin.host)
    assert "captured 1 files" in captured.stdout, captured.stdout

    after = _volume(api, volume)
    assert not any(PLANTED in line for line in after), after
    assert _live(after) == _live(before)  # live/ as the server left it
    # Every helper of these commands ran the tool's image, none the pinned one.
    helpers = api.containers.list(all=True, filters={"ancestor": pin.image})
    assert [c.name for c in helpers] == [pin.container]
