"""Lock files, host pins, deploy files, drift and host checks, without an engine.

Pins need a tested, pushed image; these tests write that fact with builder.image.records directly
(the `test` command that normally records it is exercised by the engine tests).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result

from builder.cli import doctor as cli_doctor
from builder.engine.docker_adapter import run_kwargs
from builder.engine.hostprobe import Gpu, HostFacts, Probe, gather
from builder.errors import StackError
from builder.hosts.deploy import container_spec, docker_run_args, render_files, systemd_quote
from builder.hosts.drift import (
    actual_config,
    compare_config,
    expected_config,
    image_drift,
    shm_bytes,
    state_drifts,
)
from builder.hosts.hostcheck import check, requirements_for
from builder.hosts.pins import Pin, PinOptions, load_pin, make_pin, pin_path, write_pin
from builder.image.records import Record, load_record, save_record
from builder.lock.inputs import lock_path, stale_reason
from builder.lock.lockfile import Lock, LockedBase
from builder.lock.reading import current_lock, read_lock
from builder.lock.uv_compile import parse_compiled
from builder.lock.writing import write_lock
from builder.manifest.resolve import ResolvedStack, resolve
from builder.render.context import render
from tests.support.locks import lock_of
from tests.support.served import SERVED_GPU, served
from tests.support.systemd_unit import start_commands

STACK = "vllm-0.22-marlin"  # no local wheels needed: resolves on any machine
DIGEST = "sha256:" + "ab" * 32
REPO = "registry.example.com/ml/sm120-stacks"
UV_OUTPUT = """\
filelock==4.3.1 \\
    --hash=sha256:4c5ee627c401f1863ac6a0de9a14a28d3bb5f8c730b45e2fd6e5dbc79cf34b9e \\
    --hash=sha256:79e43df8e9fe509cd83a3899a7c186c8077cbbe4d200a1ed3705c2f3bb6bc487
    # via torch
torch==2.11.0 \\
    --hash=sha256:6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b
Typing_Extensions[x]==4.16.0 \\
    --hash=sha256:13b2beaad985e05e2d6407ee4c4f35590b11f8d693a258a561055cac8f64cab7
