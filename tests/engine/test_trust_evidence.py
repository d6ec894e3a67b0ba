"""Signed evidence under a trust policy, on the real registry (issue 35): what `pin`, `pull`
and `evidence` rely on from a build folder with no records, read by evidence/reader.py with the
hosts' policy.

Each case is its own image repository (the local base image pushed under a fresh namespace),
so the artifacts one case attaches are not seen by another. The documents are made as `push`
makes them (documents.verdict_document, provenance) and attached as `push` attaches them
(attach._signed: a DSSE envelope layer), by the attacker with push access where the case says.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.errors import StackError
from builder.evidence import documents
from builder.evidence.keys import generate_key_pair, load_signing_key, public_pem
from builder.evidence.oci import ArtifactStore
from builder.evidence.reader import read_evidence
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE, seal
from builder.evidence.trust import TrustPolicy, Untrusted, load_policy
from builder.hosts.pins import Pin
from builder.hosts.trustdrift import refuse_revoked, trust_drifts
from builder.image.records import CPU, Record, ServedVerdict
from builder.image.registry import Registry
from tests.engine.conftest import pushed_local_base, unique
from tests.engine.test_evidence import second_folder

pytestmark = pytest.mark.engine
__all__ = ["second_folder"]  # test_evidence's fixture, used here by name
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
CONTENT = "c" * 64


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trust")
    for name in ("build", "build-new", "ops-rtx", "stranger"):
        generate_key_pair(folder / "keys", name)
    return folder


def _policy(
    keys: Path, build: list[str], served: dict[str, list[str]] | None = None
) -> TrustPolicy:
    document = {
        "version": 1,
        "keys": {n: f"keys/{n}.pub" for n in ("build", "build-new", "ops-rtx")},
        "purposes": {"build": build, "served": served or {}},
    }
    path = keys / "trust.yaml"
    path.write_text(json.dumps(document))
    return load_policy(path)


@pytest.fixture
def image(api: Any, engine: Any, registry: Registry) -> Iterator[tuple[Registry, str]]:
    """A fresh repository holding one image: (its registry, its digest)."""
    namespace = unique(f"trust-{os.urandom(3).hex()}")  # unique() alone is one name a run
    with pushed_local_base(api, engine, registry, f"{namespace}/sm120-stacks") as ref:
        yield Registry.parse(f"{registry.host}/{namespace}"), ref.rpartition("@")[2]


def _served(kind: str, at: str = "2026-12-01T00:00:00Z", ttft: float = 0.2) -> ServedVerdict:
    return ServedVerdict(
        gpu_kind=kind,
        gpu_count=0 if kind == CPU else 1,
        model_id="/models/tiny",
        serve_args=["serve"],
        compiles={},
        ttft_s=ttft,
        passed=True,
        source="test",
        at=at,
    )


def _documents(registry: Registry, digest: str, served: list[ServedVerdict]) -> dict[str, bytes]:
    record = Record(stack="trust-test", content_hash=CONTENT, static="passed", served=served)
    verdict = documents.verdict_document(digest, registry.repository, record, None, False)
    provenance = documents.provenance(
        documents.ProvenanceInputs(
            registry.repository,
            digest,
            "trust-test",
            CONTENT,
            {"Dockerfile": b"FROM x"},
            [],
            "unix:///var/run/docker.sock",
            "buildx",
            None,
        )
    )
    sbom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "components": [{"bom-ref": "base/x"}]}
    return {
        "verdict": documents.canonical(verdict),
        "sbom": documents.canonical(sbom),
        "provenance": provenance,
    }


_TYPES = {
    "verdict": documents.VERDICT_TYPE,
    "sbom": documents.SBOM_TYPE,
    "provenance": documents.PROVENANCE_TYPE,
}


def _attach(
    registry: Registry, digest: str, kind: str, payload: bytes, signer: Path | None
) -> None:
    """One artifact as push attaches it; signed by signer's key where given."""
    store = ArtifactStore(registry)
    layer, body = _TYPES[kind], payload
    if signer is not None:
        layer = ENVELOPE_MEDIA_TYPE
        body = seal(kind, payload, registry.repository, digest, load_signing_key(signer))
    annotations = {documents.SUBJECT_ANNOTATION: digest, documents.KIND_ANNOTATION: kind}
    if signer is not None:  # push publishes the signer's public key beside the envelope
        key = load_signing_key(signer).key.public_key()
        annotations[documents.SIGNER_KEY_ANNOTATION] = public_pem(key).decode()
    store.attach(store.image(digest), _TYPES[kind], layer, body, annotations)


