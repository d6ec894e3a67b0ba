"""The tool's own faults that need no engine: a process killed mid-write, two builds of one
stack, a full disk, a registry failure the engine already retried. Each test says what was
lost; the engine's part is in tests/engine/test_faults.py, the table in bench/FAULTS.md.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from builder import REPO_ROOT
from builder.engine.docker_adapter import parse_progress_stream
from builder.errors import EngineError, OperationFailed, StackError, ToolMissing
from builder.image.build import stack_dir_lock
from builder.image.records import Record, save_record
from builder.image.registry import Registry, push
from builder.manifest.resolve import resolve
from builder.render.context import render
from tests.support.served import SERVED_GPU, served

STACK = "faults"

#: Loaded by Python at startup (sitecustomize, from PYTHONPATH) in the tool's process: holds
#: the os.replace that would put the named file in place (until SM120_TEST_RELEASE names a file
#: that exists), so a test can SIGKILL the tool at the one moment a half-written file could
#: matter, or keep it at a known point.
HOLD_REPLACE_HOOK = """
import os
import sys
import time

_target = os.environ.get("SM120_TEST_HOLD_REPLACE")
_release = os.environ.get("SM120_TEST_RELEASE", "")
if _target:
    _replace = os.replace

    def _held(src, dst, *args, **kwargs):
        if str(dst).endswith(_target):
            sys.stderr.write("sm120-stacks-test: holding the replace of " + str(dst) + chr(10))
            sys.stderr.flush()
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not (_release and os.path.exists(_release)):
                time.sleep(0.05)
        return _replace(src, dst, *args, **kwargs)

    os.replace = _held
