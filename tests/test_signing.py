"""Keys, DSSE envelopes and the trust policy (issue 35), with real keys and real signatures.

The envelopes are checked with securesystemslib's DSSE implementation, not only ours: what we
sign must verify for any DSSE verifier (cosign's, in-toto's), and a changed payload must not.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from builder.errors import StackError
from builder.evidence import signing
from builder.evidence.keys import (
    fingerprint,
    generate_key_pair,
    key_id_of,
    load_public_key,
    load_signing_key,
    signing_key_path,
)
from builder.evidence.trust import TrustPolicy, Untrusted, load_policy, vouch

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
H200 = "NVIDIA H200"
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def _sslib_key(public_pem: bytes, key_id: str) -> SSlibKey:
    crypto_key = serialization.load_pem_public_key(public_pem)
    return SSlibKey.from_crypto(crypto_key, keyid=key_id)  # type: ignore[arg-type]


def _envelope(key_path: Path, digest: str = DIGEST, predicate: str | None = None) -> bytes:
    data = signing.statement(
        "127.0.0.1:5000/sm120-stacks",
        digest,
        predicate or signing.VERDICT_PREDICATE,
        {"static": "passed"},
    )
    return signing.sign(data, load_signing_key(key_path))


def test_generate_writes_a_cosign_pair_private_0600_never_printed(
    tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    old = os.umask(0)  # the widest umask: the private key must still be 0600 from its creation
    try:
        result = run_cli("keys", "generate", "build", "--dir", str(tmp_path))
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    private, public = tmp_path / "build.key", tmp_path / "build.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    secret = private.read_text()
    assert secret.startswith("-----BEGIN PRIVATE KEY-----")
    body = "".join(secret.splitlines()[1:-1])
    assert body[:20] not in result.output and "PRIVATE KEY-----" not in result.output
    pem = public.read_bytes()
    assert pem.startswith(b"-----BEGIN PUBLIC KEY-----\n")
    der = serialization.load_pem_public_key(pem).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    key_id = hashlib.sha256(der).hexdigest()
    assert f"key id {key_id}" in result.output
    assert run_cli("keys", "id", str(public)).output.strip() == key_id
    again = run_cli("keys", "generate", "build", "--dir", str(tmp_path))
    assert again.exit_code == 2 and "refusing to replace" in again.output
    assert private.read_text() == secret


def test_envelope_verifies_with_securesystemslib_and_a_changed_payload_does_not(
    tmp_path: Path,
) -> None:
    _, public, key_id = generate_key_pair(tmp_path, "build")
    raw = _envelope(tmp_path / "build.key")
    envelope = SslibEnvelope.from_dict(json.loads(raw))
    assert envelope.payload_type == "application/vnd.in-toto+json"
    key = _sslib_key(public.read_bytes(), key_id)
    assert key_id in envelope.verify([key], 1)
    statement = json.loads(envelope.pae().split(b" ", 4)[4])
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"][0]["digest"] == {"sha256": DIGEST.removeprefix("sha256:")}

    forged = json.loads(raw)
    changed = json.loads(base64.b64decode(forged["payload"]))
    changed["predicate"]["static"] = "failed"
    forged["payload"] = base64.b64encode(json.dumps(changed).encode()).decode()
    forged_raw = json.dumps(forged).encode()
    with pytest.raises(VerificationError):
        SslibEnvelope.from_dict(forged).verify([key], 1)  # from_dict takes the dict apart
    ours = signing.read_envelope(forged_raw, "verdict")
    assert ours.signed_by([load_public_key(public)]) is None


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trust.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def keyring(tmp_path: Path) -> Path:
    for name in ("build", "build-old", "ops-h200", "stranger"):
        generate_key_pair(tmp_path / "keys", name)
    return tmp_path


POLICY = """\
version: 1
keys:
  build: keys/build.pub
  build-old: keys/build-old.pub
  ops-h200: keys/ops-h200.pub
