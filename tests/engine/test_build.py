"""Real builds on the real engine: content tags, no-op rebuilds, layer reuse, interruption."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from builder import REPO_ROOT
from builder.engine.docker_adapter import DockerEngine
from builder.image.names import content_tag, local_ref, moving_ref
from builder.manifest.resolve import resolve
from builder.render.context import render

pytestmark = pytest.mark.engine


@pytest.mark.needs_ci_mini("the session's ci-mini build itself")
def test_build_tags_the_image_by_content_hash_with_labels(
    ci_mini: dict[str, str], api: Any
) -> None:
    image = api.images.get(ci_mini["ref"])
    labels = image.labels
    assert labels["sm120-stacks.content-hash"] == ci_mini["hash"]
    assert labels["sm120-stacks.stack"] == "ci-mini"
    assert json.loads(labels["sm120-stacks.manifest"])["name"] == "ci-mini"
    assert json.loads(labels["sm120-stacks.arch"])["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f"
    assert labels["org.opencontainers.image.created"] == "1970-01-01T00:00:00Z"
    assert api.images.get(moving_ref("ci-mini")).id == image.id


@pytest.mark.needs_ci_mini("the session's ci-mini build itself")
def test_unchanged_stack_is_not_rebuilt(
    ci_mini: dict[str, str], cli_process: Callable[..., Any]
) -> None:
    result = cli_process("build", "ci-mini")
    assert f"up to date: {ci_mini['ref']}" in result.stdout


@pytest.mark.needs_ci_mini("ci-mini's torch and FlashInfer layers reused")
def test_runtime_only_change_reuses_every_package_layer(
    ci_mini: dict[str, str],
    variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    api: Any,
    workspace: Path,
) -> None:
    # Two variants built here, so the second finds the first's layers in the build cache even
    # when ci-mini's own image predates a `docker builder prune`.
    first = variant("ci-mini-env-a", "env: {SMOKE_ONLY_SETTING: one}")
    second = variant("ci-mini-env-b", "env: {SMOKE_ONLY_SETTING: two}\nserve: {port: 8011}")
    images = []
    for name in (first, second):
        cli_process("build", name)
        content_hash = render(resolve(name, workspace / "stacks")).content_hash()
        assert content_hash != ci_mini["hash"]
        images.append(api.images.get(local_ref(name, content_hash)))
    assert images[0].id != images[1].id
    # ENV/EXPOSE/CMD add no filesystem layers: every layer is the first variant's.
    assert images[1].attrs["RootFS"]["Layers"] == images[0].attrs["RootFS"]["Layers"]
    text = next((workspace / "build" / second / "logs").glob("*.log")).read_text()
    assert "pip install" not in _executed_steps(text), "a package step ran again"


def _executed_steps(log: str) -> str:
    """Titles of steps that ran (not CACHED) in a BuildKit plain log."""
    titles: dict[str, str] = {}
    cached: set[str] = set()
    for line in log.splitlines():
        parts = line.split(" ", 1)
        if len(parts) == 2 and parts[0].startswith("#"):
            if parts[1].startswith("["):
                titles[parts[0]] = parts[1]
            elif parts[1].startswith("CACHED"):
                cached.add(parts[0])
    return "\n".join(t for k, t in titles.items() if k not in cached)


#: The packages stage's install of requirements/all.txt (uv since issue 46), as BuildKit titles it.
UV_PACKAGES_STEP = re.compile(
    r"uv pip install --python /opt/venv/bin/python (\S+ )*"
    r"-r /opt/sm120-stacks/requirements/all\.txt"
)
#: BuildKit's line for the packages stage's pip step (its number depends on the stage's shape).
PACKAGES_PIP_STEP = re.compile(r"\[packages \d+/\d+\] RUN ")
#: ... and its copy of the requirements/ folder, the step before it.
PACKAGES_COPY_STEP = re.compile(r"\[packages \d+/\d+\] COPY requirements/ ")


@pytest.mark.needs_ci_mini("ci-mini's heavy layer from the cache")
def test_interrupted_build_leaves_no_tag_and_the_next_build_resumes(
    ci_mini: dict[str, str],
    variant: Callable[[str, str], str],
    workspace: Path,
    proxy_ca: tuple[Path, str],
    api: Any,
) -> None:
    from docker.errors import ImageNotFound

    # The step to interrupt must really run, even if an earlier run cached it: an extra of
    # this invocation's own on six (six has none: pip and uv install six as it is, saying so)
    # makes the packages stage's requirements new, and only those (the JIT's requirements and
    # the heavy layer stay cached). Not --no-cache: that reinstalled torch first (~115 s).
    fresh = f"run-{os.urandom(6).hex()}"
    six = f"{{version: 1.16.0, extras: [{fresh}]}}"
    name = variant("ci-mini-interrupted", f"python: {{packages: {{six: {six}}}}}")
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    process = subprocess.Popen(
        [sys.executable, "-m", "builder", "build", name, "--ca-bundle", str(proxy_ca[0])],
        cwd=workspace,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if PACKAGES_PIP_STEP.search(line):  # the pip step of the changed pins is running
            time.sleep(2)
            # SIGTERM, not SIGINT: shells start background jobs (CI runners, nohup) with SIGINT
            # ignored, and an ignored SIGINT stays ignored in every child. The tool treats both
            # alike (a unit test covers the Ctrl-C exit status).
            process.send_signal(signal.SIGTERM)
            break
    rest, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, "".join(seen) + rest
    for ref in (local_ref(name, content_hash), moving_ref(name)):
        with pytest.raises(ImageNotFound):
            api.images.get(ref)
    resumed = subprocess.run(
        [sys.executable, "-m", "builder", "build", name, "--ca-bundle", str(proxy_ca[0])],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    executed = _executed_steps(resumed.stderr)
    assert (
        "pip install --find-links /opt/sm120-stacks/wheels -c" not in executed
    ), "the heavy layer should come from the cache"
    assert "[jit-deps " not in executed, f"the heavy layer should come from the cache: {executed}"
    # What the interrupted build finished (its new requirements/ copy) is kept; the step it
    # was stopped in is not, and runs again.
    assert not PACKAGES_COPY_STEP.search(executed), executed
    assert PACKAGES_PIP_STEP.search(executed), executed
    assert api.images.get(local_ref(name, content_hash))
    log = workspace / "build" / name / "logs" / f"{content_tag(name, content_hash)}.log"
    assert "build interrupted" in log.with_name(log.name + ".1").read_text(), "attempt 1 kept"
    assert "build interrupted" not in log.read_text()


def test_secrets_are_in_no_layer_and_no_history(
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    proxy_ca: tuple[Path, str],
    api: Any,
    tmp_path: Path,
) -> None:
    token = "hf_" + "sm120secret" + str(time.time_ns())
    token_file = tmp_path / "token"
    token_file.write_text(token)
    # A variant of the tiny stack: its pip steps take the proxy CA and the token as BuildKit
    # secrets through the same template (stages/pip.j2) as every stack's.
    name = tiny_variant("tiny-secrets", "python: {packages: {six: 1.16.0}}")
    cli_process("build", name, "--no-cache", "--hf-token-file", str(token_file))
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    image = api.images.get(local_ref(name, content_hash))
    scanned = _assert_absent(image.save(named=False), [proxy_ca[1], token])
    assert scanned > image.attrs["Size"] // 2, "the whole image should have been read"
    history = json.dumps(image.history()) + json.dumps(image.attrs)
    assert proxy_ca[1] not in history and token not in history
    # The secrets were really in use: the packages step ran (it cannot reach PyPI through the
    # proxy without the CA) in this build rather than coming from the cache. Since issue 46
    # that step installs through uv (templates/stages/uv.j2), the same secrets mounted.
    log = next((workspace / "build" / name / "logs").glob("*.log")).read_text()
    assert UV_PACKAGES_STEP.search(_executed_steps(log)), _executed_steps(log)


class _ChunkStream(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (the engine's `docker save` stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            self._pending = next(self._chunks, b"")
            if not self._pending:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def _assert_absent(chunks: Iterator[bytes], needles: list[str]) -> int:
    """Stream the saved image (no copy on disk, no layer in memory: CI machines are short of
    both) and scan every file of every layer tar and every config for the needles.
    Returns the bytes of file content scanned."""
    encoded = [n.encode() for n in needles]
    overlap = max(len(n) for n in encoded)

    def scan(handle: IO[bytes], where: str) -> int:
        tail, total = b"", 0
        while block := handle.read(1 << 20):
            window = tail + block
            for needle in encoded:
                assert needle not in window, f"{needle.decode()} in {where}"
            tail, total = window[-overlap:], total + len(block)
        return total

    scanned = 0
    with tarfile.open(fileobj=io.BufferedReader(_ChunkStream(chunks)), mode="r|") as outer:
        for member in outer:
            data = outer.extractfile(member) if member.isfile() else None
            if data is None:
                continue
            head = data.peek(512)[:512]  # layer tars by content: docker 20.10 and OCI layouts
            if head[257:262] != b"ustar":
                scanned += scan(data, member.name)
                continue
            with tarfile.open(fileobj=data, mode="r|") as layer:
                for entry in layer:
                    payload = layer.extractfile(entry) if entry.isfile() else None
                    if payload is not None:
                        scanned += scan(payload, f"{member.name}:{entry.name}")
    return scanned


@pytest.mark.needs_ci_mini("the session's ci-mini build on the CUDA base")
def test_a_moved_base_tag_is_noticed(
    ci_mini: dict[str, str], engine: DockerEngine, workspace: Path
) -> None:
    """A base rebuilt under the same tag must not leave the old image 'up to date'."""
    from builder.image.build import _bases_moved, local_base_ids

    stack = resolve("ci-mini", workspace / "stacks")
    image = engine.image(ci_mini["ref"])
    assert image is not None
    current = local_base_ids(engine, stack)
    assert current, "the local base should be known to the engine"
    assert not _bases_moved(image, current)
    assert _bases_moved(image, dict.fromkeys(current, "sha256:" + "0" * 64))


@pytest.mark.needs_ci_mini("a variant of ci-mini on its CUDA base, whose layers it checks")
def test_an_image_of_another_base_than_its_label_says_is_built_again(
    variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    engine: DockerEngine,
    workspace: Path,
    api: Any,
    tmp_path: Path,
) -> None:
    """Issue 46: the image under a stack's content tag carries a label naming another base
    than the tag holds now, or the base the tag holds but another base's layers (a label read
    from a tag that moved under the build). `build` says which and builds, never "up to
    date"; what it builds starts with the base's own layers."""
    from tests.engine.conftest import BASE_IMAGE

    name = variant("ci-mini-forged", "env: {FORGED_BASE: one}")
    cli_process("build", name)
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    ref = local_ref(name, content_hash)
    base = engine.image(BASE_IMAGE)
    assert base is not None
    base_layers = base.attrs["RootFS"]["Layers"]
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY Dockerfile /forged\n")
    cases = {
        "was 000000000000": {BASE_IMAGE: "sha256:" + "0" * 64},
        "layers do not start with that base's layers": {BASE_IMAGE: base.id},
    }
    for said, recorded in cases.items():
        forged, _ = api.images.build(
            path=str(tmp_path),
            labels={
                "sm120-stacks.content-hash": content_hash,
                "sm120-stacks.base-ids": json.dumps(recorded),
            },
        )
        forged.tag(ref)
        result = cli_process("build", name)
        assert said in result.stderr, result.stdout + result.stderr
        assert "up to date" not in result.stdout
        rebuilt = engine.image(ref)
        assert rebuilt is not None and rebuilt.id != forged.id
        assert rebuilt.attrs["RootFS"]["Layers"][: len(base_layers)] == base_layers
        assert json.loads(rebuilt.labels["sm120-stacks.base-ids"]) == {BASE_IMAGE: base.id}
        api.images.remove(forged.id, force=True)


