"""A pinned server lets in only those it should: loopback by default, an API key (from a file
on the host, in no rendered file) for anything wider, models read-only; the in-image key gate
for an engine without a key option (templates/tools/auth_proxy.py) run for real."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from click.testing import Result

from builder import REPO_ROOT
from builder.engine.hostprobe import HostFacts
from builder.hosts import container, deploy, k8s
from builder.hosts.drift import verify
from builder.hosts.pins import load_pin
from builder.verify.chat import stream_chat
from tests.support.health import wait_healthy
from tests.support.net import free_port
from tests.test_hosts import STACK, _tested_and_pushed

KEY = "sk-test-" + "5" * 24
PROXY = REPO_ROOT / "templates" / "tools" / "auth_proxy.py"


def _pinned(run_cli: Callable[..., Result], stacks_dir: Path, *args: str) -> Result:
    from builder.manifest.resolve import resolve

    _tested_and_pushed(stacks_dir.parent / "build", resolve(STACK, stacks_dir))
    return run_cli("pin", "gpu-node-07", STACK, *args, stacks_dir=stacks_dir)


def test_a_pin_publishes_on_loopback_unless_told(
    run_cli: Callable[..., Result], stacks_dir: Path
) -> None:
    assert _pinned(run_cli, stacks_dir).exit_code == 0
    pin = load_pin(stacks_dir.parent / "hosts", "gpu-node-07")
    assert pin.ports == ["127.0.0.1:8000:8000"] and not pin.no_auth


@pytest.mark.parametrize("port", ["8000:8000", "0.0.0.0:8000:8000", "10.0.0.5:9000:8000"])
def test_publishing_beyond_loopback_needs_a_key_or_no_auth(
    port: str, run_cli: Callable[..., Result], stacks_dir: Path
) -> None:
    refused = _pinned(run_cli, stacks_dir, "--port", port)
    assert refused.exit_code == 2 and "beyond loopback with no API key" in refused.output
    assert "--api-key-file" in refused.output and "Traceback" not in refused.output
    assert not (stacks_dir.parent / "hosts" / "gpu-node-07.yaml").exists()
    open_ = _pinned(run_cli, stacks_dir, "--port", port, "--no-auth")
    assert open_.exit_code == 0
    pin = load_pin(stacks_dir.parent / "hosts", "gpu-node-07")
    assert pin.no_auth
    facts = HostFacts("580.95.05", (), None, ("runtime nvidia",), None)
    report = verify(pin, None, "not reached", facts)
    assert any(d.name == "exposed" for d in report.drifts)


def test_the_key_reaches_the_server_from_its_file_and_nothing_renders_it(
    run_cli: Callable[..., Result], stacks_dir: Path, tmp_path: Path
) -> None:
    key_file = tmp_path / "host.key"
    key_file.write_text(KEY + "\n")
    result = _pinned(
        run_cli, stacks_dir, "--port", "0.0.0.0:8000:8000", "--api-key-file", str(key_file)
    )
    assert result.exit_code == 0, result.output
    hosts = stacks_dir.parent / "hosts"
    pin = load_pin(hosts, "gpu-node-07")
    spec = container.describe(pin)
    assert spec.command is not None and spec.command[:2] == ("sh", "-c")
    assert "VLLM_API_KEY" in spec.command[2] and container.SECRET_TARGET in spec.command[2]
    assert list(spec.command[3:]) == pin.command
    assert ("VLLM_API_KEY", KEY) not in spec.environment.items()
    assert any(m.target == container.SECRET_TARGET and m.read_only for m in spec.mounts)
    files = deploy.render_files(pin)
    rendered = "\n".join(
        [*files.values(), k8s.render(pin), (hosts / "gpu-node-07.yaml").read_text()]
    )
    assert KEY not in rendered and str(key_file) in rendered
    deployment = k8s.manifests(pin)[0]
    pod = deployment["spec"]["template"]["spec"]
    assert {"secretName": k8s.secret_name(pin), "defaultMode": 0o400} in [
        v.get("secret") for v in pod["volumes"]
    ]


def test_models_are_mounted_read_only_by_default(
    run_cli: Callable[..., Result], stacks_dir: Path
) -> None:
    assert _pinned(run_cli, stacks_dir).exit_code == 0
    pin = load_pin(stacks_dir.parent / "hosts", "gpu-node-07")
    models = [v for v in pin.volumes if v.target == "/models"]
    assert models and all(v.read_only for v in models)


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The key gate in front of a stand-in chat server, as the in-image tool runs it."""
    listen, upstream = free_port(), free_port()
    key_file = tmp_path / "gate.key"
    key_file.write_text(KEY)
    command = [sys.executable, str(PROXY), "--listen", str(listen), "--upstream", str(upstream)]
    command += ["--key-file", str(key_file), "--", sys.executable, "-m", "tests.support.fake_chat"]
    process = subprocess.Popen([*command, str(upstream)], cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{listen}"
    try:
        wait_healthy(url, 30)
        yield url, key_file
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_key_gate_lets_in_only_the_key(gated: tuple[str, Path]) -> None:
    url, _ = gated
    chat = url + "/v1/chat/completions"
    assert requests.get(url + "/health", timeout=5).status_code == 200  # health stays open
    refused = stream_chat(chat, "m", "What is the capital of Kentucky?", 16)
    assert refused.error is not None and "HTTP 401" in refused.error
    wrong = stream_chat(chat, "m", "Hi", 16, headers={"Authorization": "Bearer nope"})
    assert wrong.error is not None and "HTTP 401" in wrong.error
    answered = stream_chat(
        chat,
        "m",
        "What is the capital of Kentucky?",
        16,
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert answered.error is None and "Frankfort" in answered.text and answered.streamed