"""


# --- helpers -----------------------------------------------------------------------------------


def _tested_and_pushed(build_dir: Path, stack: ResolvedStack, **record: Any) -> str:
    content_hash = render(stack).content_hash()
    fields: dict[str, Any] = {
        "static": "passed",
        "pushed": {REPO: f"{REPO}@{DIGEST}"},
        "served": [served(), served("cpu")],  # its GPU kind, and on CPU (--gpus none)
    }
    fields.update(record)
    save_record(build_dir, Record(stack=stack.name, content_hash=content_hash, **fields))
    return content_hash


def _pin(stacks_dir: Path, tmp_path: Path, host: str = "gpu-node-07", **options: Any) -> Pin:
    stack = resolve(STACK, stacks_dir)
    content_hash = _tested_and_pushed(tmp_path / "build", stack)
    from builder.image.records import load_record

    record = load_record(tmp_path / "build", STACK, content_hash)
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    options.setdefault("gpu_kind", SERVED_GPU)
    return make_pin(host, stack, content_hash, record, None, PinOptions(**options), when)


def _lock_for(stack: ResolvedStack) -> Lock:
    base = LockedBase(image="nvidia/cuda:13.0.2-devel-ubuntu24.04", digest=DIGEST, note="test")
    return lock_of(
        stack,
        parse_compiled(UV_OUTPUT),
        heavy=("torch", "filelock"),
        base=base,
        resolver="uv test",
    )


def _container(**changes: Any) -> dict[str, Any]:
    """`docker inspect` of a container that runs the pin of _pin() exactly."""
    attrs: dict[str, Any] = {
        "Image": "sha256:" + "cd" * 32,
        "RestartCount": 0,
        "State": {"Status": "running", "Restarting": False, "Health": {"Status": "healthy"}},
        "Config": {
            "Cmd": ["vllm", "serve", "x"],
            "Entrypoint": None,
            "Env": ["PATH=/opt/venv/bin:/usr/bin", "HF_HOME=/models/hf"],
        },
        "HostConfig": {
            "DeviceRequests": [{"Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]]}],
            "PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8000"}]},
            "ShmSize": 16 * 1024**3,
        },
        "Mounts": [
            {"Type": "bind", "Source": "/srv/models", "Destination": "/models", "RW": True},
            {"Type": "volume", "Name": "f" * 64, "Destination": "/data", "RW": True},
        ],
    }
    attrs.update(changes)
    return attrs


# --- locks -------------------------------------------------------------------------------------


def test_parse_compiled_keeps_versions_and_hashes_and_normalizes_names() -> None:
    packages = parse_compiled(UV_OUTPUT)
    assert list(packages) == ["filelock", "torch", "typing-extensions"]
    assert packages["filelock"].version == "4.3.1"
    assert len(packages["filelock"].hashes) == 2
    assert packages["torch"].hashes == [
        "sha256:6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b"
    ]


def test_parse_compiled_refuses_a_package_without_hash() -> None:
    with pytest.raises(StackError, match="no hash for torch"):
        parse_compiled("torch==2.11.0\n")


def test_lock_round_trip_and_render_installs_from_it(stacks_dir: Path) -> None:
    stack = resolve(STACK, stacks_dir)
    plain = render(stack)
    write_lock(lock_path(stack), _lock_for(stack))
    assert lock_path(stack) == stacks_dir / f"{STACK}.lock"
    lock = read_lock(lock_path(stack))
    assert stale_reason(stack, lock) is None
    locked = render(stack)
    assert locked.lock == lock  # what `test` then judges the image by
    dockerfile = locked.dockerfile
    assert f"FROM nvidia/cuda:13.0.2-devel-ubuntu24.04@{DIGEST} AS toolchain" in dockerfile
    assert "--require-hashes --no-deps -r /opt/sm120-stacks/requirements/lock-heavy.txt" in (
        dockerfile
    )
    # A lock of no ancestor's: its own set is the packages stage's one install.
    assert (
        "--require-hashes --no-deps -r /opt/sm120-stacks/requirements/lock-base.txt" in dockerfile
    )
    assert locked.files["requirements/lock-base.txt"] == locked.files["requirements/lock.txt"]
    heavy = locked.files["requirements/lock-heavy.txt"][0].decode()
    assert "torch==2.11.0 \\\n    --hash=sha256:6746" in heavy
    assert "typing-extensions" not in heavy
    assert "typing-extensions==4.16.0" in locked.files["requirements/lock.txt"][0].decode()
    assert locked.content_hash() != plain.content_hash()


def test_a_lock_that_no_longer_matches_is_refused_and_reported(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    stack = resolve(STACK, stacks_dir)
    write_lock(lock_path(stack), _lock_for(stack))
    assert run_cli("check", STACK, stacks_dir=stacks_dir).exit_code == 0
    path = stacks_dir / f"{STACK}.yaml"
    path.write_text(path.read_text().replace("vllm: 0.22.1", "vllm: 0.22.2"))
    changed = resolve(STACK, stacks_dir)
    reason = stale_reason(changed, read_lock(lock_path(changed)))
    assert reason is not None and "python.packages.vllm.version" in reason
    assert '"0.22.1" -> "0.22.2"' in reason
    with pytest.raises(StackError) as caught:
        current_lock(changed)
    assert caught.value.file == lock_path(changed) and caught.value.key == "inputs_hash"
    result = run_cli("check", STACK, stacks_dir=stacks_dir)
    assert result.exit_code == 2
    assert f"{STACK}.lock: inputs_hash: lock no longer matches" in result.output
    assert f"sm120-stacks lock {STACK}" in result.output
    rendered = run_cli("render", STACK, "--stdout", stacks_dir=stacks_dir)
    assert rendered.exit_code == 2 and "Traceback" not in rendered.output


def test_a_malformed_versions_from_lock_exits_2_naming_it(
    stacks_dir: Path, run_cli: Callable[..., Result], tmp_path: Path
) -> None:
    bad = tmp_path / "flagship.lock"
    bad.write_text("schema_version: 1\nstack: flagship\npython: {packages: []}\n")
    committed = (stacks_dir / f"{STACK}.lock").read_bytes()
    result = run_cli("lock", STACK, "--versions-from", str(bad), stacks_dir=stacks_dir)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert str(bad) in result.output
    assert (stacks_dir / f"{STACK}.lock").read_bytes() == committed, "the lock is untouched"


def test_serve_changes_need_no_new_lock(stacks_dir: Path) -> None:
    stack = resolve(STACK, stacks_dir)
    write_lock(lock_path(stack), _lock_for(stack))
    path = stacks_dir / f"{STACK}.yaml"
    path.write_text(path.read_text().replace("max_model_len: 32768", "max_model_len: 8192"))
    changed = resolve(STACK, stacks_dir)
    assert current_lock(changed) is not None


def test_a_malformed_lock_names_file_and_key(stacks_dir: Path) -> None:
    stack = resolve(STACK, stacks_dir)
    write_lock(lock_path(stack), _lock_for(stack))
    text = lock_path(stack).read_text().replace("version: 4.3.1", "version: [4]", 1)
    lock_path(stack).write_text(text)
    with pytest.raises(StackError) as caught:
        render(stack)
    assert caught.value.file == lock_path(stack)
    assert caught.value.key == "python.heavy.filelock.version"
    assert caught.value.line is not None


# --- pins --------------------------------------------------------------------------------------


def test_pin_round_trips_through_its_file(stacks_dir: Path, tmp_path: Path) -> None:
    pin = _pin(stacks_dir, tmp_path, gpus="0,1", env=("EXTRA=1",), volumes=("/srv/m:/models:ro",))
    hosts = tmp_path / "hosts"
    path = write_pin(hosts, pin)
    assert path == hosts / "gpu-node-07.yaml"
    assert load_pin(hosts, "gpu-node-07") == pin
    data = yaml.safe_load(path.read_text())
    assert data["image"] == f"{REPO}@{DIGEST}"
    assert data["command"][:2] == ["vllm", "serve"]
    assert data["env"]["EXTRA"] == "1" and data["env"]["HF_HOME"] == "/models/hf"
    assert data["gpus"] == [0, 1]
    assert data["ports"] == ["127.0.0.1:8000:8000"]  # loopback unless asked
    assert data["volumes"] == [{"source": "/srv/m", "target": "/models", "read_only": True}]
    assert data["needs"]["min_driver"] == "580.65.06"
    assert data["needs"]["targets"] == {"sm120": "12.0"}
    assert data["serve_port"] == 8000
    assert data["pinned_at"] == "2026-01-02T03:04:05Z"
    assert [p.name for p in hosts.iterdir()] == ["gpu-node-07.yaml"]  # no temporary left


def test_pins_of_different_hosts_are_different_files(stacks_dir: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    write_pin(hosts, _pin(stacks_dir, tmp_path, host="a"))
    write_pin(hosts, _pin(stacks_dir, tmp_path, host="b"))
    assert sorted(p.name for p in hosts.iterdir()) == ["a.yaml", "b.yaml"]
    assert load_pin(hosts, "a").container != load_pin(hosts, "b").container


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"static": None}, "have not been run; only an image whose static checks passed"),
        ({"static": "failed"}, "have failed"),
        ({"pushed": {}}, "was never pushed"),
        ({"pushed": {"a/x": "a/x@" + DIGEST, "b/x": "b/x@" + DIGEST}}, "several registries"),
    ],
)
def test_pin_refuses_untested_or_unpushed_images(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    record: dict[str, Any],
    message: str,
) -> None:
    _tested_and_pushed(tmp_path / "build", resolve(STACK, stacks_dir), **record)
    result = run_cli("pin", "gpu-node-07", STACK, stacks_dir=stacks_dir)
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "hosts").exists()


def test_pin_and_deploy_through_the_cli(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    _tested_and_pushed(tmp_path / "build", resolve(STACK, stacks_dir))
    result = run_cli(
        "pin", "gpu-node-07", STACK, "--port", "127.0.0.1:9000:8000", stacks_dir=stacks_dir
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hosts" / "gpu-node-07.yaml").is_file()
    result = run_cli("deploy", "gpu-node-07", stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    out = tmp_path / "build" / "hosts" / "gpu-node-07"
    assert sorted(p.name for p in out.iterdir()) == [
        "compose.yaml",
        "sm120-stacks-gpu-node-07.service",
    ]


def test_a_pin_of_an_image_whose_gpu_smoke_was_skipped_needs_allow_unserved(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    """Static checks pass on a machine without the GPU; no served verdict: the pin is refused,
    and with --allow-unserved it goes through, says so and records it; `list` shows it."""
    skipped = "no NVIDIA GPU on this host (/dev/nvidia0 is missing)"
    _tested_and_pushed(tmp_path / "build", resolve(STACK, stacks_dir), unserved=skipped, served=[])
    refused = run_cli("pin", "gpu-node-07", STACK, stacks_dir=stacks_dir)
    assert refused.exit_code == 2 and "no passing served verdict on" in refused.output
    assert SERVED_GPU in refused.output and "only its static checks passed" in refused.output
    result = run_cli("pin", "gpu-node-07", STACK, "--allow-unserved", stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    assert "--allow-unserved" in result.output and "--require-gpu" in result.output
    assert "allow_unserved: true" in (stacks_dir.parent / "hosts" / "gpu-node-07.yaml").read_text()
    listed = run_cli("list", stacks_dir=stacks_dir).output
    assert "skipped" in listed


@pytest.mark.parametrize(
    ("stack", "served_on", "message"),
    [
        (STACK, SERVED_GPU, f"no passing served verdict on {SERVED_GPU}: its smoke there failed"),
        ("cpu-smoke", "cpu", "the smoke of sm120-stacks:cpu-smoke-"),
    ],
)
def test_a_failed_smoke_lets_push_through_but_not_pin(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    stack: str,
    served_on: str,
    message: str,
) -> None:
    """Push needs the static checks only (a failed smoke is a served failure, pushed with the
    evidence); a pin needs a passing served verdict on the host's kind, on CPU for a CPU stack."""
    from builder.image.records import require_tested

    (stacks_dir / "cpu-smoke.yaml").write_text(f"extends: {STACK}\nsmoke:\n  needs_gpu: false\n")
    build = tmp_path / "build"
    content_hash = _tested_and_pushed(
        build, resolve(stack, stacks_dir), served=[served(served_on, passed=False)]
    )
    record = load_record(build, stack, content_hash)
    require_tested(record, stack, "refusing to push", hint="")  # push's gate: it goes through
    result = run_cli("pin", "gpu-node-07", stack, stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "hosts").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pin", "Bad_Host", STACK), "'Bad_Host' is not a host name"),
        (  # issue 43: its pin would be the hosts folder's trust policy
            ("pin", "trust", STACK),
            "HOST: 'trust' cannot be a host name here: its pin would be trust.yaml, the hosts' "
            "trust policy",
        ),
        (("deploy", "trust", "--apply"), "'trust' cannot be a host name here"),
        (("drift", "trust"), "'trust' cannot be a host name here"),
        (("pin", "h", STACK, "--gpus", "x"), "--gpus: --gpus 'x'"),
        (("pin", "h", STACK, "--volume", "nocolon"), "--volume: --volume 'nocolon'"),
        (("pin", "h", STACK, "--env", "A=$B"), "env.A: String should match pattern"),
        (("pin", "h", STACK, "--port", "80"), "ports.0: String should match pattern"),
        (("verify", "nowhere"), "HOST: no pin for host 'nowhere'"),
        (("deploy", "nowhere"), "pin it first: sm120-stacks pin nowhere STACK"),
        (("doctor", "--host", "nowhere"), "no pin for host 'nowhere'"),
    ],
)
def test_bad_host_input_exits_2(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    args: tuple[str, ...],
    message: str,
) -> None:
    _tested_and_pushed(tmp_path / "build", resolve(STACK, stacks_dir))
    result = run_cli(*args, stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("edit", "key", "message"),
    [
        (("gpus: all", "gpus: some"), "gpus", "Input should be 'all' or 'none'"),
        (("shm_size: 16g", "shm_size: lots"), "shm_size", "String should match pattern"),
        (("restart: unless-stopped", "restrat: always"), "restrat", "unknown key"),
        (("host: gpu-node-07", "host: other"), "host", "pins host 'other'"),
        (("image: ", "image: [x"), None, "YAML syntax error"),
    ],
)
def test_a_malformed_pin_names_file_key_and_line(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    edit: tuple[str, str],
    key: str | None,
    message: str,
) -> None:
    path = write_pin(tmp_path / "hosts", _pin(stacks_dir, tmp_path))
    assert edit[0] in path.read_text()
    path.write_text(path.read_text().replace(*edit))
    with pytest.raises(StackError) as caught:
        load_pin(tmp_path / "hosts", "gpu-node-07")
    assert caught.value.file == path and caught.value.key == key
    assert caught.value.line is not None
    assert message in str(caught.value)
    result = run_cli("verify", "gpu-node-07", stacks_dir=stacks_dir)
    assert result.exit_code == 2
    assert f"gpu-node-07.yaml:{caught.value.line}: " in result.output


