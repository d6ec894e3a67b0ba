"""Bases by content (issue 46): a build's FROM, its compile cache id and its label name the
image a base reference held when the build read it, never the reference's name alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from builder import REPO_ROOT
from builder.engine.protocol import Image
from builder.image.basepins import BasePin, base_trouble, recipe_trouble, recorded_bases
from builder.manifest.resolve import resolve
from builder.render.bases import base_identity, content_reference
from builder.render.context import pinned_context, render

BASE = "local/cuda:13.0.2-devel-bookworm"
ONE, TWO = "sha256:" + "1" * 64, "sha256:" + "2" * 64
CACHE_ID = re.compile(r"--mount=type=cache,id=(sm120-stacks-flashinfer-workspace-[^,]+),")


@pytest.fixture
def stacks_dir(stacks_dir: Path) -> Path:
    (stacks_dir.parent / "build").mkdir()
    (stacks_dir.parent / "build" / "wheels").symlink_to(REPO_ROOT / "build" / "wheels")
    return stacks_dir


def image(image_id: str, layers: list[str], labels: dict[str, str] | None = None) -> Image:
    return Image(image_id, {"Config": {"Labels": labels or {}}, "RootFS": {"Layers": layers}})


def test_a_content_reference_names_the_image_and_its_identity_drops_the_name() -> None:
    ref = content_reference(BASE, ONE)
    assert ref == f"local/cuda:13.0.2-devel-bookworm-id-{'1' * 64}"
    assert base_identity(ref) == ONE
    assert base_identity(content_reference("other/name", ONE)) == ONE, "no tag: latest"
    assert base_identity("nvidia/cuda:13@sha256:" + "3" * 64) == "sha256:" + "3" * 64
    assert base_identity("mirror.example/cuda:13@sha256:" + "3" * 64) == "sha256:" + "3" * 64
    assert len(content_reference("r:" + "t" * 120, ONE).partition(":")[2]) == 128


def test_a_pinned_context_keeps_its_hash_and_names_the_base_by_id_in_from_and_cache(
    stacks_dir: Path,
) -> None:
    stack = resolve("ci-mini", stacks_dir)
    rendered = render(stack)
    one = pinned_context(rendered, stack, {BASE: content_reference(BASE, ONE)})
    two = pinned_context(rendered, stack, {BASE: content_reference(BASE, TWO)})
    assert one.content_hash() == two.content_hash() == rendered.content_hash()
    assert f"FROM {content_reference(BASE, ONE)} AS toolchain" in one.dockerfile
    ids = [CACHE_ID.findall(r.dockerfile) for r in (rendered, one, two)]
    assert all(len(found) == 1 for found in ids)
    assert len({found[0] for found in ids}) == 3, "another base image: another compile cache"
    # The same image under another name shares the compile cache.
    (stacks_dir / "renamed.yaml").write_text(
        "extends: ci-mini\nbases:\n"
        "  build: {image: mirror/cuda:x}\n  runtime: {image: mirror/cuda:x}\n"
    )
    renamed = resolve("renamed", stacks_dir)
    same = pinned_context(
        render(renamed), renamed, {"mirror/cuda:x": content_reference("mirror/cuda:x", ONE)}
    )
    assert CACHE_ID.findall(same.dockerfile) == ids[1]


def test_reuse_needs_the_label_and_the_layers_of_the_base_read_now() -> None:
    base = image(ONE, ["sha256:a", "sha256:b"])
    pins = {"build": BasePin(BASE, base), "runtime": BasePin(BASE, base)}
    label = {"sm120-stacks.base-ids": json.dumps({BASE: ONE})}
    assert recorded_bases(pins) == {BASE: ONE}
    good = image("sha256:c", ["sha256:a", "sha256:b", "sha256:z"], label)
    assert base_trouble(good, pins) is None
    moved = image("sha256:c", ["sha256:a", "sha256:b"], {"sm120-stacks.base-ids": "{}"})
    assert "no image" in str(base_trouble(moved, pins))
    # The label names this base, the layers are another's: the d35b514158f9 image.
    lying = image("sha256:c", ["sha256:x", "sha256:b", "sha256:z"], label)
    assert "layers do not start" in str(base_trouble(lying, pins))


def test_a_base_whose_recipe_tag_and_label_disagree_is_said() -> None:
    tag = f"{BASE}-recipe-{'a' * 16}"
    made = image(ONE, [], {"sm120-stacks.base-recipe": "a" * 64})
    assert recipe_trouble({"build": BasePin(tag, made)}) is None
    other = image(ONE, [], {"sm120-stacks.base-recipe": "b" * 64})
    assert "names recipe aaaa" in str(recipe_trouble({"build": BasePin(tag, other)}))
    assert "no recorded recipe" in str(recipe_trouble({"build": BasePin(tag, image(ONE, []))}))
    assert recipe_trouble({"build": BasePin(BASE, image(ONE, []))}) is None, "no recipe named"
