"""Completeness and freshness of an image's evidence (issue 43, item 6), against a registry
writer with push access only (tests/support/registry_attacker.py: the plain HTTP API, a key of
its own, no code of this tool).

`push --signing-key` publishes a signed index of the evidence (version 1), `smoke --record`
the next version (evidence/attach.py `attach_served`, as the command runs it); `pin` and
`deploy --apply` refuse an index that lists a document the registry no longer holds, and one
older than the newest the hosts folder relied on (evidence/index.py). Each test pushes its own
tiny variant (its own image digest, so its own referrers).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder.errors import StackError
from builder.evidence import documents
from builder.evidence.attach import attach_served
from builder.evidence.decision import relied_evidence
from builder.evidence.firstuse import learn
from builder.evidence.index import INDEX_PREDICATE, INDEX_TYPE, SEEN_FILE, index_signers
from builder.evidence.keys import generate_key_pair, load_signing_key
from builder.evidence.oci import ArtifactStore
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE, PREDICATE_OF_KIND
from builder.evidence.trust import Untrusted, load_policy
from builder.hosts.evidence_gate import vouch_for_deploy
from builder.hosts.pins import Pin
from builder.image.records import Record, ServedVerdict
from builder.image.registry import Registry
from builder.manifest.resolve import resolve
from builder.render.context import render
from tests.support import registry_attacker as attacker_kit
from tests.support.registry_attacker import Attacker
from tests.support.signed_evidence import TYPES, evidence_documents

pytestmark = pytest.mark.engine
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def _pushed(
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    key: Path,
    name: str,
) -> tuple[str, str, str]:
    """A tiny variant of its own name (so its own image digest and referrers) built, tested
    and pushed with signed evidence: (stack, content hash, REPOSITORY@DIGEST); push said it
    published the index."""
    name = tiny_variant(name, "")
    cli_process("build", name)
    cli_process("test", name)
    pushed = cli_process("push", name, "--registry", registry.host, "--signing-key", str(key))
    assert "evidence: index sha256:" in pushed.stderr, pushed.stderr
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    return name, content_hash, pushed.stdout.strip().splitlines()[0]


def _policy(hosts: Path, build_key: Path, operator_key: Path) -> None:
    """trust.yaml: the build key for build, the operator's for served on RTX."""
    hosts.mkdir(parents=True, exist_ok=True)
    (hosts / "trust.yaml").write_text(
        "version: 1\n"
        f"keys:\n  build: {build_key.with_suffix('.pub')}\n"
        f"  ops: {operator_key.with_suffix('.pub')}\n"
        f"purposes:\n  build: [build]\n  served:\n    {json.dumps(RTX)}: [ops]\n"
    )


def _record_served(
    registry: Registry, stack: str, content_hash: str, ref: str, key: Path, hosts: Path
) -> str:
    """A served verdict on RTX that failed, recorded and signed by the operator's key as
    `smoke --url --record --signing-key` records it; the verdict artifact's digest."""
    verdict = ServedVerdict(
        gpu_kind=RTX,
        gpu_count=1,
        model_id="/models/tiny",
        serve_args=["serve"],
        passed=False,
        source="smoke --url",
        at="2026-12-06T00:00:00Z",
    )
    record = Record(stack=stack, content_hash=content_hash)
    signers = index_signers(load_policy(hosts / "trust.yaml"))
    signer = load_signing_key(key)
    digest = ref.rsplit("@", 1)[1]
    return attach_served(registry, digest, record, verdict, {}, signer, signers).digest


def _rely(hosts: Path, registry: Registry, stack: str, content_hash: str) -> Any:
    return relied_evidence(hosts, registry, stack, content_hash)


@pytest.fixture
def operator_key(tmp_path: Path) -> Path:
    generate_key_pair(tmp_path / "ops-keys", "ops")
    return tmp_path / "ops-keys" / "ops.key"