def test_pin_path_refuses_path_tricks(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="not a host name"):
        pin_path(tmp_path, "../etc/passwd")


# --- deploy files ------------------------------------------------------------------------------


def test_compose_runs_exactly_the_pinned_digest(stacks_dir: Path, tmp_path: Path) -> None:
    pin = _pin(stacks_dir, tmp_path, gpus="1", volumes=("/srv/m:/models:ro",))
    compose = yaml.safe_load(render_files(pin)["compose.yaml"])
    service = compose["services"]["llm"]
    assert service["image"] == f"{REPO}@{DIGEST}"
    assert service["command"] == pin.command
    assert service["environment"] == pin.env
    assert service["shm_size"] == "16g"
    assert service["restart"] == "unless-stopped"
    assert service["ports"] == ["127.0.0.1:8000:8000"]
    assert service["volumes"] == [
        {"type": "bind", "source": "/srv/m", "target": "/models", "read_only": True}
    ]
    device = service["deploy"]["resources"]["reservations"]["devices"][0]
    assert device == {"driver": "nvidia", "capabilities": ["gpu"], "device_ids": ["1"]}
    health = service["healthcheck"]
    assert health["test"][:3] == ["CMD", "python", "-c"]
    assert "http://127.0.0.1:8000/health" in health["test"][3]
    assert health["start_period"] == "900s"


