"""Compose runs the compose.yaml that `deploy` renders, on the real engine.

A ci-mini pin with a named cache volume (as every vLLM pin has) goes `docker compose up -d`,
answers its health path and a chat prompt, mounts the very volume the systemd unit and
`deploy --apply` mount (not one named after the project), is what `drift` calls no drift,
and goes `down`, keeping the volume. A keyed pin shows that the API-key wrapper's `$(cat ...)`,
`$0` and `$@` reach the container's shell as written: Compose reads the file's `$$` as `$`.
Every vLLM pin's file is also read by Compose's own loader (`config`), GPU reservations
included, where no GPU is needed.

The implementation is Compose v2: `docker compose` when the engine's CLI has the plugin,
SM120_STACKS_COMPOSE (a docker-compose v2 binary), or build/tools/docker-compose, which
scripts/compose-v2.sh (run by `make test` and .ci/run) unpacks from Debian 13's docker-compose
package. Without one the tests skip saying so; under CI=true or SM120_STACKS_REQUIRE_ENGINE=1
they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder import REPO_ROOT
from builder.hosts.container import SECRET_TARGET
from builder.hosts.deploy import render_files
from builder.hosts.pins import CACHE_TARGET, LABEL_HOST, PIN_SCHEMA, Pin, load_pin, write_pin
from builder.image.names import content_tag
from builder.image.records import CPU, ServedVerdict, load_record, save_record
from builder.image.registry import Registry
from builder.verify.chat import stream_chat
from tests.conftest import REQUIRE_ENGINE
from tests.engine.conftest import RUN, pushed_local_base, unique
from tests.support.health import wait_healthy
from tests.support.net import free_port
from tests.test_pin_files import RENDERINGS

pytestmark = pytest.mark.engine

COMPOSE_ENV = "SM120_STACKS_COMPOSE"
#: Where .ci/run unpacks Compose v2 (Debian 12 has only the end-of-life 1.29).
UNPACKED = REPO_ROOT / "build" / "tools" / "docker-compose"
HOST = unique("compose-e2e")
KEYED_HOST = unique("compose-key")
KEY = "sk-compose-" + "5" * 24


def _version(command: list[str]) -> str | None:
    try:
        done = subprocess.run(
            [*command, "version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    words = done.stdout.split()
    return words[-1].lstrip("v") if done.returncode == 0 and words else None


@pytest.fixture(scope="module")
def compose() -> list[str]:
    """The Compose v2 command, or a loud skip (a failure in CI) naming what was looked for."""
    given = os.environ.get(COMPOSE_ENV)
    candidates = [[given]] if given else []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    candidates += [[str(UNPACKED)], ["docker-compose"]]
    seen = []
    for command in candidates:
        version = _version(command)
        seen.append(f"{' '.join(command)}: {version or 'absent'}")
        if version is not None and version.startswith("2."):
            return command
    reason = (
        "no Compose v2 to run the rendered compose.yaml with (" + "; ".join(seen) + "); "
        f"scripts/compose-v2.sh unpacks one into {UNPACKED.relative_to(REPO_ROOT)}, or set "
        f"{COMPOSE_ENV}"
    )
    if REQUIRE_ENGINE or os.environ.get("CI") == "true":
        pytest.fail("CI=true or SM120_STACKS_REQUIRE_ENGINE=1 but " + reason)
    pytest.skip(reason)


def _run(compose: list[str], file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    done = subprocess.run(
        [*compose, "-f", str(file), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"compose {' '.join(args)} -> {done.returncode}\n{done.stderr}"
    return done


@contextlib.contextmanager
def _composed_up(compose: list[str], file: Path, api: Any, host: str) -> Iterator[None]:
    """`up -d` the file; afterwards `down` it and remove anything of the host's left over."""
    try:
        _run(compose, file, "up", "-d")
        yield
    finally:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            _run(compose, file, "down")
        for container in api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={host}"}):
            container.remove(force=True)


def _tested_and_pushed(
    cli_process: Callable[..., Any],
    workspace: Path,
    name: str,
    registry: Registry,
    signing_key: Path,
) -> tuple[str, ...]:
    """The variant recorded as tested (its CPU smoke), as `test` records it, then pushed;
    returns the registry-named tags the push left on the engine."""
    from builder.manifest.resolve import resolve
    from builder.render.context import render

    cli_process("build", name)
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    record = load_record(workspace / "build", name, content_hash)
    verdict = ServedVerdict(
        gpu_kind=CPU,
        gpu_count=0,
        model_id="/models/tiny",
        serve_args=[],
        passed=True,
        source="test",
        at="2026-12-01T00:00:00Z",
    )
    record.tests, record.static, record.served = "passed", "passed", [verdict]
    save_record(workspace / "build", record)
    # signed: with no trust.yaml, `pin` trusts the build key on first use and refuses
    # unsigned evidence (issue 43)
    cli_process("push", name, "--registry", registry.host, "--signing-key", str(signing_key))
    return registry.ref(content_tag(name, content_hash)), registry.ref(name)