def test_a_removed_failed_verdict_is_refused_by_pin(
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    tiny_signing_key: Path,
    operator_key: Path,
    tmp_path: Path,
) -> None:
    """The operator records a failed served verdict (index version 2); the writer takes it
    out of the referrers: the index still lists it, so `pin` refuses (exit 2, nothing
    pinned), where it used to accept the image again."""
    stack, content_hash, ref = _pushed(
        tiny_variant, cli_process, workspace, registry, tiny_signing_key, "ci-tiny-removed"
    )
    # What `smoke --record` builds on where its machine has no trust.yaml: the index of the
    # key first use would trust (the build key), nothing written.
    nowhere = tmp_path / "no-policy" / "trust.yaml"
    learned = learn(ArtifactStore(registry), ref.rsplit("@", 1)[1], nowhere).policy()
    build_id = load_signing_key(tiny_signing_key).key_id
    assert [k.key_id for k in index_signers(learned)] == [build_id]
    assert not nowhere.parent.exists()
    hosts = tmp_path / "hosts"
    _policy(hosts, tiny_signing_key, operator_key)
    assert _rely(hosts, registry, stack, content_hash).evidence.index_version == 1
    failed = _record_served(registry, stack, content_hash, ref, operator_key, hosts)
    relied = _rely(hosts, registry, stack, content_hash)
    assert relied.evidence.index_version == 2
    served = relied.evidence.verdicts.served_on(RTX)
    assert served is not None and not served.passed

    digest = ref.rsplit("@", 1)[1]
    writer = Attacker(registry.host, "sm120-stacks")
    writer.remove_referrer(digest, failed)
    with pytest.raises(Untrusted) as refused:
        _rely(hosts, registry, stack, content_hash)
    assert f"lists verdict {failed}" in refused.value.message
    assert "no longer holds it" in refused.value.message

    pin = subprocess.run(
        [
            *(sys.executable, "-m", "builder", "--stacks-dir", str(workspace / "stacks")),
            *("--build-dir", str(tmp_path / "build"), "--hosts-dir", str(hosts)),
            *("pin", "gpu-1", stack, "--registry", registry.host),
            *("--gpus", "none", "--gpu-kind", RTX, "--allow-unserved"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert pin.returncode == 2, pin.stdout + pin.stderr
    assert failed[:19] in pin.stderr and "no longer holds it" in pin.stderr, pin.stderr
    assert "Traceback" not in pin.stderr and not (hosts / "gpu-1.yaml").exists()


def test_a_replayed_older_index_is_refused_by_pin_and_deploy(
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    tiny_signing_key: Path,
    operator_key: Path,
    tmp_path: Path,
) -> None:
    """The writer's own signed verdict beside a signed index is ignored and named; the
    writer then takes out version 2 and the verdict it added, leaving a whole, older,
    signed set: a hosts folder that relied on version 2 refuses it (pin and deploy)."""
    stack, content_hash, ref = _pushed(
        tiny_variant, cli_process, workspace, registry, tiny_signing_key, "ci-tiny-replayed"
    )
    repository, digest = ref.rsplit("@", 1)
    hosts = tmp_path / "hosts"
    _policy(hosts, tiny_signing_key, operator_key)
    served = _record_served(registry, stack, content_hash, ref, operator_key, hosts)
    writer = Attacker(registry.host, "sm120-stacks")

    # The writer's own signed verdict (its key published beside it): not listed, not read.
    forged_key = attacker_kit.new_key()
    forged = json.loads(evidence_documents(ref, stack, content_hash, [])["verdict"])
    forged["static"] = "failed"
    body = attacker_kit.envelope(
        attacker_kit.statement(repository, digest, PREDICATE_OF_KIND["verdict"], forged),
        forged_key,
    )
    extra = writer.attach(
        digest,
        TYPES["verdict"],
        ENVELOPE_MEDIA_TYPE,
        body,
        {
            documents.SUBJECT_ANNOTATION: digest,
            documents.KIND_ANNOTATION: "verdict",
            documents.SIGNER_KEY_ANNOTATION: attacker_kit.public_pem(forged_key),
        },
    )
    # And its own signed index, of a bigger version, listing that verdict: no trusted key
    # signed it, so it is ignored and named too.
    predicate = {
        "schema": "sm120-stacks/evidence-index/v1",
        "version": 99,
        "documents": [{"digest": extra, "kind": "verdict"}],
    }
    forged_index = writer.attach(
        digest,
        INDEX_TYPE,
        ENVELOPE_MEDIA_TYPE,
        attacker_kit.envelope(
            attacker_kit.statement(repository, digest, INDEX_PREDICATE, predicate), forged_key
        ),
        {documents.SUBJECT_ANNOTATION: digest, documents.KIND_ANNOTATION: "index"},
    )
    relied = _rely(hosts, registry, stack, content_hash)
    assert relied.evidence.index_version == 2 and relied.evidence.verdicts.static == "passed"
    assert sorted(relied.evidence.unlisted) == sorted(
        [f"verdict {extra}", f"index {forged_index} (no trusted key signed it)"]
    )
    assert any("does not list" in line and extra in line for line in relied.said), relied.said
    assert json.loads((hosts / SEEN_FILE).read_text())["images"] == {ref: 2}

    [newest] = [
        a["_digest"]
        for a in writer.artifacts(digest)
        if a["artifactType"] == INDEX_TYPE
        and a["_digest"] not in (_first_index(writer, digest), forged_index)
    ]
    writer.remove_referrer(digest, newest)
    writer.remove_referrer(digest, served)
    with pytest.raises(Untrusted, match="rolled back") as refused:
        _rely(hosts, registry, stack, content_hash)
    assert "version 1" in refused.value.message and "relied on version 2" in refused.value.message

    pin = Pin.model_construct(
        host="gpu-1",
        image=ref,
        stack=stack,
        content_hash=content_hash,
        allow_unsigned=False,
        served_on=None,
        evidence_keys=[],
    )
    with pytest.raises(StackError, match="rolled back") as deploy:
        vouch_for_deploy([pin], hosts)
    assert "refusing to deploy" in deploy.value.message

    # What TUF's timestamp role would add, and this does not: a folder that never saw
    # version 2 cannot tell it existed (docs/evidence.md, threat model).
    fresh = tmp_path / "fresh-hosts"
    _policy(fresh, tiny_signing_key, operator_key)
    assert _rely(fresh, registry, stack, content_hash).evidence.index_version == 1


def _first_index(writer: Attacker, digest: str) -> str:
    """The index push published (version 1): the one whose documents the push attached."""
    for artifact in writer.artifacts(digest):
        if artifact["artifactType"] != INDEX_TYPE:
            continue
        envelope = json.loads(writer.blob(artifact["layers"][0]["digest"]))
        payload = json.loads(base64.b64decode(envelope["payload"]))
        if payload["predicate"]["version"] == 1:
            return str(artifact["_digest"])
    raise AssertionError("push published no index of version 1")
