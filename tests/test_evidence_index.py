"""The signed, versioned index of an image's evidence (builder/evidence/index.py): read, a
listed document gone, and a rollback against what the hosts folder relied on. The registry
side (push and smoke --record publishing it, pin and deploy refusing) is
tests/engine/test_evidence_index.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from builder.errors import StackError
from builder.evidence.index import (
    INDEX_PREDICATE,
    SEEN_FILE,
    EvidenceIndex,
    missing_documents,
    parse_index,
    refuse_incomplete,
    refuse_rollback,
    remember,
    seen_version,
)
from builder.evidence.trust import Untrusted

A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
IMAGE = "127.0.0.1:5000/sm120-stacks@sha256:" + "c" * 64


def _payload(documents: list[dict[str, Any]], version: Any = 1) -> bytes:
    return json.dumps(
        {
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": "r", "digest": {"sha256": "c" * 64}}],
            "predicateType": INDEX_PREDICATE,
            "predicate": {
                "schema": "sm120-stacks/evidence-index/v1",
                "version": version,
                "documents": documents,
            },
        }
    ).encode()


def test_an_index_is_read_with_its_version_and_documents() -> None:
    index = parse_index(
        _payload([{"digest": A, "kind": "verdict"}, {"digest": B, "kind": "sbom"}], 3), "idx"
    )
    assert index.version == 3 and index.documents == {A: "verdict", B: "sbom"}


def test_an_index_that_is_not_json_is_refused_naming_it() -> None:
    with pytest.raises(StackError) as refused:
        parse_index(b'{"_type": \n oops', "evidence index sha256:1234")
    assert "evidence index sha256:1234: it is not JSON" in refused.value.message
    assert refused.value.line == 2 and "nothing was pinned" in str(refused.value.hint)


def test_an_index_listing_a_digest_twice_is_refused_naming_the_digest() -> None:
    twice = [{"digest": A, "kind": "verdict"}, {"digest": A, "kind": "verdict"}]
    with pytest.raises(StackError, match=f"documents\\[1\\]: it lists {A} twice"):
        parse_index(_payload(twice), "idx")


@pytest.mark.parametrize("version", [0, -1, "2", 1.5, None, True])
def test_an_index_without_a_whole_positive_version_is_refused(version: Any) -> None:
    with pytest.raises(StackError, match="with a version of 1 or more"):
        parse_index(_payload([], version), "idx")


def test_a_listed_document_gone_from_the_registry_is_refused() -> None:
    index = EvidenceIndex(2, {A: "verdict", B: "verdict"}, "f" * 64)
    assert missing_documents(index, [A, B, "sha256:other"]) == []
    refuse_incomplete(index, [A, B], IMAGE)
    assert missing_documents(index, [A]) == [f"verdict {B}"]
    with pytest.raises(Untrusted) as refused:
        refuse_incomplete(index, [A], IMAGE)
    assert f"(version 2, signed by key {'f' * 16}) lists verdict {B}" in refused.value.message
    assert "no longer holds it" in refused.value.message


def test_an_older_index_than_the_folder_relied_on_is_a_rollback(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    refuse_rollback(hosts, IMAGE, None)  # nothing seen: evidence from before indexes is read
    remember(hosts, IMAGE, 2)
    assert seen_version(hosts, IMAGE) == 2 and seen_version(hosts, "other@sha256:x") == 0
    refuse_rollback(hosts, IMAGE, 2)
    refuse_rollback(hosts, IMAGE, 3)
    with pytest.raises(Untrusted, match="relied on version 2") as older:
        refuse_rollback(hosts, IMAGE, 1)
    assert older.value.file == hosts / SEEN_FILE and "version 1" in older.value.message
    with pytest.raises(Untrusted, match="no signed index"):
        refuse_rollback(hosts, IMAGE, None)  # the newer index removed, none left
    remember(hosts, IMAGE, 1)  # never lowered
    assert seen_version(hosts, IMAGE) == 2
    remember(hosts, "other@sha256:x", 5)
    saved = json.loads((hosts / SEEN_FILE).read_text())
    assert saved["images"] == {IMAGE: 2, "other@sha256:x": 5}
    assert sorted(p.name for p in hosts.iterdir()) == [SEEN_FILE]  # no temporary, no lock file


def test_a_bad_record_of_versions_is_exit_2_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / SEEN_FILE).write_text("{not json")
    with pytest.raises(StackError) as refused:
        seen_version(tmp_path, IMAGE)
    assert refused.value.file == tmp_path / SEEN_FILE and refused.value.key == "images"