def test_systemd_unit_runs_the_same_container(stacks_dir: Path, tmp_path: Path) -> None:
    pin = _pin(stacks_dir, tmp_path, env=("PRICE=100%",))
    unit = render_files(pin)["sm120-stacks-gpu-node-07.service"]
    assert "Restart=always" in unit
    (pull,) = [c for c in start_commands(unit) if c.key == "ExecStartPre" and "pull" in str(c.argv)]
    assert pull.failure_ignored, "a registry the host does not need never fails the start"
    assert pull.argv[:2] == ["/bin/sh", "-c"]
    assert pull.argv[2] == (
        f"/usr/bin/docker image inspect --format . {REPO}@{DIGEST} >/dev/null 2>&1 "
        f"|| exec /usr/bin/docker pull {REPO}@{DIGEST}"
    )
    exec_start = unit.split("ExecStart=", 1)[1].split("\nExecStop=", 1)[0]
    words = shlex.split(exec_start.replace("\\\n", " ").replace("$$", "$").replace("%%", "%"))
    assert words == ["/usr/bin/docker", *docker_run_args(pin)]
    assert words[words.index("--gpus") + 1] == "all"
    assert words[words.index("--shm-size") + 1] == "16g"
    assert "--env" in words and "PRICE=100%" in words
    assert words[-len(pin.command) - 1 :] == [pin.image, *pin.command]
    assert systemd_quote('a"b$c%d\\') == '"a\\"b$$c%%d\\\\"'


