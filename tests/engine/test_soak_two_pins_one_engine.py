"""Two pins of one stack on one engine, deployed and serving at once, never share a cache
volume (issue 34 item 3): each server writes its own live/.

The pins are made by `make_pin` for a vLLM stack (so the cache volume is the one a user's pin
gets, `cache_volume_name(stack, host)`); only what a CPU machine cannot run is swapped: the
image (the local base, pushed), the command (a few lines of Python with a JIT cache's
behaviour), the GPUs (none) and the model folder (not mounted). Both `deploy --apply` run at
once (gated on health alone, --no-smoke: the stand-in answers no chat). Each server, at its
start, appends its container's hostname to a file in its TRITON_CACHE_DIR and writes its
"kernel" there when it is missing: on a shared volume the second server would find the
first's kernel and both names would be in one file.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from builder.hosts.pins import (
    CACHE_TARGET,
    LABEL_HOST,
    Pin,
    PinOptions,
    cache_volume_name,
    make_pin,
    write_pin,
)
from builder.image.records import Record, load_record, save_record
from builder.image.registry import Registry
from builder.manifest.resolve import resolve
from builder.render.context import render
from tests.engine.conftest import RUN, pushed_local_base, unique
from tests.support.health import wait_healthy
from tests.support.net import free_port
from tests.support.served import SERVED_GPU, served

pytestmark = pytest.mark.engine

#: A vLLM stack: its pin gets the named cache volume (a CPU stack's does not).
STACK = "vllm-0.22-marlin"
REPO = "registry.example.com/ml/sm120-stacks"

#: At start: note this container in writers.txt, "compile" the kernel when it is not there
#: (its bytes name the container that made it), then serve /health.
SERVER = (
    "import http.server as h, os, pathlib, time; "
    "d = pathlib.Path(os.environ['TRITON_CACHE_DIR']) / 'grp0'; "
    "d.mkdir(parents=True, exist_ok=True); k = d / 'kernel.cubin'; "
    "open(d / 'writers.txt', 'a').write(os.uname().nodename + '\\n'); "
    "k.exists() or (time.sleep(1), k.write_bytes(os.uname().nodename.encode())); "
    "H = type('H', (h.BaseHTTPRequestHandler,), {"
    "'do_GET': lambda s: (s.send_response(200), s.end_headers(), s.wfile.write(b'ok')), "
    "'log_message': lambda s, *a: None}); "
    "h.HTTPServer(('0.0.0.0', 8000), H).serve_forever()"
)


@pytest.fixture(scope="module")
def served_image(api: Any, engine: Any, registry: Registry) -> Iterator[str]:
    with pushed_local_base(api, engine, registry, f"sm120-two-pins-{RUN}/served") as image:
        yield image


@pytest.fixture
def trusted(served_image: str, workspace: Path, tiny_signing_key: Path) -> Iterator[None]:
    """The image's evidence signed by the session's build key, and trust.yaml naming that key:
    `deploy --apply` relies on signed evidence only (issue 43), and the two deploys here run at
    once, where two first uses would race to write trust.yaml (the second is refused). The
    conftest's fixture removes trust.yaml and the key afterwards."""
    from tests.support.signed_evidence import attach_evidence, write_trust

    stack = resolve(STACK, workspace / "stacks")
    attach_evidence(
        served_image, STACK, render(stack).content_hash(), tiny_signing_key, _verdicts()
    )
    write_trust(workspace / "hosts", tiny_signing_key, f"tiny-build-{RUN}", [SERVED_GPU, "cpu"])
    yield


def _verdicts() -> list[Any]:
    return [served(), served("cpu")]