"""


# --- SIGKILL mid-pin ---------------------------------------------------------------------------


@pytest.fixture
def repo(stacks_dir: Path, tmp_path: Path) -> Path:
    """A repository-shaped folder with a stack whose image was tested and pushed."""
    (stacks_dir / f"{STACK}.yaml").write_text("extends: vllm-0.22-b12x\n")
    content_hash = render(resolve(STACK, stacks_dir)).content_hash()
    repository = "127.0.0.1:5000/sm120-stacks"
    record = Record(
        stack=STACK,
        content_hash=content_hash,
        tests="passed",
        smoke="passed",
        pushed={repository: f"{repository}@sha256:{'c' * 64}"},
        served=[served()],
    )
    save_record(tmp_path / "build", record)
    return tmp_path


def tool(
    repo: Path, *args: str, hold: str | None = None, release: Path | None = None
) -> subprocess.Popen[str]:
    """`sm120-stacks ARGS` in repo; `hold`: held at the write of a file ending so, until
    `release` exists (or killed there)."""
    env = dict(os.environ)
    if release is not None:
        env["SM120_TEST_RELEASE"] = str(release)
    if hold is not None:
        hook = repo / "hook"
        hook.mkdir(exist_ok=True)
        (hook / "sitecustomize.py").write_text(HOLD_REPLACE_HOOK)
        env["PYTHONPATH"] = os.pathsep.join([str(hook), str(REPO_ROOT)])
        env["SM120_TEST_HOLD_REPLACE"] = hold
    return subprocess.Popen(
        [sys.executable, "-m", "builder", *args],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_when_held(process: subprocess.Popen[str]) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        if line.startswith("sm120-stacks-test: holding"):
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            return
    raise AssertionError(f"the tool ended without writing (exit {process.wait()})")


@pytest.mark.parametrize("killed_at", ["hosts/previous/gpu-1.yaml", "hosts/gpu-1.yaml"])
def test_sigkill_mid_pin_leaves_the_old_pin_whole(
    repo: Path, stacks_dir: Path, run_cli: Callable[..., Result], killed_at: str
) -> None:
    """Lost: the new pin only. hosts/gpu-1.yaml is the old pin, byte for byte, and loads; the
    tool's complete temporary file may stay beside it (a dotfile no command reads); pinning
    again works."""
    from builder.hosts.pins import load_pin

    assert run_cli("pin", "gpu-1", STACK, stacks_dir=stacks_dir).exit_code == 0
    hosts = repo / "hosts"
    pin = hosts / "gpu-1.yaml"
    old = pin.read_bytes()
    killed = tool(
        repo, "pin", "gpu-1", STACK, "--env", "NEW=1", "--gpu-kind", SERVED_GPU, hold=killed_at
    )
    kill_when_held(killed)
    assert killed.returncode == -signal.SIGKILL
    assert pin.read_bytes() == old
    assert load_pin(hosts, "gpu-1").env.get("NEW") is None
    previous = hosts / "previous" / "gpu-1.yaml"
    assert not previous.exists() or previous.read_bytes() == old
    strays = [p.name for p in hosts.rglob(".gpu-1.yaml.*")]
    assert all(not name.endswith(".yaml") for name in strays), strays
    again = run_cli("pin", "gpu-1", STACK, "--env", "NEW=1", stacks_dir=stacks_dir)
    assert again.exit_code == 0, again.output
    assert load_pin(hosts, "gpu-1").env["NEW"] == "1"
    assert previous.read_bytes() == old


# --- two builds of one stack -------------------------------------------------------------------


def test_a_second_build_waits_for_the_first_and_says_so(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    stack_dir = tmp_path / "build" / STACK
    with stack_dir_lock(stack_dir) as waited:
        assert waited is False  # free: the build need not look for the image again
        holder = (stack_dir / ".lock").read_text()
        assert holder.startswith(f"pid {os.getpid()} since ")
        got: list[float] = []
        waits: list[bool] = []

        def second() -> None:
            began = time.monotonic()
            with stack_dir_lock(stack_dir, wait_s=30) as second_waited:
                got.append(time.monotonic() - began)
                waits.append(second_waited)

        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(1.5)
        assert not got, "the second build must wait while the first holds the lock"
    waiter.join(timeout=10)
    assert got and got[0] >= 1.0
    assert waits == [True]  # it waited: the first may have built the image meanwhile
    err = capfd.readouterr().err
    assert err.count("waiting for the other build of faults") == 1
    assert f"(pid {os.getpid()} since " in err and "at most 30 s" in err


def test_a_second_build_gives_up_after_its_wait(tmp_path: Path) -> None:
    stack_dir = tmp_path / "build" / STACK
    with stack_dir_lock(stack_dir):
        began = time.monotonic()
        with (
            pytest.raises(OperationFailed, match=r"waited 1 s for the other build of faults"),
            stack_dir_lock(stack_dir, wait_s=1),
        ):
            pass
        assert 0.9 <= time.monotonic() - began < 5
        with (
            pytest.raises(StackError, match="another build or render of faults is running"),
            stack_dir_lock(stack_dir),
        ):
            pass


def test_a_killed_build_leaves_no_lock_behind(tmp_path: Path) -> None:
    """The kernel drops an flock with its holder, SIGKILL included: the next build starts."""
    stack_dir = tmp_path / "build" / STACK
    code = (
        "import sys, time; from pathlib import Path; from builder.image.build import "
        f"stack_dir_lock\nwith stack_dir_lock(Path({str(stack_dir)!r})):\n"
        "    print('held', flush=True); time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    with stack_dir_lock(stack_dir, wait_s=5):
        pass


# --- a full disk -------------------------------------------------------------------------------


def test_a_full_disk_is_a_message_and_status_1(
    repo: Path,
    stacks_dir: Path,
    run_cli: Callable[..., Result],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Wherever ENOSPC surfaces outside a build's log (the build's own case is an engine
    test), the command ends with a message, not a traceback."""
    import builder.hosts.pins

    def full(path: Path, text: str | bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(builder.hosts.pins, "write_atomic", full)
    result = run_cli("pin", "gpu-1", STACK, stacks_dir=stacks_dir)
    assert result.exit_code == 1, result.output
    assert "failed: no space left on the device writing" in result.output
    assert "gpu-1.yaml" in result.output and "Traceback" not in result.output


# --- a registry failure the engine retried -----------------------------------------------------


class _RetriedEngine:
    """Each push fails as dockerd fails one whose layer upload it retried five times."""

    def __init__(self) -> None:
        self.pushes = 0

    def image(self, ref: str) -> object:
        from builder.engine.protocol import Image

        return Image("sha256:" + "1" * 64, {})

    def tag(self, image: str, ref: str) -> None:
        pass

    def push(self, repository: str, tag: str, progress: object = None) -> str:
        self.pushes += 1
        lines = [
            {"status": "Preparing", "id": "b37d6f256f1e"},
            {"status": "Retrying in 5 seconds", "id": "b37d6f256f1e"},
            {
                "errorDetail": {
                    "message": "received unexpected HTTP status: 500 Internal Server " "Error"
                },
                "error": "received unexpected HTTP status: 500",
            },
        ]
        return parse_progress_stream(iter(lines))


def test_a_failure_the_engine_retried_is_not_retried_again() -> None:
    """A registry answering 500 took 5 x 50 s to report (dockerd retries each layer upload
    for ~50 s, and the tool asked it five times); now one engine attempt."""
    engine = _RetriedEngine()
    with pytest.raises(ToolMissing) as raised:
        push(engine, Registry.parse("127.0.0.1:5999"), "x", "ci-mini", "0" * 64)  # type: ignore[arg-type]
    assert engine.pushes == 1
    message = str(raised.value)
    assert "answered server errors after the engine's own retries" in message
    assert "nothing was recorded" in message


class _NamesEngine:
    """An engine that keeps its names (ref -> image id); the push of the moving tag fails."""

    IMAGE = "sha256:" + "2" * 64

    def __init__(self, names: dict[str, str]) -> None:
        self.names = dict(names)

    def image(self, ref: str) -> object:
        from builder.engine.protocol import Image

        held = self.names.get(ref)
        return None if held is None else Image(held, {})

    def tag(self, image: str, ref: str) -> None:
        self.names[ref] = image

    def untag(self, ref: str) -> None:
        del self.names[ref]

    def push(self, repository: str, tag: str, progress: object = None) -> str:
        if tag == "faults":
            raise EngineError("unauthorized: authentication required", status_code=500)
        return "sha256:" + "3" * 64


def test_a_failed_push_takes_off_the_registry_tags_it_put_on() -> None:
    """The engine pushes a local name, so push tags the image REGISTRY/REPO:TAG first; a push
    that failed left that tag behind (bench/results/faults/4-*), a name no record gives. Now
    it is taken off, also when the content tag went and the moving tag failed; a name the
    image had before the push stays."""
    registry = Registry.parse("127.0.0.1:5998/faults")
    local = "sm120-stacks:faults-0123"
    earlier = registry.ref("faults")  # the moving tag, from an earlier push of this image
    engine = _NamesEngine({local: _NamesEngine.IMAGE, earlier: _NamesEngine.IMAGE})
    with pytest.raises(StackError, match="unauthorized") as raised:  # exit 2 (issue 47)
        push(engine, registry, local, "faults", "0" * 64)  # type: ignore[arg-type]
    assert engine.names == {local: _NamesEngine.IMAGE, earlier: _NamesEngine.IMAGE}
    assert "docker login 127.0.0.1:5998" in str(raised.value)  # the remedy, named


def test_the_engine_saying_it_retried_marks_the_error() -> None:
    with pytest.raises(EngineError) as raised:
        parse_progress_stream(iter([{"error": "dial tcp: connection refused"}]))
    assert raised.value.retried is False
    engine = _RetriedEngine()
    with pytest.raises(EngineError) as raised:
        engine.push("r", "t")
    assert raised.value.retried is True
