"""Base substitution renders the substitute, changes the content hash and is recorded."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import Result

from builder.errors import StackError
from builder.image.names import image_labels
from builder.lock.inputs import lock_inputs, original_bases
from builder.manifest.resolve import resolve
from builder.manifest.substitute import Substitutions
from builder.render.context import render
from tests.conftest import STACKS

LOCAL = "local/cuda:13.0.2-devel-bookworm"
ORIGINAL = "nvidia/cuda:13.0.2-devel-ubuntu24.04"


def test_exact_substitution_renders_hashes_and_labels() -> None:
    plain = render(resolve("vllm-0.22-b12x", STACKS))
    subs = Substitutions.parse([f"{ORIGINAL}={LOCAL}"])
    stack = resolve("vllm-0.22-b12x", STACKS, subs)
    substituted = render(stack)
    assert f"FROM {LOCAL} AS toolchain" in substituted.dockerfile
    # Both roles substituted alike, so the runtime still continues from the build.
    assert "FROM patched AS runtime" in substituted.dockerfile
    assert ORIGINAL not in substituted.dockerfile
    assert substituted.content_hash() != plain.content_hash()
    assert render(resolve("vllm-0.22-b12x", STACKS, subs)).content_hash() == (
        substituted.content_hash()
    )
    manifest = json.loads(image_labels(stack, substituted)["sm120-stacks.manifest"])
    assert manifest["derived"]["base_substitutions"] == {ORIGINAL: LOCAL}
    # The label is the manifest the context carries and hashes, not a second rendering of it.
    assert manifest == json.loads(substituted.files["manifest.json"][0])
    assert manifest == stack.to_json(editorial=False)


def test_repository_prefix_keeps_the_tag_and_a_digest_can_be_given() -> None:
    digest = "sha256:" + "a" * 64
    exact = Substitutions.parse([f"{ORIGINAL}=mirror.example:5000/nvidia/cuda:13.0.2@{digest}"])
    stack = resolve("vllm-0.22-marlin", STACKS, exact)
    assert (
        stack.manifest.bases.build.reference == f"mirror.example:5000/nvidia/cuda:13.0.2@{digest}"
    )
    with pytest.raises(StackError):  # a repository rule keeps the tag, so it cannot pin a digest
        Substitutions.parse([f"nvidia/cuda=mirror.example/nvidia/cuda@{digest}"])
    subs = Substitutions.parse(["nvidia/cuda=mirror.example:5000/nvidia/cuda"])
    assert subs.apply(ORIGINAL) == "mirror.example:5000/nvidia/cuda:13.0.2-devel-ubuntu24.04"
    assert subs.apply("nvidia/cudax:1") is None


def test_a_lock_records_the_bases_as_written_whatever_the_site_substitutes() -> None:
    """A site that builds FROM a mirror uses the same lock: its inputs name the manifest's
    bases (ResolvedStack.written_bases), not the substitutes the FROM lines use."""
    plain = resolve("vllm-0.22-b12x", STACKS)
    digest = "sha256:" + "b" * 64
    subs = Substitutions.parse([f"{ORIGINAL}=mirror.example:5000/nvidia/cuda:13.0.2@{digest}"])
    substituted = resolve("vllm-0.22-b12x", STACKS, subs)
    assert substituted.manifest.bases.build.digest == digest
    assert substituted.written_bases == plain.manifest.bases
    assert original_bases(substituted) == original_bases(plain)
    assert original_bases(plain)["build"] == (ORIGINAL, plain.manifest.bases.build.digest)
    assert lock_inputs(substituted) == lock_inputs(plain)


def test_unmatched_stack_is_unchanged() -> None:
    subs = Substitutions.parse(["some/other:1=local/x:1"])
    assert (
        render(resolve("vllm-0.22-marlin", STACKS, subs)).content_hash()
        == render(resolve("vllm-0.22-marlin", STACKS)).content_hash()
    )


@pytest.mark.parametrize("bad", ["nvidia/cuda", "=x", "a=b c", "x=RUN evil", "a@sha256:1=b"])
def test_bad_substitution_is_exit_2(bad: str, run_cli: Callable[..., Result]) -> None:
    with pytest.raises(StackError):
        Substitutions.parse([bad])


def test_show_displays_the_substitution(run_cli: Callable[..., Result]) -> None:
    result = run_cli("--substitute-base", f"{ORIGINAL}={LOCAL}", "show", "vllm-0.22-marlin")
    data = json.loads(result.output)
    assert data["bases"]["build"]["image"] == LOCAL
    assert data["derived"]["base_substitutions"] == {ORIGINAL: LOCAL}