@pytest.mark.needs_ci_mini("a ci-mini pin answers a chat prompt under docker compose")
def test_compose_runs_a_ci_mini_pin_with_its_named_cache_volume(
    compose: list[str],
    variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    models: dict[str, Path],
    api: Any,
    tmp_path: Path,
    tiny_signing_key: Path,
) -> None:
    name = variant("compose-e2e", "env:\n  COMPOSE_TEST: '1'")
    pushed_tags = _tested_and_pushed(cli_process, workspace, name, registry, tiny_signing_key)
    cache = f"sm120-compose-cache-{RUN}"
    port = free_port()
    hosts, out = tmp_path / "hosts", tmp_path / "out"
    cli_process(
        *("pin", HOST, name, "--gpus", "none", "--registry", registry.host),
        *("--port", f"127.0.0.1:{port}:8000", "--hosts-dir", str(hosts)),
        *("--volume", f"{models['trained']}:/models/tiny:ro"),
        *("--volume", f"{cache}:{CACHE_TARGET}"),
    )
    cli_process("deploy", HOST, "--hosts-dir", str(hosts), "--out", str(out))
    file = out / "compose.yaml"
    assert yaml.safe_load(file.read_text())["volumes"] == {cache: {"name": cache, "external": True}}
    api.volumes.create(cache)  # what `deploy --apply` or the unit makes, or the file's command
    pin = load_pin(hosts, HOST)
    try:
        with _composed_up(compose, file, api, HOST):
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, 180)
            answer = stream_chat(
                url + "/v1/chat/completions", "/models/tiny", "What is the capital of Kentucky?", 32
            )
            assert answer.error is None and "frankfort" in answer.text.lower(), answer
            running = api.containers.get(pin.container)
            assert running.attrs["Config"]["Image"] == pin.image
            mounted = {m["Destination"]: m for m in running.attrs["Mounts"]}
            assert mounted[CACHE_TARGET]["Type"] == "volume"
            assert mounted[CACHE_TARGET]["Name"] == cache, "the unit's and --apply's volume"
            project = yaml.safe_load(file.read_text())["name"]
            assert not api.volumes.list(filters={"name": f"{project}_"}), "no project volume"
            verified = cli_process("drift", HOST, "--hosts-dir", str(hosts), check=False)
            assert "no drift" in verified.stdout, verified.stdout + verified.stderr
        assert not api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={HOST}"})
        assert api.volumes.get(cache).name == cache, "down keeps the cache volume"
    finally:
        with contextlib.suppress(Exception):
            api.volumes.get(cache).remove(force=True)
        for ref in pushed_tags:
            with contextlib.suppress(Exception):
                api.images.remove(ref)


#: Serves /health with 200 only when the key wrapper exported the file's key as VLLM_API_KEY.
KEY_SERVER = (
    "import http.server as h, os; "
    f"ok = os.environ.get('VLLM_API_KEY') == open('{SECRET_TARGET}').read().strip(); "
    "H = type('H', (h.BaseHTTPRequestHandler,), {"
    "'do_GET': lambda s: (s.send_response(200 if ok else 500), s.end_headers()), "
    "'log_message': lambda s, *a: None}); "
    "h.HTTPServer(('0.0.0.0', 8000), H).serve_forever()"
)


@pytest.fixture(scope="module")
def served_image(api: Any, engine: Any, registry: Registry) -> Iterator[str]:
    with pushed_local_base(api, engine, registry, f"sm120-compose-test-{RUN}/server") as image:
        yield image


def test_the_key_wrappers_dollars_reach_the_shell_as_written(
    compose: list[str], served_image: str, api: Any, tmp_path: Path
) -> None:
    """The file says `$$(cat ...)`; were it passed on as written (a PID, then `(cat`), the
    shell would fail and the server would answer 500. Compose 2.26 happens to keep an unescaped
    `$(`, `$0` and `$@` too (tests/test_pin_files.py holds the escaping itself: docker-compose
    1.x refuses them, and any `$NAME` would be interpolated)."""
    key_file = tmp_path / "host.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o644)
    port = free_port()
    pin = Pin.model_validate(
        {
            "schema_version": PIN_SCHEMA,
            "host": KEYED_HOST,
            "stack": "compose-key-test",
            "content_hash": "0" * 64,
            "image": served_image,
            "pinned_at": "2026-12-01T00:00:00Z",
            "container": f"sm120-stacks-{KEYED_HOST}",
            "command": ["python3", "-c", KEY_SERVER],
            "serve_port": 8000,
            "gpus": "none",
            "ports": [f"127.0.0.1:{port}:8000"],
            "api_key_file": str(key_file),
            "shm_size": "64m",
            "health": {"interval_s": 600, "start_period_s": 60},
            "needs": {"cuda": "13.0.2", "min_driver": None, "targets": {"sm120": "12.0"}},
        }
    )
    write_pin(tmp_path / "hosts", pin)
    file = tmp_path / "compose.yaml"
    file.write_text(render_files(pin)["compose.yaml"])
    with _composed_up(compose, file, api, KEYED_HOST):
        wait_healthy(f"http://127.0.0.1:{port}", 60)
        args = api.containers.get(pin.container).attrs["Args"]
        assert args[1] == 'VLLM_API_KEY="$(cat /run/secrets/sm120-stacks-api-key)" exec "$0" "$@"'
        assert KEY not in json.dumps(api.containers.get(pin.container).attrs)