@pytest.mark.needs_ci_mini("patches ci-mini's ninja package")
def test_patches_apply_inside_the_image(
    variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    api: Any,
) -> None:
    """The patches stage patches the installed package (the wheel dry-run test cannot see how
    the Dockerfile calls patch(1): a relative --input once failed every patched stack)."""
    patch_file = workspace / "patches" / "ci-mini" / "ninja-marker.patch"
    digest = hashlib.sha256(patch_file.read_bytes()).hexdigest()
    name = variant(
        "ci-mini-patched",
        "patches:\n"
        "  - file: patches/ci-mini/ninja-marker.patch\n"
        "    package: ninja\n"
        f"    sha256: {digest}",
    )
    cli_process("build", name)
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    output = api.containers.run(
        local_ref(name, content_hash),
        [
            "sh",
            "-c",
            "cat /opt/venv/lib/python3.11/site-packages/ninja/_version.py"
            " && cat /opt/sm120-stacks/patches/APPLIED",
        ],
        remove=True,
    ).decode()
    assert "# patched by sm120-stacks engine test" in output
    assert f"{digest}  ninja-marker.patch" in output


def test_a_base_that_cannot_be_pulled_is_named_with_the_remedies(tmp_path: Path) -> None:
    """ci-mini FROM an image no registry can serve, built as `sm120-stacks build` builds it:
    BuildKit's resolver error becomes one naming the image and the ways to build anyway.
    Nothing is pulled, so this needs no base image and takes seconds."""
    shutil.copytree(REPO_ROOT / "stacks", tmp_path / "stacks")
    (tmp_path / "patches").symlink_to(REPO_ROOT / "patches")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "wheels").symlink_to(REPO_ROOT / "build" / "wheels")
    unpullable = "nonexistent.invalid/nothing"
    substitute = f"local/cuda={unpullable}"
    result = subprocess.run(
        [sys.executable, "-m", "builder", "--substitute-base", substitute, "build", "ci-mini"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    error = result.stderr.split("\nerror: ", 1)[-1]
    assert result.returncode == 2, result.stderr
    image = f"{unpullable}:13.0.2-devel-bookworm"
    assert error.startswith(f"the base image {image} of ci-mini cannot be pulled"), error
    assert "BuildKit: " in error and "nonexistent.invalid" in error.split("BuildKit: ")[1]
    assert f"--substitute-base {image}=" in error and "SM120_STACKS_BASE_SUBSTITUTE" in error
    assert "make base-cuda-local" in error and "make flagship-local STACK=ci-mini" in error
    assert "Traceback" not in result.stderr


@pytest.mark.engine
@pytest.mark.needs_ci_mini("the session's ci-mini build itself")
def test_a_noop_build_is_decided_from_file_metadata_and_yields_to_any_change(
    cli_process: Callable[..., Any], workspace: Path, ci_mini: dict[str, str]
) -> None:
    from builder.image import uptodate

    cli_process("build", "ci-mini")  # records what this build's inputs looked like
    memo = uptodate.uptodate_memo(workspace / "build", "ci-mini")
    assert json.loads(memo.read_text())["image_ref"] == ci_mini["ref"]
    probe = (
        "import sys; sys.argv = ['sm120-stacks', 'build', 'ci-mini']\n"
        "from builder.cli.main import main; main()\n"
        "print(sorted(m for m in ('pydantic', 'jinja2', 'docker') if m in sys.modules), "
        "file=sys.stderr)"
    )
    fast = subprocess.run(
        [sys.executable, "-c", probe], cwd=workspace, capture_output=True, text=True, check=True
    )
    assert fast.stdout.strip() == f"up to date: {ci_mini['ref']}"
    assert fast.stderr.strip().splitlines()[-1] == "[]", "the no-op path imported the world"

    socket = "/var/run/docker.sock"
    still = uptodate.still_built
    assert still(workspace / "build", workspace / "stacks", "ci-mini", socket) == ci_mini["ref"]
    manifest = workspace / "stacks" / "ci-mini.yaml"
    stat = manifest.stat()
    os.utime(manifest, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert still(workspace / "build", workspace / "stacks", "ci-mini", socket) is None
    # The full path decides (same content: up to date) and records the new metadata.
    assert "up to date" in cli_process("build", "ci-mini").stdout
    assert still(workspace / "build", workspace / "stacks", "ci-mini", socket) == ci_mini["ref"]

    # An image that is no longer the one recorded is never taken on trust.
    data = json.loads(memo.read_text())
    memo.write_text(json.dumps({**data, "image_id": "sha256:" + "0" * 64}))
    assert still(workspace / "build", workspace / "stacks", "ci-mini", socket) is None
