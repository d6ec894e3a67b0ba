"""One grammar of image references (builder/engine/imageref.py) for every step that splits one:
the engine tagging an image, the SBOM naming a base, `evidence IMAGE`, and the store a pin's
image is read from. Each of them once split by hand, and two took a registry port for a tag.
"""

from __future__ import annotations

import json

import pytest

from builder.cli.evidence import image_reference
from builder.engine import imageref
from builder.engine.docker_adapter import split_tag
from builder.errors import StackError
from builder.evidence.documents import ImageContents, SbomInputs, sbom
from builder.evidence.oci import ArtifactStore

DIGEST = "sha256:" + "ab" * 32
PORT = "127.0.0.1:5000/sm120-stacks"
NAMESPACED = "registry.example.com/ml/team/sm120-stacks"

#: (reference, repository, tag, digest, host, path): a port, a namespace, a digest, tag+digest.
CASES = [
    (f"{PORT}:ci-mini-0123", PORT, "ci-mini-0123", None, "127.0.0.1:5000", "sm120-stacks"),
    (PORT, PORT, None, None, "127.0.0.1:5000", "sm120-stacks"),
    (f"{NAMESPACED}:v1", NAMESPACED, "v1", None, "registry.example.com", "ml/team/sm120-stacks"),
    (f"{PORT}@{DIGEST}", PORT, None, DIGEST, "127.0.0.1:5000", "sm120-stacks"),
    (f"{PORT}:ci-mini@{DIGEST}", PORT, "ci-mini", DIGEST, "127.0.0.1:5000", "sm120-stacks"),
    ("localhost:5000/cuda:13.0.2", "localhost:5000/cuda", "13.0.2", None, "localhost:5000", "cuda"),
    ("nvidia/cuda:13.0.2-devel", "nvidia/cuda", "13.0.2-devel", None, None, "nvidia/cuda"),
    ("ubuntu:2204", "ubuntu", "2204", None, None, "ubuntu"),  # a number after a name is a tag
]


@pytest.mark.parametrize(("ref", "repository", "tag", "digest", "host", "path"), CASES)
def test_the_grammar_splits_ports_namespaces_digests_and_tags(
    ref: str, repository: str, tag: str | None, digest: str | None, host: str | None, path: str
) -> None:
    parts = imageref.parse(ref)
    assert (parts.repository, parts.tag, parts.digest) == (repository, tag, digest)
    assert (parts.host, parts.path) == (host, path)
    assert parts.reference == (digest or tag)
    assert imageref.REFERENCE_RE.match(ref)


@pytest.mark.parametrize(
    "bad", ["Upper/Case:tag", "host:5000:tag", "repo@sha256:abc", "repo:", "", "a//b"]
)
def test_what_the_grammar_refuses_is_said(bad: str) -> None:
    with pytest.raises(ValueError, match="is not an image reference"):
        imageref.parse(bad)
    assert not imageref.REFERENCE_RE.match(bad)


@pytest.mark.parametrize(("ref", "repository", "tag", "digest", "host", "path"), CASES)
def test_the_engine_tags_by_the_grammar(
    ref: str, repository: str, tag: str | None, digest: str | None, host: str | None, path: str
) -> None:
    """A digest reference is handed to the engine whole (it names no tag to set)."""
    assert split_tag(ref) == ((ref, None) if digest else (repository, tag))


@pytest.mark.parametrize(("ref", "repository", "tag", "digest", "host", "path"), CASES)
def test_evidence_reads_the_digest_else_the_tag(
    ref: str, repository: str, tag: str | None, digest: str | None, host: str | None, path: str
) -> None:
    if digest is None and tag is None:
        with pytest.raises(StackError, match="names a repository but no tag or digest"):
            image_reference(ref)
    else:
        assert image_reference(ref) == (digest or tag)


def test_evidence_refuses_a_short_digest_rather_than_read_it_as_a_tag() -> None:
    assert image_reference(DIGEST) == DIGEST
    with pytest.raises(StackError, match="is not a sha256 digest"):
        image_reference("sha256:abc")
    with pytest.raises(StackError, match="IMAGE: 'Bad:Ref' is not an image reference"):
        image_reference("Bad:Ref")


@pytest.mark.parametrize(("ref", "repository", "tag", "digest", "host", "path"), CASES)
def test_a_pins_image_names_its_store(
    ref: str, repository: str, tag: str | None, digest: str | None, host: str | None, path: str
) -> None:
    if host is None:
        with pytest.raises(StackError, match="names no registry host"):
            ArtifactStore.of_image(ref)
        return
    store = ArtifactStore.of_image(ref)
    assert (store.registry.host, store.name) == (host, path)


def test_the_sbom_names_each_base_by_its_repository() -> None:
    """A base behind a registry port was named `localhost` with version `5000/cuda`."""
    document = sbom(
        SbomInputs(
            image=PORT,
            digest=DIGEST,
            locked=[],
            bases=[
                ("localhost:5000/cuda", None),
                ("nvidia/cuda:13.0.2-devel-ubuntu24.04", DIGEST),
                (f"{PORT}:base@{DIGEST}", None),
            ],
            contents=ImageContents(os_packages=(), distro="debian", jit_files=()),
        )
    )
    components = json.loads(document)["components"]
    bases = {c["name"]: c["version"] for c in components if c["bom-ref"].startswith("base/")}
    assert bases == {
        "localhost:5000/cuda": "latest (not pinned by digest)",
        "nvidia/cuda": DIGEST,
        PORT: DIGEST,
    }