def _pin(workspace: Path, host: str, image: str, port: int) -> Pin:
    """make_pin's pin of STACK for host, with what this machine cannot run swapped out."""
    stack = resolve(STACK, workspace / "stacks")
    content_hash = render(stack).content_hash()
    build = workspace / "build" / f"two-pins-{RUN}"
    digest = "sha256:" + "ab" * 32
    record = Record(
        stack=stack.name,
        content_hash=content_hash,
        static="passed",
        pushed={REPO: f"{REPO}@{digest}"},
        served=_verdicts(),
    )
    save_record(build, record)
    made = make_pin(
        host,
        stack,
        content_hash,
        load_record(build, STACK, content_hash),
        None,
        PinOptions(gpu_kind=SERVED_GPU),
        datetime(2026, 12, 2, tzinfo=UTC),
    )
    cache = [v for v in made.volumes if v.target == CACHE_TARGET]
    assert [v.source for v in cache] == [cache_volume_name(STACK, host)], made.volumes
    return made.model_copy(
        update={
            "image": image,
            "command": ["python3", "-c", SERVER],
            "gpus": "none",
            "ports": [f"127.0.0.1:{port}:8000"],
            "volumes": cache,  # the cache volume as make_pin named it; no model folder here
            "shm_size": "64m",
            "health": made.health.model_copy(update={"interval_s": 600, "start_period_s": 60}),
        }
    )


def _read(api: Any, image: str, volume: str, path: str) -> str:
    """A file of the volume's live/triton/grp0, read by the engine. A newline after it: the
    engine's log of a short-lived container can lose a last line that has none."""
    out = api.containers.run(
        image,
        ["sh", "-c", f"cat /w/live/triton/grp0/{path}; echo"],
        entrypoint=[],
        remove=True,
        volumes={volume: {"bind": "/w", "mode": "ro"}},
        network_mode="none",
    )
    return bytes(out).decode().strip()


@pytest.fixture
def two_pins(
    workspace: Path, served_image: str, api: Any, trusted: None
) -> Iterator[list[tuple[Pin, int]]]:
    pins = []
    for name in ("two-pins-a", "two-pins-b"):
        port = free_port()
        pinned = _pin(workspace, unique(name), served_image, port)
        write_pin(workspace / "hosts", pinned)
        pins.append((pinned, port))
    yield pins
    for pinned, _ in pins:
        for container in api.containers.list(
            all=True, filters={"label": f"{LABEL_HOST}={pinned.host}"}
        ):
            container.remove(force=True)
        with contextlib.suppress(Exception):
            api.volumes.get(cache_volume_name(STACK, pinned.host)).remove(force=True)
        (workspace / "hosts" / f"{pinned.host}.yaml").unlink(missing_ok=True)


def test_two_pins_of_one_stack_serving_at_once_write_their_own_live_folder(
    two_pins: list[tuple[Pin, int]], cli_process: Callable[..., Any], api: Any
) -> None:
    results: dict[str, Any] = {}

    def deploy(pinned: Pin) -> None:
        results[pinned.host] = cli_process(
            "deploy", pinned.host, "--apply", "--no-smoke", check=False
        )

    threads = [threading.Thread(target=deploy, args=(p,)) for p, _ in two_pins]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for pinned, port in two_pins:
        done = results[pinned.host]
        assert done.returncode == 0, done.stdout + done.stderr
        wait_healthy(f"http://127.0.0.1:{port}/health", 60)

    volumes = []
    for pinned, _ in two_pins:
        container = api.containers.get(pinned.container)
        assert container.status == "running"
        mounted = {m["Destination"]: m for m in container.attrs["Mounts"]}
        assert mounted[CACHE_TARGET]["Type"] == "volume"
        volume = mounted[CACHE_TARGET]["Name"]
        assert volume == cache_volume_name(STACK, pinned.host)
        volumes.append(volume)
        hostname = container.attrs["Config"]["Hostname"]
        # Only this server started on this volume, and the kernel in it is its own.
        assert _read(api, pinned.image, volume, "writers.txt").split() == [hostname]
        assert _read(api, pinned.image, volume, "kernel.cubin") == hostname
    assert volumes[0] != volumes[1], "two servers of one stack on one engine, one live/"
