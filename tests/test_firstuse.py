"""Trust on first use's written policy (builder/evidence/firstuse.py), without a registry:
what it writes reads back as the policy it learned, names each key's id and fingerprint, and
never replaces a trust.yaml that is already there."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.errors import StackError
from builder.evidence.firstuse import Learned, write_learned
from builder.evidence.keys import fingerprint, generate_key_pair, load_public_key
from builder.evidence.trust import load_policy

RTX = 'NVIDIA RTX PRO 6000 "Blackwell" Server Edition'


def _learned(tmp_path: Path) -> tuple[Learned, str]:
    generate_key_pair(tmp_path / "made", "build")
    key = load_public_key(tmp_path / "made" / "build.pub")
    learned = Learned(tmp_path / "hosts" / "trust.yaml")
    learned.add(key, "build", None)
    learned.add(key, "served", RTX)
    learned.add(key, "served", "cpu")
    return learned, key.key_id


def test_what_first_use_writes_reads_back_as_what_it_learned(tmp_path: Path) -> None:
    learned, key_id = _learned(tmp_path)
    said = write_learned(learned, [key_id], "pin")
    policy = load_policy(learned.path)
    name = f"first-use-{key_id[:12]}"
    assert policy.build == (name,) and policy.served == {RTX: (name,), "cpu": (name,)}
    assert policy.keys[name].key_id == key_id
    text = learned.path.read_text()
    assert text.startswith("# Written by `pin` on first use") and fingerprint(key_id) in text
    assert f"key id {key_id}" in said[0] and f"served on {RTX}" in said[0]


def test_first_use_never_replaces_a_policy_and_writes_no_key_it_did_not_rely_on(
    tmp_path: Path,
) -> None:
    learned, key_id = _learned(tmp_path)
    assert write_learned(learned, [], "pin") == [] and not learned.path.exists()
    learned.path.parent.mkdir(parents=True)
    learned.path.write_text("version: 1\n")
    with pytest.raises(StackError, match="a trust policy appeared"):
        write_learned(learned, [key_id], "pin")
    assert learned.path.read_text() == "version: 1\n"


def test_cache_commands_run_no_code_of_an_image_no_policy_verified(tmp_path: Path) -> None:
    """With no trust.yaml, `cache list/prove/capture` refuse before the engine is asked to
    run the pinned image (issue 43), naming how to get a policy."""
    from builder.hosts.pins import Pin
    from builder.hosts.trustdrift import refuse_ungated

    pin = Pin.model_construct(host="gpu-1", image="r.example/sm120-stacks@sha256:" + "a" * 64)
    with pytest.raises(StackError, match="no trust policy") as refused:
        refuse_ungated(pin, tmp_path / "hosts")
    assert "deploy gpu-1 --apply` trusts its signer on first use" in str(refused.value.hint)
    assert not (tmp_path / "hosts").exists()