purposes:
  build: [build, build-old]
  served:
    "NVIDIA H200": [ops-h200]
  warm:
    "NVIDIA H200": [ops-h200]
"""


def _loaded(keyring: Path) -> TrustPolicy:
    return load_policy(_policy(keyring, POLICY))


def test_policy_names_keys_per_purpose_and_gpu_kind(keyring: Path) -> None:
    policy = _loaded(keyring)
    assert [k.key_id for k in policy.trusted("build")] == [
        load_public_key(keyring / "keys" / n).key_id for n in ("build.pub", "build-old.pub")
    ]
    assert policy.trusted("served", RTX) == []
    assert len(policy.trusted("warm", H200)) == 1


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        (POLICY.replace("  warm:", "  wram:"), 10, "unknown purpose"),
        (
            POLICY.replace("build-old: keys/build-old.pub", "build-old: keys/build.pub"),
            4,
            "same key",
        ),
        (POLICY.replace("[build, build-old]", "[build, build]"), 7, "listed twice"),
        (POLICY.replace("[ops-h200]\n  warm", "[opz]\n  warm"), 9, "no key named 'opz'"),
        (POLICY.replace("version: 1", "version: 2"), 1, "version"),
    ],
)
def test_bad_policy_exits_2_with_file_key_and_line(
    keyring: Path, run_cli: Callable[..., Result], text: str, line: int, says: str
) -> None:
    path = _policy(keyring, text)
    result = run_cli("keys", "check", "--policy", str(path))
    assert result.exit_code == 2, result.output
    assert f"trust.yaml:{line}:" in result.output and says in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("content", [b"", b"-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0C\n"])
def test_a_truncated_key_file_in_the_policy_exits_2_naming_it(
    keyring: Path, run_cli: Callable[..., Result], content: bytes
) -> None:
    (keyring / "keys" / "build-old.pub").write_bytes(content)
    result = run_cli("keys", "check", "--policy", str(_policy(keyring, POLICY)))
    assert result.exit_code == 2
    assert "trust.yaml:4: keys.build-old: keys/build-old.pub: not a PEM public key" in result.output


def test_vouch_accepts_a_trusted_key_and_either_rotated_build_key(keyring: Path) -> None:
    policy = _loaded(keyring)
    for name in ("build", "build-old"):
        vouched = vouch(
            _envelope(keyring / "keys" / f"{name}.key"),
            document="static verdict",
            predicate_type=signing.VERDICT_PREDICATE,
            digest=DIGEST,
            policy=policy,
            purpose="build",
        )
        assert vouched.key_name == name
        assert vouched.statement["predicate"] == {"static": "passed"}


def _refusal(keyring: Path, raw: bytes, **where: str) -> str:
    with pytest.raises(Untrusted) as caught:
        vouch(
            raw,
            document="served verdict",
            predicate_type=signing.VERDICT_PREDICATE,
            digest=DIGEST,
            policy=_loaded(keyring),
            purpose=where.get("purpose", "served"),  # type: ignore[arg-type]
            gpu_kind=where.get("gpu_kind", H200),
        )
    return caught.value.message


def test_vouch_refuses_with_the_document_key_id_and_reason(keyring: Path) -> None:
    keys = keyring / "keys"
    ops = load_public_key(keys / "ops-h200.pub").key_id
    stranger = load_public_key(keys / "stranger.pub").key_id
    unsigned = json.loads(_envelope(keys / "ops-h200.key"))
    unsigned["signatures"] = []
    assert "unsigned [no key]" in _refusal(keyring, json.dumps(unsigned).encode())
    refused = _refusal(keyring, _envelope(keys / "stranger.key"))
    assert f"unknown key (not in the trust policy) [key {stranger[:16]}, fingerprint " in refused
    assert fingerprint(stranger) in refused  # ssh-style, to compare with the key's owner
    on_rtx = _refusal(keyring, _envelope(keys / "ops-h200.key"), gpu_kind=RTX)
    assert f"key not trusted for served on {RTX} [key {ops[:16]} (ops-h200)]" in on_rtx
    as_build = _refusal(keyring, _envelope(keys / "ops-h200.key"), purpose="build")
    assert "key not trusted for build" in as_build
    other = _refusal(keyring, _envelope(keys / "ops-h200.key", digest=OTHER))
    assert f"subject is another image, not {DIGEST}" in other
    sbom = _refusal(keyring, _envelope(keys / "ops-h200.key", predicate=signing.SBOM_PREDICATE))
    assert "predicate type 'https://cyclonedx.org/bom'" in sbom


def test_a_document_changed_after_signing_is_refused(keyring: Path) -> None:
    keys = keyring / "keys"
    envelope = json.loads(_envelope(keys / "ops-h200.key"))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["static"] = "passed, twice"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    refused = _refusal(keyring, json.dumps(envelope).encode())
    assert "signature does not match the payload" in refused


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"{not json", "it is not JSON"),
        (b'{"schema": "https://sm120-stacks.dev/verdict/v1"}', "not a DSSE envelope"),
        (b'{"payloadType": "text/plain", "payload": "", "signatures": []}', "payloadType"),
        (
            b'{"payloadType": "application/vnd.in-toto+json", "payload": "!", "signatures": []}',
            "not base64",
        ),
    ],
)
def test_an_envelope_that_is_not_one_is_bad_input(keyring: Path, raw: bytes, says: str) -> None:
    with pytest.raises(StackError) as caught:
        _refusal(keyring, raw)
    assert says in caught.value.message and not isinstance(caught.value, Untrusted)


def test_a_signing_key_is_named_by_its_file_never_given_itself(tmp_path: Path) -> None:
    private, _, _ = generate_key_pair(tmp_path, "ops")
    assert signing_key_path(str(private), "--signing-key") == private
    pasted = private.read_text()
    with pytest.raises(StackError) as caught:
        signing_key_path(pasted, "--signing-key")
    assert pasted.splitlines()[1] not in str(caught.value)
    assert "SigningKey(key_id=" in repr(load_signing_key(private))
    assert pasted.splitlines()[1] not in repr(load_signing_key(private))


@pytest.mark.parametrize("command", [("push", "ci-mini"), ("cache", "capture", "gpu-1")])
def test_a_bad_signing_key_is_refused_before_anything_moves(
    tmp_path: Path, run_cli: Callable[..., Result], command: tuple[str, ...]
) -> None:
    """A truncated key file, or the key pasted in place of its path: exit 2, the key's bytes
    in no output, before the engine or registry is asked anything."""
    private, _, _ = generate_key_pair(tmp_path, "ops")
    pasted = private.read_text()
    truncated = tmp_path / "cut.key"
    truncated.write_text(pasted[: len(pasted) // 2])
    for given, says in (
        (str(truncated), "not an unencrypted PEM private key"),
        (pasted, "looks like a key"),
    ):
        result = run_cli(*command, "--signing-key", given)
        assert result.exit_code == 2, result.output
        assert says in result.output
        assert pasted.splitlines()[1] not in result.output


def test_a_key_published_beside_a_document_is_a_candidate_never_a_trust() -> None:
    """published_key reads only a P-256 PEM (anything else: None), and the fingerprint is
    ssh's form of the key id (SHA256: and unpadded base64 of the same sha256)."""
    from builder.evidence.keys import published_key

    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    key = published_key(pem.decode(), "annotation")
    assert key is not None and key.key_id == key_id_of(private.public_key())
    assert published_key("not a key", "annotation") is None
    assert published_key("x" * 20_000, "annotation") is None
    other = ec.generate_private_key(ec.SECP384R1()).public_key()
    p384 = other.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert published_key(p384.decode(), "annotation") is None
    assert fingerprint("00" * 32) == "SHA256:" + "A" * 43
