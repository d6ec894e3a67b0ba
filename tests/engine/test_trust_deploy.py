"""deploy --apply verifies the pinned digest's evidence under the hosts' trust policy before
it pulls or replaces anything (builder/hosts/evidence_gate.py), on the real engine and
registry: the image's evidence signed by a build key the policy names deploys, and says which
key vouched; once the evidence was re-signed by a key the policy does not name (after the
pin was written), deploy --apply exits 2 naming the document and the key, and nothing
changes on the host: the running container is not replaced, a new host gets none.

The hosts are test_warm.py's (a few lines of Python), in this module's own repository.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.evidence.keys import generate_key_pair, load_signing_key
from builder.hosts.pins import LABEL_HOST, Pin, write_pin
from tests.engine.conftest import pushed_local_base, unique
from tests.engine.test_warm import hosts, served_image
from tests.support.health import wait_healthy
from tests.support.signed_evidence import attach_document, attach_evidence, evidence_documents

pytestmark = pytest.mark.engine
__all__ = ["hosts", "served_image"]  # test_warm's fixtures, used here by name

STACK, CONTENT = "warm-test", "0" * 64  # what test_warm's pins name


@pytest.fixture
def policy(workspace: Path) -> Iterator[Path]:
    """Keys in the hosts folder and a trust.yaml naming `build` for builds (removed after:
    the workspace is the whole session's); the folder of the keys."""
    folder = workspace / "hosts"
    keys = folder / "deploy-test-keys"
    for name in ("build", "stranger"):
        if not (keys / f"{name}.key").exists():
            generate_key_pair(keys, name)
    document = {
        "version": 1,
        "keys": {"build": "deploy-test-keys/build.pub"},
        "purposes": {"build": ["build"]},
    }
    (folder / "trust.yaml").write_text(json.dumps(document))  # JSON is YAML
    yield keys
    (folder / "trust.yaml").unlink(missing_ok=True)


def _containers(api: Any, pin: Pin) -> list[Any]:
    return list(api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={pin.host}"}))


def test_deploy_verifies_the_evidence_then_refuses_it_re_signed_by_an_unknown_key(
    hosts: Callable[..., tuple[Pin, int]],
    cli_process: Callable[..., Any],
    policy: Path,
    api: Any,
    workspace: Path,
) -> None:
    signed, port = hosts("trust-deploy-signed")
    attach_evidence(signed.image, STACK, CONTENT, policy / "build.key")
    build_id = load_signing_key(policy / "build.key").key_id

    deployed = cli_process("deploy", signed.host, "--apply", "--no-smoke", check=False)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert f"vouched for by build ({build_id[:16]})" in deployed.stdout, deployed.stdout
    wait_healthy(f"http://127.0.0.1:{port}/health", 60)
    [running] = _containers(api, signed)

    # After the pin: a verdict of the same image, signed by a key trust.yaml does not name.
    forged = evidence_documents(signed.image, STACK, CONTENT, [])["verdict"]
    attach_document(signed.image, "verdict", forged, policy / "stranger.key")
    stranger_id = load_signing_key(policy / "stranger.key").key_id

    # The running host's pin changes (a deploy would replace its container): refused, kept.
    changed = signed.model_copy(update={"env": {**signed.env, "CHANGED": "1"}})
    write_pin(workspace / "hosts", changed)
    refused = cli_process("deploy", signed.host, "--apply", "--no-smoke", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = refused.stderr
    assert f"{signed.host}: refusing to deploy {signed.image}" in said, said
    assert "unknown key (not in the trust policy)" in said and stranger_id[:16] in said
    assert "nothing was pulled, stopped or started" in said and "Traceback" not in said
    [still] = _containers(api, signed)
    assert still.id == running.id and still.status == "running"
    assert "CHANGED=1" not in still.attrs["Config"]["Env"]

    # A host never deployed gets nothing: no container, no cache volume.
    fresh, _ = hosts("trust-deploy-fresh")
    refused = cli_process("deploy", fresh.host, "--apply", "--no-smoke", check=False)
    assert refused.returncode == 2 and "unknown key" in refused.stderr, refused.stderr
    assert _containers(api, fresh) == []
    assert not api.volumes.list(filters={"name": f"sm120-warm-{fresh.host}"})


def test_without_a_policy_deploy_trusts_the_signer_on_first_use_and_refuses_unsigned(
    hosts: Callable[..., tuple[Pin, int]],
    cli_process: Callable[..., Any],
    workspace: Path,
    api: Any,
    engine: Any,
    registry: Any,
    tmp_path: Path,
) -> None:
    """Safe by default (issue 43): no trust.yaml is no longer "nothing verified". The image's
    evidence is unsigned: refused, nothing started; signed: its key trusted on first use
    (key id and fingerprint said, trust.yaml written), and the host served. The image is in a
    repository of its own (this module's holds the other test's keys)."""
    policy = workspace / "hosts" / "trust.yaml"
    assert not policy.exists()
    made, port = hosts("trust-deploy-none")
    with pushed_local_base(api, engine, registry, f"{unique('tofu-deploy')}/sm120-stacks") as ref:
        host = made.model_copy(update={"image": ref})
        write_pin(workspace / "hosts", host)
        try:
            attach_evidence(ref, STACK, CONTENT, None)  # what an unsigned push attached
            refused = cli_process("deploy", host.host, "--apply", "--no-smoke", check=False)
            assert refused.returncode == 2, refused.stdout + refused.stderr
            assert "unsigned [no key]" in refused.stderr and "Traceback" not in refused.stderr
            assert _containers(api, host) == [] and not policy.exists()

            generate_key_pair(tmp_path, "first")
            attach_evidence(ref, STACK, CONTENT, tmp_path / "first.key")
            deployed = cli_process("deploy", host.host, "--apply", "--no-smoke")
            key_id = load_signing_key(tmp_path / "first.key").key_id
            said = deployed.stdout
            assert f"first use: trusted key first-use-{key_id[:12]} (key id {key_id}" in said
            assert "ignored 3 unsigned document(s)" in said, said
            assert key_id[:12] in policy.read_text()
            wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        finally:
            policy.unlink(missing_ok=True)
            for container in _containers(api, host):
                container.remove(force=True)