def test_sdk_arguments_match_the_pin(stacks_dir: Path, tmp_path: Path) -> None:
    pin = _pin(stacks_dir, tmp_path, ports=("127.0.0.1:9000:8000",), gpus="none")
    kwargs = run_kwargs(container_spec(pin))
    assert kwargs["image"] == pin.image and kwargs["command"] == pin.command
    assert kwargs["ports"] == {"8000/tcp": ("127.0.0.1", 9000)}
    assert kwargs["restart_policy"] == {"Name": "unless-stopped"}
    assert "device_requests" not in kwargs
    assert kwargs["healthcheck"]["start_period"] == 900 * 10**9
    gpu_pin = _pin(stacks_dir, tmp_path, gpus="0,1", volumes=("/srv/m:/models:ro", "hf:/hf"))
    gpu_kwargs = run_kwargs(container_spec(gpu_pin))
    [request] = gpu_kwargs["device_requests"]
    assert (request["Count"], request["DeviceIDs"]) == (0, ["0", "1"])
    assert [(m["Type"], m["Source"], m["ReadOnly"]) for m in gpu_kwargs["mounts"]] == [
        ("bind", "/srv/m", True),
        ("volume", "hf", False),
    ]


# --- drift -------------------------------------------------------------------------------------


def _expected(pin: Pin) -> dict[str, Any]:
    return expected_config(pin, {"Env": ["PATH=/opt/venv/bin:/usr/bin"], "Entrypoint": None})


