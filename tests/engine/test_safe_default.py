"""Safe by default (issue 43): a host folder with no trust.yaml, against a registry writer with
push access only (tests/support/registry_attacker.py: the registry's plain HTTP API, a key of
its own, no code of this tool).

What a new user's `pin`, `pull`, `build --pull-or-build` and `deploy --apply` rely on is read by
evidence/decision.py: the key that signed the evidence is trusted on first use (its id and
fingerprint said, trust.yaml written), a changed key is refused with how to rotate, unsigned
evidence is refused unless --allow-unsigned, and an envelope whose signature does not verify
is refused policy or not. Each case is its own repository (the local base pushed under a
fresh namespace) and its own hosts folder.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.errors import StackError
from builder.evidence import documents
from builder.evidence.decision import relied_evidence
from builder.evidence.keys import fingerprint, generate_key_pair, load_signing_key
from builder.evidence.reader import read_evidence
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE, PREDICATE_OF_KIND
from builder.evidence.trust import Untrusted, load_policy
from builder.image.records import CPU, ServedVerdict
from builder.image.registry import Registry, RegistryError, pull
from tests.engine.conftest import pushed_local_base, unique
from tests.support import registry_attacker as attacker_kit
from tests.support.registry_attacker import Attacker
from tests.support.signed_evidence import TYPES, attach_evidence, evidence_documents

pytestmark = pytest.mark.engine
STACK, CONTENT = "trust-test", "c" * 64


@pytest.fixture(scope="module")
def build_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("safe-keys")
    generate_key_pair(folder, "build")
    return folder / "build.key"


@pytest.fixture
def image(api: Any, engine: Any, registry: Registry) -> Iterator[tuple[str, Attacker]]:
    """A fresh repository holding one image: (REPOSITORY@DIGEST, its registry writer)."""
    namespace = unique(f"safe-{os.urandom(3).hex()}")
    with pushed_local_base(api, engine, registry, f"{namespace}/sm120-stacks") as ref:
        yield ref, Attacker(registry.host, f"{namespace}/sm120-stacks")


def _served() -> ServedVerdict:
    return ServedVerdict(
        gpu_kind=CPU,
        gpu_count=0,
        model_id="/models/tiny",
        serve_args=["serve"],
        compiles={},
        ttft_s=0.2,
        passed=True,
        source="test",
        at="2026-12-01T00:00:00Z",
    )


def _rely(hosts: Path, ref: str, **more: Any) -> Any:
    repository, digest = ref.rsplit("@", 1)
    registry = Registry.parse(repository.removesuffix("/sm120-stacks"))
    return relied_evidence(hosts, registry, STACK, reference=digest, **more)


def _forge(attacker: Attacker, ref: str, key: Any, published: bool = True, **changes: Any) -> None:
    """The three documents, made and signed by the attacker (its own key, published beside
    each as push publishes a signer's), every field of the verdict as changes say."""
    repository, digest = ref.rsplit("@", 1)
    made = evidence_documents(ref, STACK, CONTENT, [_served()])
    for kind, payload in made.items():
        document = json.loads(payload)
        if kind == "verdict":
            document.update(changes)
        if kind == "provenance":
            statement = document
        else:
            statement = attacker_kit.statement(
                repository, digest, PREDICATE_OF_KIND[kind], document
            )
        annotations = {documents.SUBJECT_ANNOTATION: digest, documents.KIND_ANNOTATION: kind}
        if published:
            annotations[documents.SIGNER_KEY_ANNOTATION] = attacker_kit.public_pem(key)
        body = attacker_kit.envelope(statement, key)
        attacker.attach(digest, TYPES[kind], ENVELOPE_MEDIA_TYPE, body, annotations)


def _unsigned(attacker: Attacker, ref: str, kinds: tuple[str, ...], **changes: Any) -> None:
    digest = ref.rsplit("@", 1)[1]
    for kind, payload in evidence_documents(ref, STACK, CONTENT, [_served()]).items():
        if kind not in kinds:
            continue
        document = json.loads(payload)
        if kind == "verdict":
            document.update(changes)
        annotations = {documents.SUBJECT_ANNOTATION: digest, documents.KIND_ANNOTATION: kind}
        attacker.attach(
            digest, TYPES[kind], TYPES[kind], json.dumps(document).encode(), annotations
        )


def test_first_use_trusts_the_signer_for_what_it_signed_and_writes_trust_yaml(
    image: tuple[str, Attacker], build_key: Path, tmp_path: Path
) -> None:
    ref, _ = image
    attach_evidence(ref, STACK, CONTENT, build_key, [_served()])  # as push --signing-key does
    hosts = tmp_path / "hosts"
    relied = _rely(hosts, ref)
    key_id = load_signing_key(build_key).key_id
    said = "\n".join(relied.said)
    assert f"key id {key_id}" in said and fingerprint(key_id) in said, said
    assert "for build, served on cpu" in said and str(hosts / "trust.yaml") in said
    assert relied.evidence.verdicts.static == "passed" and relied.evidence.signed_by == [key_id]
    written = load_policy(hosts / "trust.yaml")
    name = f"first-use-{key_id[:12]}"
    assert written.build == (name,) and written.served == {CPU: (name,)}
    assert written.keys[name].key_id == key_id
    assert fingerprint(key_id) in (hosts / "trust.yaml").read_text()
    again = _rely(hosts, ref)  # read under the written policy now: nothing more said
    assert again.said == [] and again.evidence.signed_by == [key_id]


def test_after_first_use_a_changed_key_is_refused_with_how_to_rotate(
    image: tuple[str, Attacker], build_key: Path, tmp_path: Path
) -> None:
    ref, attacker = image
    attach_evidence(ref, STACK, CONTENT, build_key, [_served()])
    hosts = tmp_path / "hosts"
    _rely(hosts, ref)
    before = (hosts / "trust.yaml").read_text()
    # The writer re-signs the whole evidence with its own key (and publishes that key).
    forged_key = attacker_kit.new_key()
    for artifact in attacker.artifacts(ref.rsplit("@", 1)[1]):
        attacker.remove_referrer(ref.rsplit("@", 1)[1], artifact["_digest"])
    _forge(attacker, ref, forged_key)
    with pytest.raises(Untrusted) as refused:
        _rely(hosts, ref)
    forged_id = attacker_kit.key_id(forged_key)
    assert "unknown key (not in the trust policy)" in refused.value.message
    assert forged_id[:16] in refused.value.message
    assert fingerprint(forged_id) in refused.value.message
    assert "rotated it on purpose" in str(refused.value.hint)
    assert (hosts / "trust.yaml").read_text() == before  # nothing learned from it


def test_unsigned_evidence_with_no_policy_is_refused_with_the_two_ways_on(
    image: tuple[str, Attacker], tmp_path: Path
) -> None:
    ref, attacker = image
    _unsigned(attacker, ref, ("verdict", "sbom", "provenance"))
    hosts = tmp_path / "hosts"
    with pytest.raises(Untrusted) as refused:
        _rely(hosts, ref)
    assert "unsigned [no key]" in refused.value.message
    hint = str(refused.value.hint)
    assert "--signing-key" in hint and "--allow-unsigned" in hint and "trust.yaml" in hint
    assert not (hosts / "trust.yaml").exists()
    allowed = _rely(hosts, ref, allow_unsigned=True)  # migration: recorded by the caller
    assert len(allowed.evidence.unsigned) == 3 and "no key was trusted" in allowed.said[0]
    assert not (hosts / "trust.yaml").exists()


def test_a_signature_that_does_not_verify_is_refused_with_no_policy(
    image: tuple[str, Attacker], build_key: Path, tmp_path: Path
) -> None:
    """The writer takes the build key's envelope, flips the verdict inside, and keeps the
    signature and the published key: never read as a plain document, policy or not."""
    ref, attacker = image
    digest = ref.rsplit("@", 1)[1]
    attach_evidence(ref, STACK, CONTENT, build_key, [_served()])
    [verdict] = [a for a in attacker.artifacts(digest) if a["artifactType"] == TYPES["verdict"]]
    envelope = json.loads(attacker.blob(verdict["layers"][0]["digest"]))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["static"] = "failed"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    attacker.remove_referrer(digest, verdict["_digest"])
    attacker.attach(
        digest,
        TYPES["verdict"],
        ENVELOPE_MEDIA_TYPE,
        json.dumps(envelope).encode(),
        verdict["annotations"],
    )
    hosts = tmp_path / "hosts"
    with pytest.raises(Untrusted, match="does not verify with the key published beside it"):
        _rely(hosts, ref)
    assert not (hosts / "trust.yaml").exists()
    registry = Registry.parse(ref.rsplit("@", 1)[0].removesuffix("/sm120-stacks"))
    with pytest.raises(Untrusted, match="signature does not match the payload"):
        read_evidence(registry, STACK, reference=digest)  # `evidence`, with no policy


def test_one_unsigned_extra_document_beside_signed_evidence_is_ignored_and_named(
    image: tuple[str, Attacker], build_key: Path, tmp_path: Path
) -> None:
    ref, attacker = image
    attach_evidence(ref, STACK, CONTENT, build_key, [_served()])
    hosts = tmp_path / "hosts"
    _rely(hosts, ref)
    _unsigned(attacker, ref, ("verdict",), static="failed", recorded_at="2099-01-01T00:00:00Z")
    relied = _rely(hosts, ref)
    assert relied.evidence.verdicts.static == "passed"
    assert len(relied.evidence.ignored) == 1 and relied.evidence.ignored[0].startswith("verdict ")
    assert "ignored 1 unsigned document(s)" in relied.said[0]


def test_the_tag_moved_between_verify_and_pull_pulls_what_was_verified(
    api: Any, engine: Any, image: tuple[str, Attacker]
) -> None:
    """The content tag names image A, whose evidence was verified; the writer then points the
    tag at its own image B. The pull asks for A by digest and checks the id: B never lands."""
    ref, attacker = image
    digest = ref.rsplit("@", 1)[1]
    tag = f"{STACK}-{CONTENT[:16]}"

    def labelled(label: str) -> tuple[str, str]:
        """An image of the base's layers with a config of its own: (manifest, config)."""
        body, media_type = attacker.manifest(digest)
        manifest = json.loads(body)
        config = json.loads(attacker.blob(manifest["config"]["digest"]))
        config["config"].setdefault("Labels", {})
        config["config"]["Labels"] = {
            **(config["config"]["Labels"] or {}),
            "sm120-stacks.content-hash": CONTENT[:16] if label == "a" else "evil",
            "test.which": label,
        }
        raw_config = json.dumps(config).encode()
        manifest["config"] = {
            **manifest["config"],
            "digest": attacker.put_blob(raw_config),
            "size": len(raw_config),
        }
        raw = json.dumps(manifest).encode()
        made = attacker.put_manifest(tag, raw, media_type)
        return made, manifest["config"]["digest"]

    verified = labelled("a")  # what the evidence check resolved the tag to
    moved = labelled("b")  # the tag moved before the engine pulls
    assert attacker.manifest(tag)[0] and moved[0] != verified[0]
    registry = Registry.parse(ref.rsplit("@", 1)[0].removesuffix("/sm120-stacks"))
    pulled = pull(engine, registry, STACK, CONTENT[:16], verified=verified)
    try:
        assert pulled.id == verified[1]
        assert pulled.labels["test.which"] == "a"
        with pytest.raises(RegistryError, match="verified manifest names config"):
            pull(engine, registry, STACK, CONTENT[:16], verified=(verified[0], moved[1]))
    finally:
        for image_id in (verified[1],):
            with __import__("contextlib").suppress(Exception):
                api.images.remove(image_id, force=True)


def test_a_trust_yaml_edited_badly_after_first_use_is_exit_2_with_file_and_line(
    image: tuple[str, Attacker], build_key: Path, tmp_path: Path
) -> None:
    ref, _ = image
    attach_evidence(ref, STACK, CONTENT, build_key, [_served()])
    hosts = tmp_path / "hosts"
    _rely(hosts, ref)
    text = (hosts / "trust.yaml").read_text()
    (hosts / "trust.yaml").write_text(text.replace("  build: [", "  build: [nobody, "))
    with pytest.raises(StackError) as refused:
        _rely(hosts, ref)
    assert "no key named 'nobody'" in refused.value.message
    assert refused.value.file == hosts / "trust.yaml" and refused.value.line is not None
    assert refused.value.key == "purposes.build[0]"


def test_drift_re_verifies_the_pinned_evidence_under_the_current_policy(
    image: tuple[str, Attacker], build_key: Path, tmp_path: Path
) -> None:
    """A key kept under `keys:` but taken out of the purpose it signed for: drift reports it
    (it used to check key ids only), names what to do, and writes nothing."""
    from builder.hosts.pins import Pin
    from builder.hosts.trustdrift import evidence_drifts, refuse_ungated

    ref, _ = image
    attach_evidence(ref, STACK, CONTENT, build_key, [_served()])
    hosts = tmp_path / "hosts"
    _rely(hosts, ref)
    pin = Pin.model_construct(
        host="gpu-1",
        image=ref,
        stack=STACK,
        content_hash=CONTENT,
        allow_unsigned=False,
        served_on=None,
        evidence_keys=[],
    )
    assert evidence_drifts(pin, load_policy(hosts / "trust.yaml")) == []
    assert evidence_drifts(pin, None) == []  # no policy: nothing read, nothing learned
    text = (hosts / "trust.yaml").read_text()
    name = f"first-use-{load_signing_key(build_key).key_id[:12]}"
    (hosts / "trust.yaml").write_text(text.replace(f"  build: [{name}]", "  build: []"))
    before = sorted(p.name for p in hosts.rglob("*"))
    [drift] = evidence_drifts(pin, load_policy(hosts / "trust.yaml"))
    assert drift.name == "evidence" and "key not trusted for build" in drift.detail
    assert "pin gpu-1 again" in drift.detail
    assert sorted(p.name for p in hosts.rglob("*")) == before
    # `cache list/prove/capture` run a helper container of the pinned image: refused first.
    with pytest.raises(StackError, match="fails the trust policy") as refused:
        refuse_ungated(pin, hosts)
    assert "key not trusted for build" in refused.value.message
    (hosts / "trust.yaml").write_text(text)
    refuse_ungated(pin, hosts)  # passes again: the policy names the key for build


def test_first_use_refuses_build_documents_signed_by_two_keys(
    image: tuple[str, Attacker], build_key: Path, tmp_path: Path
) -> None:
    """The writer adds its own signed verdict beside the build key's before the host's first
    use: ssh trusts one host key, and so does first use; nothing is trusted or written."""
    ref, attacker = image
    attach_evidence(ref, STACK, CONTENT, build_key, [_served()])
    forged_key = attacker_kit.new_key()
    repository, digest = ref.rsplit("@", 1)
    forged = json.loads(evidence_documents(ref, STACK, CONTENT, [_served()])["verdict"])
    forged["recorded_at"] = "2099-01-01T00:00:00Z"
    body = attacker_kit.envelope(
        attacker_kit.statement(repository, digest, PREDICATE_OF_KIND["verdict"], forged),
        forged_key,
    )
    annotations = {
        documents.SUBJECT_ANNOTATION: digest,
        documents.KIND_ANNOTATION: "verdict",
        documents.SIGNER_KEY_ANNOTATION: attacker_kit.public_pem(forged_key),
    }
    attacker.attach(digest, TYPES["verdict"], ENVELOPE_MEDIA_TYPE, body, annotations)
    hosts = tmp_path / "hosts"
    with pytest.raises(Untrusted, match="the build documents are signed by 2 keys"):
        _rely(hosts, ref)
    assert not (hosts / "trust.yaml").exists()


def test_smoke_record_signs_for_the_digest_the_server_runs(
    api: Any, engine: Any, image: tuple[str, Attacker]
) -> None:
    """A local server is read through the engine: the digest recorded is the one whose config
    is the running container's image; a content tag naming another image is refused; a
    remote server needs --image REPO@sha256 (in the registry the verdict goes to)."""
    from builder.cli.served_image import served_digest
    from tests.support.net import free_port

    ref, attacker = image
    repository, digest = ref.rsplit("@", 1)
    target = Registry.parse(repository.removesuffix("/sm120-stacks"))
    port = free_port()
    container = api.containers.run(
        ref,
        ["python3", "-m", "http.server", "8000"],
        detach=True,
        name=unique(f"safe-smoke-{os.urandom(3).hex()}"),
        ports={"8000/tcp": ("127.0.0.1", port)},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        assert served_digest(url, None, target, engine, digest) == digest
        body, media_type = attacker.manifest(digest)
        manifest = json.loads(body)
        config = json.loads(attacker.blob(manifest["config"]["digest"]))
        config["config"]["Labels"] = {"test.which": "another"}
        raw_config = json.dumps(config).encode()
        manifest["config"] = {
            **manifest["config"],
            "digest": attacker.put_blob(raw_config),
            "size": len(raw_config),
        }
        raw = json.dumps(manifest).encode()
        other = attacker.put_manifest("moved", raw, media_type)
        with pytest.raises(StackError, match="nothing recorded") as refused:
            served_digest(url, None, target, engine, other)
        assert refused.value.key == "--image"
    finally:
        container.remove(force=True)
    with pytest.raises(StackError, match="cannot tell which image") as remote:
        served_digest("http://gpu-1.example:8000", None, target, engine, digest)
    assert "--image REPO@sha256" in str(remote.value.hint)
    assert served_digest("http://gpu-1.example:8000", ref, target, engine, "x") == digest
    with pytest.raises(StackError, match="the verdict goes to"):
        served_digest("http://h:1", f"127.0.0.1:5000/elsewhere@{digest}", target, engine, "x")
    with pytest.raises(StackError, match="is not REPO@sha256"):
        served_digest("http://h:1", "repo:tag", target, engine, "x")


TINY = "ci-tiny"  # stacks/ci-tiny.yaml (issue 41's tiny stack): only its manifest is used here


@pytest.fixture
def tiny_in_registry(
    engine: Any, api: Any, registry: Registry, build_key: Path, tmp_path: Path
) -> Iterator[tuple[str, str, Path, Attacker]]:
    """ci-tiny's content tag in a fresh namespace, holding the local base image (no build:
    `pin` reads only the registry), with evidence signed by the build key as push signs it:
    (--registry value, REPOSITORY@DIGEST, a stacks folder, the registry writer)."""
    from builder.manifest.resolve import resolve
    from builder.render.context import render
    from tests.engine.conftest import LOCAL_BASE, REPO_ROOT

    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / f"{TINY}.yaml").write_bytes((REPO_ROOT / "stacks" / f"{TINY}.yaml").read_bytes())
    content_hash = render(resolve(TINY, stacks)).content_hash()
    namespace = unique(f"safe-cli-{os.urandom(3).hex()}")
    repository = f"{registry.host}/{namespace}/sm120-stacks"
    tag = f"{TINY}-{content_hash[:16]}"
    engine.tag(LOCAL_BASE, f"{repository}:{tag}")
    try:
        digest = engine.push(repository, tag)
        ref = f"{repository}@{digest}"
        attach_evidence(ref, TINY, content_hash, build_key, [_served()])
        writer = Attacker(registry.host, f"{namespace}/sm120-stacks")
        yield f"{registry.host}/{namespace}", ref, stacks, writer
    finally:
        with __import__("contextlib").suppress(Exception):
            api.images.remove(f"{repository}:{tag}")


def _cli(tmp_path: Path, stacks: Path, hosts: Path, *args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [
            *(sys.executable, "-m", "builder", "--stacks-dir", str(stacks)),
            *("--build-dir", str(tmp_path / "build"), "--hosts-dir", str(hosts), *args),
        ],
        capture_output=True,
        text=True,
        check=False,
    )


def test_pin_with_no_trust_yaml_trusts_on_first_use_then_refuses_a_changed_key(
    tiny_in_registry: tuple[str, str, Path, Attacker], build_key: Path, tmp_path: Path
) -> None:
    """The command itself, from a build folder with no records: first use said and written,
    the pin resting on the key; the writer's re-signed evidence refused, nothing pinned; a
    trust.yaml edited badly: exit 2 with file and line, nothing pinned."""
    where, ref, stacks, attacker = tiny_in_registry
    hosts = tmp_path / "hosts"
    pin = ("pin", "--registry", where, "--gpus", "none", "--allow-unserved")

    def pinned(host: str) -> Any:
        return _cli(tmp_path, stacks, hosts, pin[0], host, TINY, *pin[1:])

    first = pinned("gpu-1")
    assert first.returncode == 0, first.stdout + first.stderr
    key_id = load_signing_key(build_key).key_id
    assert f"first use: trusted key first-use-{key_id[:12]} (key id {key_id}" in first.stderr
    assert fingerprint(key_id) in first.stderr and "signed by: first-use-" in first.stdout
    assert key_id in (hosts / "gpu-1.yaml").read_text()
    policy = (hosts / "trust.yaml").read_text()

    digest = ref.rsplit("@", 1)[1]
    for artifact in attacker.artifacts(digest):
        attacker.remove_referrer(digest, artifact["_digest"])
    _forge(attacker, ref, attacker_kit.new_key())
    refused = pinned("gpu-2")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "unknown key (not in the trust policy)" in refused.stderr
    assert "rotated it on purpose" in refused.stderr and "Traceback" not in refused.stderr
    assert not (hosts / "gpu-2.yaml").exists() and (hosts / "trust.yaml").read_text() == policy

    (hosts / "trust.yaml").write_text(policy.replace("version: 1", "version: 1\nkeys: {}"))
    bad = pinned("gpu-3")
    assert bad.returncode == 2 and "trust.yaml" in bad.stderr, bad.stderr
    assert re.search(r"trust\.yaml:\d+: keys: duplicate key", bad.stderr), bad.stderr
    assert "Traceback" not in bad.stderr
    assert not (hosts / "gpu-3.yaml").exists()
