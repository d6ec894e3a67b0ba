"""`deploy --all --apply` and `verify --all` on the local engine: two hosts (one naming the
engine's socket in its pin, one relying on the default), a roll that passes, a roll whose second
host fails its health gate and is put back on its previous pin, and drift across both.

The hosts serve a few lines of Python (`/health` and the pin's VERSION) from the small local
base image pushed to the registry, so the roll's logic runs against real containers in seconds;
the full proof with separate engines reached over ssh is `make bench-fleet`.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.hosts.pins import LABEL_HOST, PIN_SCHEMA, Pin, write_pin
from builder.image.registry import Registry
from tests.engine.conftest import RUN, pushed_local_base
from tests.support.net import free_port

pytestmark = pytest.mark.engine

HOSTS = ("fleet-a", "fleet-b")
STACK = "fleet-test"
#: One line (a pin's arguments hold no newline): /health answers 200, / the pin's VERSION.
SERVER = (
    "import http.server as h, os; "
    "H = type('H', (h.BaseHTTPRequestHandler,), {"
    "'do_GET': lambda s: (s.send_response(200 if s.path in ('/health', '/') else 404), "
    "s.end_headers(), s.wfile.write(os.environ.get('VERSION', '').encode())), "
    "'log_message': lambda s, *a: None}); "
    "h.HTTPServer(('0.0.0.0', 8000), H).serve_forever()"
)
CRASH = "import sys; sys.exit(3)"


@pytest.fixture(scope="module")
def served_image(
    api: Any, engine: Any, registry: Registry, tiny_signing_key: Path
) -> Iterator[str]:
    """The local base image in the registry, by digest (what a pin names), with evidence
    signed by the session's build key: `deploy --apply` relies on signed evidence only, and
    with no trust.yaml trusts its key on first use (issue 43). The repository is this run's
    own, so no earlier run's evidence (another key's) sits beside it."""
    from tests.support.signed_evidence import attach_evidence

    repository = f"sm120-fleet-test-{RUN}/server"
    with pushed_local_base(api, engine, registry, repository) as image:
        attach_evidence(image, STACK, "0" * 64, tiny_signing_key)
        yield image


@pytest.fixture
def fleet(
    workspace: Path, served_image: str, api: Any
) -> Iterator[Callable[[str, str, list[str], str | None], Pin]]:
    ports = {host: free_port() for host in HOSTS}
    hosts_dir = workspace / "hosts"

    def pin(host: str, version: str, command: list[str], engine: str | None) -> Pin:
        made = Pin.model_validate(
            {
                "schema_version": PIN_SCHEMA,
                "host": host,
                "stack": STACK,
                "content_hash": "0" * 64,
                "image": served_image,
                "pinned_at": "2026-11-30T00:00:00Z",
                "container": f"sm120-stacks-{host}",
                "command": command,
                "serve_port": 8000,
                "env": {"VERSION": version},
                "gpus": "none",
                "ports": [f"127.0.0.1:{ports[host]}:8000"],
                "shm_size": "64m",
                # The engine's own health check runs `python` (the stack images' venv), which
                # this image lacks: its first run is after the test.
                "health": {"interval_s": 600, "start_period_s": 60},
                "needs": {"cuda": "13.0.2", "min_driver": None, "targets": {"sm120": "12.0"}},
                "engine": engine,
            }
        )
        write_pin(hosts_dir, made)
        return made

    yield pin
    for host in HOSTS:
        for container in api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={host}"}):
            container.remove(force=True)
        (hosts_dir / f"{host}.yaml").unlink(missing_ok=True)
        (hosts_dir / "previous" / f"{host}.yaml").unlink(missing_ok=True)


def _answer(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
        return str(response.read().decode())


def _port(pin: Pin) -> int:
    return int(pin.ports[0].split(":")[1])


def test_a_roll_gates_each_host_and_rolls_back_the_first_that_fails(
    fleet: Callable[..., Pin], cli_process: Callable[..., Any]
) -> None:
    serve = ["python3", "-c", SERVER]
    a1 = fleet("fleet-a", "1", serve, "unix:///var/run/docker.sock")
    b1 = fleet("fleet-b", "1", serve, None)
    gate = ("--no-smoke", "--gate-timeout", "60", "--json")

    first = cli_process("deploy", "--all", "--apply", *gate, check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    assert [r["status"] for r in json.loads(first.stdout)] == ["ok", "ok"]
    assert _answer(_port(a1)) == "1" and _answer(_port(b1)) == "1"

    clean = cli_process("verify", "--all", check=False)
    assert clean.returncode == 0, clean.stdout
    assert "no drift on any host" in clean.stdout
    # One host at a time: on the engine its pin names.
    assert "nothing to do" in cli_process("deploy", "fleet-a", "--apply").stdout
    assert cli_process("verify", "fleet-a").stdout.strip().endswith("no drift")

    fleet("fleet-a", "2", serve, "unix:///var/run/docker.sock")
    fleet("fleet-b", "2", ["python3", "-c", CRASH], None)  # the failure, on the second host
    second = cli_process("deploy", "--all", "--apply", *gate, check=False)
    assert second.returncode == 1, second.stdout + second.stderr
    a, b = json.loads(second.stdout)
    assert (a["status"], b["status"]) == ("ok", "rolled back"), second.stdout
    assert "passes its gate" in b["rollback"], b
    assert _answer(_port(a1)) == "2", "the first host runs its new pin"
    assert _answer(_port(b1)) == "1", "the second host is back on its previous pin"

    drift = cli_process("verify", "--all", "--json", check=False)
    assert drift.returncode == 1
    reports = {r["host"]: r for r in json.loads(drift.stdout)}
    assert not reports["fleet-a"]["drifted"]
    names = {d["name"] for d in reports["fleet-b"]["drifts"]}
    assert {"command", "env"} <= names, reports["fleet-b"]
    table = cli_process("verify", "--all", check=False).stdout
    assert "1 of 2 host(s) drift" in table and "fleet-b: DRIFT env" in table


def test_one_host_is_gated_and_rolled_back_as_each_host_of_a_roll(
    fleet: Callable[..., Pin], cli_process: Callable[..., Any]
) -> None:
    """`deploy HOST --apply` is a roll of one: the same gate, the same rollback, the same JSON."""
    serve = ["python3", "-c", SERVER]
    b1 = fleet("fleet-b", "1", serve, None)
    first = cli_process("deploy", "fleet-b", "--apply", "--gate-timeout", "60", check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "/health answered 200" in first.stdout, first.stdout
    assert "no smoke: no manifest of fleet-test here" in first.stdout
    assert "deployed 1 host(s), every gate passed" in first.stdout

    fleet("fleet-b", "2", ["python3", "-c", CRASH], None)
    second = cli_process(
        "deploy", "fleet-b", "--apply", "--no-smoke", "--gate-timeout", "60", "--json", check=False
    )
    assert second.returncode == 1, second.stdout + second.stderr
    (b,) = json.loads(second.stdout)
    assert b["status"] == "rolled back" and "passes its gate" in b["rollback"], b
    assert _answer(_port(b1)) == "1", "back on its previous pin"


def test_a_pin_without_a_published_port_is_gated_on_its_state_alone(
    fleet: Callable[..., Pin], cli_process: Callable[..., Any], workspace: Path
) -> None:
    """No URL reaches the server: the gate says so and judges the container's state, at once,
    instead of waiting out the start period for an answer that cannot come."""
    pinned = fleet("fleet-a", "1", ["python3", "-c", SERVER], None)
    write_pin(workspace / "hosts", pinned.model_copy(update={"ports": []}))
    began = time.monotonic()
    done = cli_process("deploy", "fleet-a", "--apply", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "publishes no host port for its serve port 8000" in done.stdout
    assert "gated on the container's state alone" in done.stdout
    assert time.monotonic() - began < 30