def test_a_container_that_matches_its_pin_has_no_drift(stacks_dir: Path, tmp_path: Path) -> None:
    pin = _pin(stacks_dir, tmp_path, volumes=("/srv/models:/models",))
    attrs = _container()
    attrs["Config"]["Cmd"] = list(pin.command)
    attrs["Config"]["Env"] = ["PATH=/opt/venv/bin:/usr/bin"] + [
        f"{k}={v}" for k, v in pin.env.items()
    ]
    assert compare_config(_expected(pin), actual_config(attrs)) == []
    assert state_drifts(attrs) == []
    assert image_drift(pin, {"RepoDigests": [pin.image, "other@" + DIGEST]}) == []


def test_each_config_drift_is_named(stacks_dir: Path, tmp_path: Path) -> None:
    pin = _pin(stacks_dir, tmp_path, volumes=("/srv/models:/models",))
    attrs = _container(
        HostConfig={
            "DeviceRequests": [{"Count": 0, "DeviceIDs": ["0"], "Capabilities": [["gpu"]]}],
            "PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8001"}]},
            "ShmSize": 64 * 1024**2,
        },
        Mounts=[{"Type": "bind", "Source": "/tmp/x", "Destination": "/models", "RW": False}],
    )
    attrs["Config"]["Env"] += ["FOO=bar"]
    attrs["Config"]["Env"].remove("HF_HOME=/models/hf")
    drifts = {d.name: d.detail for d in compare_config(_expected(pin), actual_config(attrs))}
    assert set(drifts) == {"command", "env", "gpus", "mounts", "ports", "shm_size"}
    assert "FOO='bar' is set but not pinned" in drifts["env"]
    assert "HF_HOME is not set (pinned '/models/hf')" in drifts["env"]
    assert drifts["gpus"] == "runs with 0, pinned all"
    assert "127.0.0.1:8001->8000/tcp" in drifts["ports"]
    assert drifts["shm_size"] == f"runs with {64 * 1024**2}, pinned {16 * 1024**3}"


def test_image_drift_uses_registry_digests_not_the_image_id(
    stacks_dir: Path, tmp_path: Path
) -> None:
    pin = _pin(stacks_dir, tmp_path)
    other = {"Id": pin.image.split("@")[1], "RepoDigests": [], "Config": {"Labels": {}}}
    (drift,) = image_drift(pin, other)
    assert drift.name == "image" and "no registry digest" in drift.detail
    moved = {"RepoDigests": [f"{REPO}@sha256:{'0' * 64}"], "Config": {"Labels": {}}}
    assert image_drift(pin, moved)[0].detail.startswith(f"runs {REPO}@sha256:0000")


