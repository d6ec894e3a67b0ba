"""The rendered systemd unit starts its pinned server from what is on disk: a reboot during a
registry outage, or a host cut off after deployment, still serves (docs/gpu-host.md, "No
network at start"). The unit's start commands run as systemd runs them (tests/support/
systemd_unit.py) against the real engine, with the pin's registry (a throwaway one of this
test's own on another loopback port; the shared one is never stopped) stopped first.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.hosts.deploy import render_files, unit_name
from builder.hosts.pins import LABEL_HOST, PIN_SCHEMA, Pin
from builder.image.registry import Registry
from tests.engine.conftest import RUN, pushed_local_base, unique
from tests.support.health import wait_healthy
from tests.support.net import free_port
from tests.support.systemd_unit import start_as_systemd_would

pytestmark = pytest.mark.engine

SERVER = (
    "import http.server as h; "
    "H = type('H', (h.BaseHTTPRequestHandler,), {"
    "'do_GET': lambda s: (s.send_response(200), s.end_headers()), "
    "'log_message': lambda s, *a: None}); "
    "h.HTTPServer(('0.0.0.0', 8000), H).serve_forever()"
)


@contextlib.contextmanager
def _throwaway_registry(folder: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Debian's docker-registry, plain HTTP (the engine trusts 127.0.0.0/8), on a free port."""
    if shutil.which("docker-registry") is None:
        pytest.skip("no docker-registry (scripts/host-setup.sh --registry installs it)")
    host = f"127.0.0.1:{free_port()}"
    (folder / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
        f"http:\n  addr: {host}\n"
    )
    log = folder / "registry.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["docker-registry", "serve", str(folder / "config.yml")], stdout=out, stderr=out
        )
    try:
        for _ in range(60):
            with contextlib.suppress(OSError, urllib.error.URLError):
                urllib.request.urlopen(f"http://{host}/v2/", timeout=2)
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the registry on {host} did not come up: {log.read_text()}")
        yield host, process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def test_a_pinned_server_starts_with_its_registry_stopped(
    api: Any, engine: Any, tmp_path: Path
) -> None:
    host = unique("unit-offline")
    port = free_port()
    with contextlib.ExitStack() as stack:
        registry_host, registry = stack.enter_context(_throwaway_registry(tmp_path))
        image = stack.enter_context(
            pushed_local_base(api, engine, Registry(registry_host), f"sm120-unit-{RUN}/server")
        )
        pin = Pin.model_validate(
            {
                "schema_version": PIN_SCHEMA,
                "host": host,
                "stack": "unit-offline-test",
                "content_hash": "0" * 64,
                "image": image,
                "pinned_at": "2026-12-01T00:00:00Z",
                "container": f"sm120-stacks-{host}",
                "command": ["python3", "-c", SERVER],
                "serve_port": 8000,
                "gpus": "none",
                "ports": [f"127.0.0.1:{port}:8000"],
                "shm_size": "64m",
                "health": {"interval_s": 600, "start_period_s": 60},
                "needs": {"cuda": "13.0.2", "min_driver": None, "targets": {"sm120": "12.0"}},
            }
        )
        registry.terminate()
        registry.wait(timeout=10)
        down = subprocess.run(["docker", "pull", image], capture_output=True, text=True)
        assert down.returncode != 0, "the registry is down: a plain pull fails"
        unit = render_files(pin)[unit_name(pin)]
        server = start_as_systemd_would(unit)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", 60)
            running = api.containers.get(pin.container)
            assert running.attrs["Config"]["Image"] == image
        finally:
            subprocess.run(["docker", "rm", "--force", pin.container], capture_output=True)
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=30)
            for left in api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={host}"}):
                left.remove(force=True)
