"""The tool's own faults on the real engine, each test saying what was lost (nothing, or what
a second run puts back):

- the registry stopped mid-push, and one answering 500 to everything;
- the tool SIGKILLed mid-push, and again after the push at the record's write;
- the disk under the build folder filling during a build;
- two builds of one stack at once.

The registries are this module's own (docker-registry on a free port with its own storage, and
a tiny HTTP server answering 500), so the shared one on :5000 is untouched. The engine restarted
mid-build, mid-push and mid-test, and a prune mid-test, are `make bench-faults`'s: on an engine of
its own (bench/engine-faults.sh), never the shared one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from builder.image.names import HASH_CHARS, REPOSITORY, content_tag, local_ref, moving_ref
from builder.manifest.resolve import resolve
from builder.render.context import render
from tests.engine.conftest import unique
from tests.support.net import free_port
from tests.test_faults import tool as start_tool

pytestmark = pytest.mark.engine

#: The stand-in image's one layer: incompressible, so a push lasts seconds on a local registry.
BLOB_MB = 96
#: dockerd retries a failed layer upload 4 times, 5 + 10 + 15 + 20 s apart: about 50 s before
#: a push that lost its registry fails. The tool must not multiply that (it once did: x5).
ENGINE_RETRIES_S = 50


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class PrivateRegistry:
    """docker-registry (distribution 2.8) on a free loopback port, storage in a temp folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.storage = root / "storage"
        self.config = root / "config.yml"
        self.config.write_text(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {self.storage}\nhttp:\n  addr: {self.host}\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.root / "registry.log").open("ab") as log:
            self.process = subprocess.Popen(
                ["docker-registry", "serve", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self.answers, 20, f"the private registry on {self.host}")

    def answers(self) -> bool:
        try:
            urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2)
        except OSError:
            return False
        return True

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def uploading(self) -> bool:
        """A layer upload under way: its session's data file already holds some MB."""
        uploads = self.storage / "docker/registry/v2/repositories" / REPOSITORY / "_uploads"
        return any(f.stat().st_size > 4 << 20 for f in uploads.glob("*/data"))

    def manifest_digest(self, tag: str) -> str | None:
        request = urllib.request.Request(
            f"http://{self.host}/v2/{REPOSITORY}/manifests/{tag}",
            method="HEAD",
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return str(answer.headers["Docker-Content-Digest"])
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise


@pytest.fixture
def private_registry(tmp_path: Path) -> Iterator[PrivateRegistry]:
    if shutil.which("docker-registry") is None:
        pytest.skip("no docker-registry here (Debian's docker-registry package)")
    registry = PrivateRegistry(tmp_path / "registry")
    registry.start()
    yield registry
    registry.kill()


class _Answer500(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        body = b'{"errors": [{"code": "UNKNOWN", "message": "injected by the test"}]}'
        self.send_response(500)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def registry_500() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer500)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def blob_stack(workspace: Path, api: Any) -> Iterator[tuple[str, str]]:
    """A stack of the workspace (a variant of the tiny stack) and a stand-in image under its
    content tag: BLOB_MB of random bytes in one layer, labelled as a build labels it. `push`
    takes it for the stack's image; a push of it lasts long enough to stop a registry in the
    middle."""
    name = unique("tiny-faults")  # another clone's run removes its own by id
    (workspace / "stacks" / f"{name}.yaml").write_text(
        "extends: ci-tiny\nenv: {FAULTS_TEST: '1'}\n"
    )
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    dockerfile = (
        "FROM scratch\nCOPY blob /blob\n"
        f"LABEL sm120-stacks.content-hash={content_hash} sm120-stacks.stack={name}\n"
    ).encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for member, data in (("Dockerfile", dockerfile), ("blob", os.urandom(BLOB_MB << 20))):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    ref = local_ref(name, content_hash)
    image, _ = api.images.build(fileobj=context, custom_context=True, tag=ref, rm=True)
    yield name, content_hash
    # By id, with force: the pushes tagged it once per registry (127.0.0.1:PORT/...), and
    # removing only `ref` left those tags behind, 2 per run.
    with contextlib.suppress(Exception):
        api.images.remove(image.id, force=True)


def record_file(workspace: Path, name: str, content_hash: str) -> Path:
    return workspace / "build" / name / "records" / f"{content_hash[:HASH_CHARS]}.json"


def pushed(workspace: Path, name: str, content_hash: str) -> dict[str, str]:
    """What the record says was pushed; {} without a record."""
    path = record_file(workspace, name, content_hash)
    return dict(json.loads(path.read_text())["pushed"]) if path.is_file() else {}


def stray_temp_files(workspace: Path, name: str) -> list[str]:
    return [p.name for p in (workspace / "build" / name).rglob(".*.json.*")]


def test_a_registry_that_stops_or_answers_500_mid_push(
    blob_stack: tuple[str, str],
    private_registry: PrivateRegistry,
    registry_500: str,
    workspace: Path,
    api: Any,
) -> None:
    """Lost: nothing. Each push fails once the engine's own retries are spent (~50 s, not five
    times that), with a message naming the registry; no digest is recorded, and no
    REGISTRY/REPO:TAG name that the push put on the image stays on it; a push to the
    registry once it is back succeeds and is recorded. The two pushes run at once: each
    waits out dockerd's retries."""
    name, content_hash = blob_stack
    began = time.monotonic()
    stopped = start_tool(workspace, "push", name, "--force", "--registry", private_registry.host)
    failing = start_tool(workspace, "push", name, "--force", "--registry", registry_500)
    wait_for(
        lambda: private_registry.uploading() or stopped.poll() is not None,
        120,
        "the push's first layer upload",
    )
    assert stopped.poll() is None, "the push ended before the registry could be stopped"
    private_registry.kill()
    outcomes = {}
    for label, process in (("stopped", stopped), ("500", failing)):
        out, err = process.communicate(timeout=ENGINE_RETRIES_S * 4)
        outcomes[label] = (process.returncode, err, time.monotonic() - began)
    for label, state, host in (
        ("stopped", "is unreachable", private_registry.host),
        ("500", "answered server errors", registry_500),
    ):
        code, err, took = outcomes[label]
        assert code == 2, err
        assert f"registry {host} {state} after the engine's own retries" in err, err
        assert "nothing was recorded" in err and "Traceback" not in err
        assert took < ENGINE_RETRIES_S * 2.5, f"{label}: {took:.0f} s: retried again"
    repository = f"{private_registry.host}/{REPOSITORY}"
    recorded = pushed(workspace, name, content_hash)
    assert repository not in recorded and f"{registry_500}/{REPOSITORY}" not in recorded
    assert not stray_temp_files(workspace, name)
    names = api.images.get(local_ref(name, content_hash)).tags
    left = [t for t in names if t.startswith((f"{private_registry.host}/", f"{registry_500}/"))]
    assert not left, f"the failed pushes left their tags on the image: {left}"
    private_registry.start()
    again = start_tool(workspace, "push", name, "--force", "--registry", private_registry.host)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    digest_ref = out.strip().splitlines()[-1]
    assert pushed(workspace, name, content_hash)[repository] == digest_ref
    digest = private_registry.manifest_digest(content_tag(name, content_hash))
    assert digest_ref == f"{repository}@{digest}"


def test_the_tool_killed_mid_push_and_at_the_record(
    blob_stack: tuple[str, str], private_registry: PrivateRegistry, workspace: Path
) -> None:
    """SIGKILL during the upload: the engine drops the push (its client is gone), nothing is
    published or recorded. SIGKILL after the push, as its record is written: the registry has
    the image and the record does not say so (lost: that line of the record, put back by the
    next push, which sends nothing again). Either way the record file is whole."""
    name, content_hash = blob_stack
    tag = content_tag(name, content_hash)
    repository = f"{private_registry.host}/{REPOSITORY}"
    args = ("push", name, "--force", "--registry", private_registry.host)
    killed = start_tool(workspace, *args)
    wait_for(lambda: private_registry.uploading() or killed.poll() is not None, 120, "the upload")
    assert killed.poll() is None, "the push ended before it could be killed"
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    time.sleep(3)  # what the engine would still finish on its own, it would have by now
    assert private_registry.manifest_digest(tag) is None, "nothing published"
    assert repository not in pushed(workspace, name, content_hash)
    before = record_file(workspace, name, content_hash)
    old = before.read_bytes() if before.is_file() else None

    held = start_tool(workspace, *args, hold=f"records/{content_hash[:HASH_CHARS]}.json")
    assert held.stderr is not None
    for line in held.stderr:
        if line.startswith("sm120-stacks-test: holding"):
            break
    else:
        raise AssertionError(f"the push ended without writing its record ({held.wait()})")
    held.send_signal(signal.SIGKILL)
    held.wait(timeout=30)
    digest = private_registry.manifest_digest(tag)
    assert digest is not None, "the push itself had finished"
    after = record_file(workspace, name, content_hash)
    assert (after.read_bytes() if after.is_file() else None) == old, "the record is whole"

    again = start_tool(workspace, *args)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert pushed(workspace, name, content_hash)[repository] == f"{repository}@{digest}"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 MB tmpfs: room for a build folder and little else (a new context is written whole
    beside the old one before it replaces it)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the file system is full; returns it."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as handle:
        while True:
            handle.write(b"\0" * (1 << 20))
            handle.flush()
    return filler


def test_the_disk_filling_during_a_build(
    tiny_variant: Callable[[str, str], str],
    workspace: Path,
    small_disk: Path,
    api: Any,
    tiny_stack: dict[str, str],
) -> None:
    """Lost: nothing. The build stops at the log line that did not fit (its client stopped),
    with a message naming the log and the full disk; nothing is tagged or recorded. Once space
    is freed the next build goes on from the build cache."""
    from docker.errors import ImageNotFound

    name = tiny_variant("tiny-disk-full", "env: {DISK_FULL_TEST: '1'}")
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    log = small_disk / name / "logs" / f"{content_tag(name, content_hash)}.log"
    # --no-cache: the tiny stack's cached build is over in a second, before the disk is full;
    # uncached, its venv and pip steps write the log for seconds more.
    build = start_tool(workspace, "--build-dir", str(small_disk), "build", name, "--no-cache")
    wait_for(
        lambda: (log.is_file() and log.stat().st_size > 0) or build.poll() is not None,
        300,
        "the build's log",
    )
    filler = fill(small_disk)
    out, err = build.communicate(timeout=600)
    assert build.returncode == 1, out + err
    assert f"its log {log} could not be written (No space left on device)" in err, err
    assert "no image was tagged" in err and "Traceback" not in err
    for ref in (local_ref(name, content_hash), moving_ref(name)):
        with pytest.raises(ImageNotFound):
            api.images.get(ref)
    assert not (small_disk / name / "records").exists(), "nothing recorded"
    filler.unlink()
    again = start_tool(workspace, "--build-dir", str(small_disk), "build", name)
    out, err = again.communicate(timeout=900)
    assert again.returncode == 0, out + err
    assert api.images.get(local_ref(name, content_hash))
    assert log.with_name(log.name + ".1").is_file(), "the failed attempt's log is kept"


def test_two_builds_of_one_stack_at_once(
    tiny_variant: Callable[[str, str], str],
    workspace: Path,
    tiny_stack: dict[str, str],
    tmp_path: Path,
) -> None:
    """The second waits for the first, saying so and naming it, then finds the image the first
    built: 'up to date', nothing built twice, no context swapped under a running build. (A
    cached tiny-stack variant builds in seconds, so the first is held inside its lock, at the
    moment it keeps an earlier log, until the second has said it waits.)"""
    name = tiny_variant("tiny-twice", "env: {TWICE_TEST: '1'}")
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    ref = local_ref(name, content_hash)
    logs = workspace / "build" / name / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{content_tag(name, content_hash)}.log").write_text("an earlier attempt\n")
    release = tmp_path / "release"
    first = start_tool(workspace, "build", name, hold=".log.1", release=release)
    assert first.stderr is not None
    for line in first.stderr:
        if line.startswith("sm120-stacks-test: holding"):
            break
    else:
        raise AssertionError(f"the first build never reached its lock ({first.wait()})")
    second = start_tool(workspace, "build", name)
    assert second.stderr is not None
    waiting = second.stderr.readline()
    assert waiting.startswith(f"waiting for the other build of {name} (pid {first.pid} since")
    release.touch()
    out1, err1 = first.communicate(
        timeout=900
    )  # the first, first: its pipes fill, not the second's
    out2, err2 = second.communicate(timeout=900)
    assert first.returncode == 0, out1 + err1
    assert f"built {ref}" in out1
    assert second.returncode == 0, out2 + err2
    assert f"up to date: {ref}" in out2