def test_state_drifts_stopped_restarting_unhealthy() -> None:
    stopped = state_drifts(_container(State={"Status": "exited", "ExitCode": 137}))
    assert [(d.name, d.detail) for d in stopped] == [("state", "exited (exit code 137)")]
    looping = state_drifts(
        _container(RestartCount=4, State={"Status": "restarting", "Restarting": True})
    )
    assert [d.name for d in looping] == ["state", "restarts"]
    assert "restarted 4 times" in looping[1].detail
    sick = {"Status": "running", "Health": {"Status": "unhealthy", "Log": [{"Output": "refused"}]}}
    assert state_drifts(_container(State=sick))[0].detail == "unhealthy: refused"


def test_shm_sizes_parse_like_docker() -> None:
    assert shm_bytes("1g") == 1024**3
    assert shm_bytes("512m") == 512 * 1024**2
    assert shm_bytes("64") == 64


# --- host checks -------------------------------------------------------------------------------


def _probe(out: str | None, status: int = 0) -> Probe:
    def run(argv: Sequence[str]) -> tuple[int, str]:
        assert argv[0] == "nvidia-smi"
        return status, out or ""

    return Probe(
        run=run,
        which=lambda name: "/usr/bin/nvidia-smi"
        if out is not None and name == "nvidia-smi"
        else None,
        cdi_dirs=(),
    )


def _by_name(facts: HostFacts, gpus: Sequence[str] = ("sm120",)) -> dict[str, Any]:
    needs = requirements_for(list(gpus), "580.65.06")
    return {f.name: f for f in check(facts, needs)}


def test_host_without_a_gpu_says_so() -> None:
    facts = gather(None, "no socket", _probe(None))
    found = _by_name(facts)
    assert not found["gpu"].ok and "this machine has no NVIDIA GPU" in found["gpu"].detail
    assert not found["driver"].ok and ">= 580.65.06" in found["driver"].fix
    assert not found["runtime"].ok and "nvidia-container-toolkit" in found["runtime"].fix
    assert not found["engine"].ok and "no socket" in found["engine"].detail


def test_old_driver_and_wrong_gpu_are_found() -> None:
    facts = gather(None, None, _probe("0, 00000000:41:00.0, 570.86.15, 9.0, NVIDIA H200\n"))
    assert facts.gpus == (Gpu(0, "NVIDIA H200", "9.0", "0000:41:00.0"),)
    found = _by_name(facts)
    assert "570.86.15 is older than 580.65.06" in found["driver"].detail
    assert "GPU 0 (NVIDIA H200) is compute 9.0; the stack targets 12.0 (sm120)" in (
        found["gpu"].detail
    )


def test_a_matching_host_passes() -> None:
    facts = gather(
        None, None, _probe("0, 00000000:01:00.0, 580.95.05, 12.0, NVIDIA RTX PRO 6000\n")
    )
    facts = HostFacts(facts.driver, facts.gpus, None, ("runtime nvidia",), None)
    assert all(f.ok for f in check(facts, requirements_for(["sm120"], "580.65.06")))
    assert not check(facts, requirements_for(["sm120"], None), selected=[3])[2].ok


def test_doctor_cli_reports_each_failure_with_its_fix(
    run_cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        cli_doctor,
        "gather",
        lambda api, why, probe=None: gather(None, "no engine here", _probe(None)),
    )
    result = run_cli("doctor", "--stack", STACK)
    assert result.exit_code == 1
    assert "FAIL  gpu: this machine has no NVIDIA GPU" in result.output
    assert "fix: install the NVIDIA driver >= 580.65.06" in result.output
    rows = json.loads(run_cli("doctor", "--json").output)
    assert {r["name"]: r["ok"] for r in rows}["gpu"] is False