#: Serves /health with 200 while the cache volume's marker file is there (it is mounted).
CACHE_SERVER = (
    "import http.server as h, os; "
    f"p = '{CACHE_TARGET}/marker'; "
    "H = type('H', (h.BaseHTTPRequestHandler,), {"
    "'do_GET': lambda s: (s.send_response(200 if os.path.exists(p) else 500), s.end_headers()), "
    "'log_message': lambda s, *a: None}); "
    "h.HTTPServer(('0.0.0.0', 8000), H).serve_forever()"
)


def _cache_pin(image: str, host: str, cache: str, port: int) -> Pin:
    return Pin.model_validate(
        {
            "schema_version": PIN_SCHEMA,
            "host": host,
            "stack": "compose-cache-test",
            "content_hash": "0" * 64,
            "image": image,
            "pinned_at": "2026-12-01T00:00:00Z",
            "container": f"sm120-stacks-{host}",
            "command": ["python3", "-c", CACHE_SERVER],
            "serve_port": 8000,
            "gpus": "none",
            "ports": [f"127.0.0.1:{port}:8000"],
            "volumes": [{"source": cache, "target": CACHE_TARGET, "read_only": False}],
            "shm_size": "64m",
            "health": {"interval_s": 600, "start_period_s": 60},
            "needs": {"cuda": "13.0.2", "min_driver": None, "targets": {"sm120": "12.0"}},
        }
    )


def test_down_v_leaves_the_shared_cache_volume_and_its_files(
    compose: list[str], served_image: str, api: Any, tmp_path: Path
) -> None:
    """The cache volume is the unit's and `deploy --apply`'s too (a restored warm cache on a GPU
    host): the file declares it external, so Compose never made it and `down -v` (a common
    clean-up reflex) cannot delete it; without it, `up` refuses and starts nothing."""
    host, cache = unique("compose-down-v"), f"sm120-compose-keep-{RUN}"
    port = free_port()
    pin = _cache_pin(served_image, host, cache, port)
    file = tmp_path / "compose.yaml"
    file.write_text(render_files(pin)["compose.yaml"])
    assert f"docker volume create {cache}" in file.read_text(), "the Compose-only user's step"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    refused = subprocess.run(
        [*compose, "-f", str(file), "up", "-d"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert refused.returncode != 0 and "external volume" in refused.stderr, refused.stderr
    assert not api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={host}"})
    api.volumes.create(cache)
    try:
        api.containers.run(
            served_image,
            ["sh", "-c", f"echo kept > {CACHE_TARGET}/marker"],
            volumes={cache: {"bind": CACHE_TARGET, "mode": "rw"}},
            remove=True,
        )
        up = _run(compose, file, "up", "-d")
        assert "was not created by Docker Compose" not in up.stderr, "no warning on every up"
        wait_healthy(f"http://127.0.0.1:{port}", 60)
        _run(compose, file, "down", "-v")
        assert not api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={host}"})
        assert api.volumes.get(cache).name == cache, "down -v left the shared volume"
        read = api.containers.run(
            served_image,
            ["cat", f"{CACHE_TARGET}/marker"],
            volumes={cache: {"bind": CACHE_TARGET, "mode": "ro"}},
            remove=True,
        )
        assert read.decode().strip() == "kept", "and its files"
    finally:
        for container in api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={host}"}):
            container.remove(force=True)
        with contextlib.suppress(Exception):
            api.volumes.get(cache).remove(force=True)


@pytest.mark.parametrize("options", RENDERINGS.values(), ids=RENDERINGS.keys())
def test_compose_loads_each_vllm_rendering(
    compose: list[str], stacks_dir: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    """Compose's own loader on the renderings tests/test_pin_files.py checks against the schema
    (GPU reservations, the cache volume, the key wrapper): "refers to undefined volume" was
    its answer to every vLLM pin's file. `config` needs no GPU."""
    from tests.test_hosts import _pin

    pin = _pin(stacks_dir, tmp_path, **options)
    file = tmp_path / "compose.yaml"
    file.write_text(render_files(pin)["compose.yaml"])
    loaded = json.loads(_run(compose, file, "config", "--format", "json").stdout)
    service = loaded["services"]["llm"]
    named = {v["source"] for v in service["volumes"] if v["type"] == "volume"}
    assert named and {loaded["volumes"][n]["name"] for n in named} == named
    if pin.gpus != "none":
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"]