def _push(
    registry: Registry, digest: str, signer: Path | None, served: list[ServedVerdict]
) -> None:
    for kind, payload in _documents(registry, digest, served).items():
        _attach(registry, digest, kind, payload, signer)


def _read(registry: Registry, digest: str, policy: TrustPolicy, **more: Any) -> Any:
    return read_evidence(registry, "trust-test", reference=digest, trust=policy, **more)


def test_signed_evidence_is_relied_on_and_names_its_key(
    image: tuple[Registry, str], keys: Path
) -> None:
    registry, digest = image
    _push(registry, digest, keys / "keys" / "build.key", [_served(CPU)])
    policy = _policy(keys, ["build"], {CPU: ["build"]})
    evidence = _read(registry, digest, policy)
    assert evidence.verdicts.static == "passed" and evidence.sbom == {
        "python": 0,
        "os": 0,
        "jit": 0,
        "base": 1,
    }
    assert evidence.provenance["predicateType"] == "https://slsa.dev/provenance/v1"
    assert evidence.signed_by == [policy.keys["build"].key_id]
    # Without a policy (`evidence`, `report`) each envelope is still checked against the key
    # published beside it: read, and not as a plain document (issue 43).
    shown = read_evidence(registry, "trust-test", reference=digest)
    assert shown.verdicts.static == "passed" and shown.signed_by == [policy.keys["build"].key_id]


@pytest.mark.parametrize("signer", [None, "stranger"])
def test_a_forged_verdict_unsigned_or_by_an_untrusted_key_is_refused(
    image: tuple[Registry, str], keys: Path, signer: str | None
) -> None:
    registry, digest = image
    policy = _policy(keys, ["build"], {CPU: ["build"]})
    key = keys / "keys" / f"{signer}.key" if signer else None
    _push(registry, digest, key, [_served(CPU)])  # self-consistent: names this very image
    with pytest.raises(Untrusted) as refused:
        _read(registry, digest, policy)
    reason = "unsigned [no key]" if signer is None else "unknown key (not in the trust policy)"
    assert reason in refused.value.message


def test_a_verdict_signed_for_another_image_is_refused(
    image: tuple[Registry, str], keys: Path
) -> None:
    registry, digest = image
    policy = _policy(keys, ["build"])
    other = "sha256:" + "ab" * 32
    forged = _documents(registry, other, [])
    store = ArtifactStore(registry)
    body = seal(
        "verdict",
        forged["verdict"],
        registry.repository,
        other,
        load_signing_key(keys / "keys" / "build.key"),
    )
    annotations = {documents.SUBJECT_ANNOTATION: digest, documents.KIND_ANNOTATION: "verdict"}
    store.attach(
        store.image(digest), documents.VERDICT_TYPE, ENVELOPE_MEDIA_TYPE, body, annotations
    )
    with pytest.raises(Untrusted, match=f"subject is another image, not {digest}"):
        _read(registry, digest, policy)


