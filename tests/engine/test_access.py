"""A deployed server lets in only the key: ci-mini (`transformers serve`, no key option of its
own) pinned beyond loopback with a key file, deployed on the real engine behind the in-image
key gate, running as a non-root user; a request without the key gets 401, one with it an
answer; the key is in no rendered file, log or `docker inspect`; the models folder is
read-only inside the container."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder.hosts.pins import LABEL_HOST
from builder.image.records import CPU, ServedVerdict, load_record, save_record
from builder.image.registry import Registry
from builder.verify.chat import stream_chat
from tests.engine.conftest import unique
from tests.support.health import wait_healthy
from tests.support.net import free_port

pytestmark = [
    pytest.mark.engine,
    pytest.mark.needs_ci_mini(
        "serves the tiny model with transformers serve behind the key wrapper"
    ),
]
HOST = unique("access-e2e")
KEY = "sk-access-" + "7" * 24


def test_a_keyed_pin_answers_only_the_key_and_reads_models_read_only(
    variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    models: dict[str, Path],
    api: Any,
    tmp_path: Path,
    tiny_signing_key: Path,
) -> None:
    from builder.manifest.resolve import resolve
    from builder.render.context import render

    name = variant("access-key", "env:\n  ACCESS_TEST: '1'")
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
    cli_process("push", name, "--registry", registry.host, "--signing-key", str(tiny_signing_key))
    key_file = tmp_path / "host.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o644)  # read by the container's user
    port = free_port()
    hosts = tmp_path / "hosts"
    cli_process(
        *("pin", HOST, name, "--gpus", "none", "--registry", registry.host),
        *("--port", f"0.0.0.0:{port}:8000", "--api-key-file", str(key_file)),
        *("--volume", f"{models['trained']}:/models/tiny:ro", "--hosts-dir", str(hosts)),
        *("--user", "65534:65534", "--env", "HOME=/tmp"),  # nobody: not the image's root
    )
    out = tmp_path / "out"
    try:
        applied = cli_process(
            "deploy", HOST, "--apply", "--hosts-dir", str(hosts), "--out", str(out)
        )
        assert "started" in applied.stdout
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 180)
        chat = url + "/v1/chat/completions"
        refused = stream_chat(chat, "/models/tiny", "What is the capital of Kentucky?", 16)
        assert refused.error is not None and "HTTP 401" in refused.error
        answered = stream_chat(
            chat,
            "/models/tiny",
            "What is the capital of Kentucky?",
            32,
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert answered.error is None, answered.error
        assert "frankfort" in answered.text.lower()
        (container,) = api.containers.list(filters={"label": f"{LABEL_HOST}={HOST}"})
        assert container.attrs["Config"]["User"] == "65534:65534"
        assert not container.attrs["HostConfig"]["Privileged"]
        assert container.exec_run(["id", "-u"]).output.strip() == b"65534"
        written = container.exec_run(["sh", "-c", "touch /models/tiny/written"])
        assert written.exit_code != 0 and b"Read-only" in written.output
        assert KEY not in json.dumps(container.attrs)
        assert KEY not in container.logs().decode(errors="replace")
        for path in [*out.iterdir(), hosts / f"{HOST}.yaml"]:
            assert KEY not in path.read_text(), path
        verified = cli_process("verify", HOST, "--hosts-dir", str(hosts), check=False)
        assert "no drift" in verified.stdout, verified.stdout
    finally:
        for container in api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={HOST}"}):
            container.remove(force=True)
