"""Two build folders (two users, or two clones) on one engine at once: each builds and tests
its own stack of the same name, then both build the same content, all at the same moment.
Neither sees the other's half-made state: each folder's record names the image its own
content tag holds, each smoke served its own image, and no smoke container is left behind.
Both building one child of ci-mini at once share its base and every layer, and the base is
named by content in its FROM, its compile cache id and its label (issue 46)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder import REPO_ROOT
from builder.engine.owner import OWNER_LABEL, boot_id
from builder.image.names import content_tag, local_ref, moving_ref
from builder.image.records import load_record
from builder.manifest.resolve import resolve
from builder.render.bases import content_reference
from builder.render.context import pinned_context, render
from tests.engine.conftest import BASE_IMAGE, unique

pytestmark = [
    pytest.mark.engine,
    pytest.mark.needs_ci_mini("two clones build and smoke transformers serve at once"),
]

STACK = unique("two-folders")
CHILD = unique("two-folders-child")
CACHE_ID = re.compile(r"--mount=type=cache,id=(sm120-stacks-flashinfer-workspace-[^,]+),")


def folder(root: Path, env_value: str) -> Path:
    """A repository-shaped folder of its own (stacks/, build/) with STACK extending ci-mini."""
    root.mkdir()
    shutil.copytree(REPO_ROOT / "stacks", root / "stacks")
    (root / "patches").symlink_to(REPO_ROOT / "patches")
    (root / "build").mkdir()
    (root / "build" / "wheels").symlink_to(REPO_ROOT / "build" / "wheels")
    write_stack(root, env_value)
    return root


def write_stack(root: Path, env_value: str) -> str:
    (root / "stacks" / f"{STACK}.yaml").write_text(
        f"extends: ci-mini\nenv: {{TWO_FOLDERS: '{env_value}'}}\n"
    )
    return render(resolve(STACK, root / "stacks")).content_hash()


def start(root: Path, ca_bundle: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SM120_STACKS_CA_BUNDLE": str(ca_bundle)}
    return subprocess.Popen(
        [sys.executable, "-m", "builder", *args],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def both(*processes: subprocess.Popen[str]) -> list[str]:
    """Wait for each; every one must succeed. Their outputs, stdout and stderr together."""
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=1200)
        assert process.returncode == 0, out + err
        outputs.append(out + err)
    return outputs


def image_of(api: Any, root: Path, content_hash: str) -> str:
    """The image this folder's record names, checked against the tag it built."""
    record = load_record(root / "build", STACK, content_hash)
    tagged = api.images.get(local_ref(STACK, content_hash))
    assert tagged.labels["sm120-stacks.content-hash"] == content_hash
    assert record.image_id == tagged.id, "the record names the image under its content tag"
    return str(record.image_id)


@pytest.fixture
def folders(
    tmp_path: Path, api: Any, ci_mini: dict[str, str]
) -> Iterator[tuple[Path, Path, list[str]]]:
    hashes: list[str] = []
    yield folder(tmp_path / "a", "a"), folder(tmp_path / "b", "b"), hashes
    for content_hash in hashes:
        with contextlib.suppress(Exception):
            api.images.remove(local_ref(STACK, content_hash))
    with contextlib.suppress(Exception):
        api.images.remove(moving_ref(STACK))


def test_two_folders_build_and_smoke_at_once(
    folders: tuple[Path, Path, list[str]],
    api: Any,
    models: dict[str, Path],
    proxy_ca: tuple[Path, str],
) -> None:
    a, b, hashes = folders
    ca = proxy_ca[0]
    hash_a = render(resolve(STACK, a / "stacks")).content_hash()
    hash_b = render(resolve(STACK, b / "stacks")).content_hash()
    assert hash_a != hash_b, "one stack name, two contents"
    hashes += [hash_a, hash_b]

    built = both(start(a, ca, "build", STACK), start(b, ca, "build", STACK))
    assert f"{local_ref(STACK, hash_a)}" in built[0] and f"{local_ref(STACK, hash_b)}" in built[1]
    image_a, image_b = image_of(api, a, hash_a), image_of(api, b, hash_b)
    assert image_a != image_b

    mount = f"{models['trained']}:/models/tiny"
    tests = [start(root, ca, "test", STACK, "--volume", mount) for root in (a, b)]
    owners = [f"{os.uname().nodename}:{process.pid}@{boot_id()}" for process in tests]
    both(*tests)
    for root, content_hash, image in ((a, hash_a, image_a), (b, hash_b, image_b)):
        record = load_record(root / "build", STACK, content_hash)
        assert (record.tests, record.smoke, record.image_id) == ("passed", "passed", image)
        report = json.loads((root / str(record.report)).read_text())  # relative to root
        assert report["image"] == local_ref(STACK, content_hash), "its own image was served"
    for owner in owners:
        left = api.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner}"})
        assert not left, f"smoke containers left behind: {[c.name for c in left]}"

    # The same content in both folders, built at once: one image, and both records name it.
    assert write_stack(b, "a") == hash_a
    both(start(a, ca, "build", STACK), start(b, ca, "build", STACK))
    assert image_of(api, a, hash_a) == image_of(api, b, hash_a)