def test_a_served_verdict_by_a_key_trusted_only_for_another_gpu_kind_is_refused(
    image: tuple[Registry, str], keys: Path
) -> None:
    registry, digest = image
    _push(registry, digest, keys / "keys" / "build.key", [])
    policy = _policy(keys, ["build"], {RTX: ["ops-rtx"]})
    served = _documents(registry, digest, [_served(CPU)])["verdict"]
    one = json.loads(served)
    one["static"] = None
    _attach(registry, digest, "verdict", documents.canonical(one), keys / "keys" / "ops-rtx.key")
    with pytest.raises(Untrusted) as refused:
        _read(registry, digest, policy)
    ops = policy.keys["ops-rtx"].key_id
    assert f"key not trusted for served on cpu [key {ops[:16]} (ops-rtx)]" in refused.value.message


def test_a_document_changed_after_signing_is_refused(
    image: tuple[Registry, str], keys: Path
) -> None:
    registry, digest = image
    made = _documents(registry, digest, [])
    for kind in ("sbom", "provenance"):
        _attach(registry, digest, kind, made[kind], keys / "keys" / "build.key")
    envelope = json.loads(
        seal(
            "verdict",
            made["verdict"],
            registry.repository,
            digest,
            load_signing_key(keys / "keys" / "build.key"),
        )
    )
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["static"] = "passed"
    statement["predicate"]["served"] = [json.loads(_served(RTX).model_dump_json())]
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    store = ArtifactStore(registry)
    annotations = {documents.SUBJECT_ANNOTATION: digest, documents.KIND_ANNOTATION: "verdict"}
    store.attach(
        store.image(digest),
        documents.VERDICT_TYPE,
        ENVELOPE_MEDIA_TYPE,
        json.dumps(envelope).encode(),
        annotations,
    )
    with pytest.raises(Untrusted, match="signature does not match the payload"):
        _read(registry, digest, _policy(keys, ["build"], {RTX: ["build"]}))


def test_a_newer_unsigned_verdict_does_not_override_a_signed_one(
    image: tuple[Registry, str], keys: Path
) -> None:
    registry, digest = image
    _push(registry, digest, keys / "keys" / "build.key", [_served(CPU, ttft=0.2)])
    later = [_served(CPU, at="2099-01-01T00:00:00Z", ttft=99.0)]
    forged = json.loads(_documents(registry, digest, later)["verdict"])
    forged["recorded_at"], forged["static"] = "2099-01-01T00:00:00Z", "failed"
    _attach(registry, digest, "verdict", documents.canonical(forged), None)
    policy = _policy(keys, ["build"], {CPU: ["build"]})
    # Not relied on, and no refusal either (a registry writer's extra stops no roll): named.
    ignored = _read(registry, digest, policy)
    assert len(ignored.ignored) == 1 and ignored.verdicts.static == "passed"
    evidence = _read(registry, digest, policy, allow_unsigned=True)
    assert len(evidence.unsigned) == 1
    assert evidence.verdicts.static == "passed"
    assert [v.ttft_s for v in evidence.verdicts.served] == [0.2]


def test_a_policy_needs_the_sbom_and_provenance_too(
    image: tuple[Registry, str], keys: Path
) -> None:
    registry, digest = image
    made = _documents(registry, digest, [])
    _attach(registry, digest, "verdict", made["verdict"], keys / "keys" / "build.key")
    with pytest.raises(Exception, match="holds no SBOM and no provenance"):
        _read(registry, digest, _policy(keys, ["build"]))


def test_rotation_keeps_both_keys_and_revocation_is_reported_by_verify(
    image: tuple[Registry, str], keys: Path
) -> None:
    registry, digest = image
    _push(registry, digest, keys / "keys" / "build.key", [])
    rotated = _policy(keys, ["build-new", "build"])  # the new key beside the old
    evidence = _read(registry, digest, rotated)
    old = rotated.keys["build"].key_id
    assert evidence.signed_by == [old]
    pin = Pin.model_construct(host="gpu-1", allow_unsigned=False, evidence_keys=[old])
    assert trust_drifts(pin, rotated) == []
    refuse_revoked([pin], rotated)  # deploy --apply goes ahead
    document = json.loads((keys / "trust.yaml").read_text())
    del document["keys"]["build"]
    document["purposes"]["build"] = ["build-new"]
    (keys / "trust.yaml").write_text(json.dumps(document))
    retired = load_policy(keys / "trust.yaml")
    with pytest.raises(Untrusted, match="unknown key"):
        _read(registry, digest, retired)
    drifts = trust_drifts(pin, retired)
    assert [d.name for d in drifts] == ["revoked"] and old[:16] in drifts[0].detail
    with pytest.raises(StackError, match="gpu-1: its evidence rested on key"):
        refuse_revoked([pin], retired)  # deploy --apply starts nothing
    unsigned_pin = Pin.model_construct(allow_unsigned=True, evidence_keys=[])
    assert [d.name for d in trust_drifts(unsigned_pin, retired)] == ["unsigned"]