def test_a_site_substitution_keeps_the_lock_and_wins_over_its_digest(stacks_dir: Path) -> None:
    from builder.manifest.substitute import Substitutions

    stack = resolve(STACK, stacks_dir)
    write_lock(lock_path(stack), _lock_for(stack))
    rule = "nvidia/cuda:13.0.2-devel-ubuntu24.04=local/cuda:13.0.2-devel-bookworm"
    mirrored = resolve(STACK, stacks_dir, Substitutions.parse([rule]))
    assert current_lock(mirrored) is not None  # the lock pins the manifest's bases
    dockerfile = render(mirrored).dockerfile
    assert "FROM local/cuda:13.0.2-devel-bookworm AS toolchain" in dockerfile
    assert "--require-hashes" in dockerfile


def test_real_h200_output_passes_the_driver_and_fails_the_sm120_target() -> None:
    """nvidia-smi's answer on the H200 the device machine has: the two queries captured there
    (tests/fixtures/topology/h200-2x-nvlink), joined in the one query's columns."""
    facts = gather(None, None, _probe("0, 00000000:00:06.0, 580.159.04, 9.0, NVIDIA H200\n"))
    found = _by_name(facts)
    assert found["driver"].ok and found["driver"].detail == (
        "NVIDIA driver 580.159.04 (needs >= 580.65.06)"
    )
    assert not found["gpu"].ok and "is compute 9.0" in found["gpu"].detail
    assert _by_name(facts, gpus=("sm90",))["gpu"].ok


def test_two_pins_of_one_stack_never_share_a_cache_volume(stacks_dir: Path, tmp_path: Path) -> None:
    """Two hosts of one engine serving one stack got one volume (`sm120-stacks-cache-STACK`):
    two servers writing one live/, a restore swapping it under the other (issue 34). Each pin
    has its own now; a re-pin of a host to the stack keeps its caches; names that split alike
    (`a-b` on `c`, `a` on `b-c`) stay apart."""
    from builder.hosts.pins import CACHE_TARGET, cache_volume_name

    def cache_of(pin: Pin) -> str:
        return next(v.source for v in pin.volumes if v.target == CACHE_TARGET)

    first = _pin(stacks_dir, tmp_path / "a", host="gpu1")
    second = _pin(stacks_dir, tmp_path / "b", host="gpu2")
    again = _pin(stacks_dir, tmp_path / "c", host="gpu1")
    assert cache_of(first) != cache_of(second)
    assert cache_of(again) == cache_of(first), "a re-pin finds the host's caches again"
    assert STACK in cache_of(first) and "gpu1" in cache_of(first), "readable in docker volume ls"
    assert cache_volume_name("a-b", "c") != cache_volume_name("a", "b-c")
    longest = cache_volume_name("s" * 128, "h" * 253)
    assert len(longest) <= 253 and longest.startswith("sm120-stacks-cache-")


def test_a_vllm_pin_keeps_its_compile_caches_on_a_volume(stacks_dir: Path, tmp_path: Path) -> None:
    """Triton, torch.compile, CuTe-DSL and FlashInfer compiles survive a restart (RESULTS §5)."""
    from builder.hosts.pins import CACHE_ENV, CACHE_TARGET, cache_volume_name

    pin = _pin(stacks_dir, tmp_path, env=("TRITON_CACHE_DIR=/elsewhere",))
    volumes = [(v.source, v.target, v.read_only) for v in pin.volumes]
    assert (cache_volume_name(STACK, "gpu-node-07"), CACHE_TARGET, False) in volumes
    assert ("/var/lib/sm120-stacks/models", "/models", True) in volumes  # read-only
    for name, value in CACHE_ENV.items():
        expected = "/elsewhere" if name == "TRITON_CACHE_DIR" else value
        assert pin.env[name] == expected
    assert pin.env["VLLM_CACHE_ROOT"].startswith(CACHE_TARGET + "/")
    own = _pin(stacks_dir, tmp_path, volumes=("/srv/m:/models:ro",))
    assert [v.target for v in own.volumes] == ["/models"]  # --volume replaces the defaults