def test_two_folders_building_one_child_at_once_share_the_base_and_every_layer(
    tmp_path: Path, api: Any, engine: Any, ci_mini: dict[str, str], proxy_ca: tuple[Path, str]
) -> None:
    """A child of ci-mini that adds one package, built in two folders at the same moment:
    one set of layers over the base the engine holds, FROM, label and compile cache id naming
    that base's image ID, and the child installs one package with no compile."""
    roots = [folder(tmp_path / name, name) for name in ("a", "b")]
    for root in roots:
        (root / "stacks" / f"{CHILD}.yaml").write_text(
            "extends: ci-mini\npython:\n  packages:\n    six: 1.17.0\n"
        )
    stack = resolve(CHILD, roots[0] / "stacks")
    rendered = render(stack)
    content_hash = rendered.content_hash()
    assert render(resolve(CHILD, roots[1] / "stacks")).content_hash() == content_hash
    base = engine.image(BASE_IMAGE)
    pinned = content_reference(BASE_IMAGE, base.id)
    try:
        both(*(start(root, proxy_ca[0], "build", CHILD) for root in roots))
        images = [load_record(root / "build", CHILD, content_hash).image_id for root in roots]
        built = [engine.image(str(image_id)) for image_id in images]
        layers = [image.attrs["RootFS"]["Layers"] for image in built]
        steps = [_ran(root / "build" / CHILD / "logs") for root in roots]
        assert layers[0] == layers[1], f"every layer shared; steps that ran: {steps}"
        base_layers = base.attrs["RootFS"]["Layers"]
        assert layers[0][: len(base_layers)] == base_layers, "built on the base the engine has"
        for image in built:
            assert json.loads(image.labels["sm120-stacks.base-ids"]) == {BASE_IMAGE: base.id}
        assert engine.image(pinned).id == base.id, "the content tag FROM names holds the base"
        expected = CACHE_ID.findall(
            pinned_context(rendered, stack, {BASE_IMAGE: pinned}).dockerfile
        )
        assert expected and expected != CACHE_ID.findall(rendered.dockerfile)
        logs = []
        for root in roots:
            dockerfile = (root / "build" / CHILD / "context" / "Dockerfile").read_text()
            assert f"FROM {pinned} AS toolchain" in dockerfile, "BuildKit keys FROM by this image"
            assert CACHE_ID.findall(dockerfile) == expected, "the compile cache takes its ID"
            log_path = root / "build" / CHILD / "logs" / f"{content_tag(CHILD, content_hash)}.log"
            logs.append(log_path.read_text(errors="replace"))
        for text in logs:  # BuildKit's lines (the client's command line names nvcc_threads)
            compiled = [
                line for line in text.splitlines() if line.startswith("#") and "nvcc" in line
            ]
            assert not compiled, f"the child compiled: {compiled[:2]}"
        # The packages step downloads the one new package (uv: "Prepared 1 package"), or is
        # CACHED when another stack built the same package set on this engine before.
        prepared = {n for text in logs for n in re.findall(r" Prepared (\d+) packages? in", text)}
        assert prepared <= {"1"}, f"the child downloaded {prepared} packages"
    finally:
        for ref in (local_ref(CHILD, content_hash), moving_ref(CHILD)):
            with contextlib.suppress(Exception):
                api.images.remove(ref)


def _ran(logs: Path) -> list[str]:
    """The titles of the steps a build's BuildKit log shows run (not CACHED)."""
    text = "\n".join(log.read_text(errors="replace") for log in logs.glob("*.log"))
    titles = dict(re.findall(r"^(#\d+) (\[[^\]]+\] .{0,60})", text, re.M))
    cached = set(re.findall(r"^(#\d+) CACHED$", text, re.M))
    return [title for step, title in titles.items() if step not in cached]