EV_SIGNED = unique("ev-signed")


def test_push_signs_and_pin_from_another_folder_relies_on_it_then_refuses_a_forgery(
    tiny_variant: Any,
    cli_process: Any,
    workspace: Path,
    registry: Registry,
    second_folder: Path,
    keys: Path,
    tmp_path: Path,
) -> None:
    """The commands themselves: push with the build key named by SM120_STACKS_SIGNING_KEY,
    pin under trust.yaml from a build folder with no records (the pin records the key id),
    then an attacker's self-consistent unsigned verdict makes pin exit 2, nothing pinned. A
    variant of the tiny stack: the subject is the signature, not the image's content."""
    from builder.image.records import load_record, save_record
    from builder.manifest.resolve import resolve
    from builder.render.context import render

    name = tiny_variant(EV_SIGNED, "env:\n  EVIDENCE_TEST: 'signed'")
    cli_process("build", name)
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    record = load_record(workspace / "build", name, content_hash)
    record.static, record.served = "passed", [_served(CPU)]
    save_record(workspace / "build", record)
    build_key = keys / "keys" / "build.key"
    pushed = cli_process(
        "push", name, "--registry", registry.host, env={"SM120_STACKS_SIGNING_KEY": str(build_key)}
    )
    assert build_key.read_text().splitlines()[1] not in pushed.stdout + pushed.stderr
    digest = pushed.stdout.strip().splitlines()[0].rpartition("@")[2]

    shutil.copy(workspace / "stacks" / f"{name}.yaml", second_folder / "stacks")
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    policy = _policy(keys, ["build"], {CPU: ["build"]})
    shutil.copytree(keys / "keys", hosts / "keys")
    shutil.copy(policy.path, hosts / "trust.yaml")
    host = unique("signed-host")
    args = ("pin", host, name, "--registry", registry.host, "--gpus", "none")
    folder = ("--stacks-dir", str(second_folder / "stacks"), "--build-dir")
    pinned = cli_process(*folder, str(second_folder / "build"), "--hosts-dir", str(hosts), *args)
    assert f"@{digest}" in pinned.stdout and "signed by: build (" in pinned.stdout
    pin_file = (hosts / f"{host}.yaml").read_text()
    assert policy.keys["build"].key_id in pin_file
    shown = cli_process(
        *folder,
        str(second_folder / "build"),
        "--hosts-dir",
        str(hosts),
        "evidence",
        name,
        "--registry",
        registry.host,
    )
    assert f"signed by: build ({policy.keys['build'].key_id[:16]})" in shown.stdout

    forged = json.loads(_documents(registry, digest, [_served(CPU)])["verdict"])
    forged["recorded_at"] = "2099-01-01T00:00:00Z"
    _attach(registry, digest, "verdict", documents.canonical(forged), None)
    (hosts / f"{host}.yaml").unlink()
    # issue 43: an unsigned extra beside signed evidence is ignored and named, not a refusal
    # (a registry writer would otherwise stop every roll), and the pin rests on the signed.
    again = cli_process(*folder, str(second_folder / "build"), "--hosts-dir", str(hosts), *args)
    assert "ignored 1 unsigned document(s)" in again.stderr, again.stderr
    assert policy.keys["build"].key_id in (hosts / f"{host}.yaml").read_text()
