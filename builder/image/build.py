"""Rendered build context -> image, through BuildKit, content-addressed.

The image is tagged only after BuildKit finished successfully (it builds by image ID into an
--iidfile), so an interrupted or failed build never leaves a tag naming a stack; the layer cache
keeps what was done. Each build writes its full log and the exact command to replay it under
build/STACK/logs/.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from builder.engine.address import ENV as ADDRESS_ENV
from builder.engine.address import client_env
from builder.engine.progress import Progress
from builder.engine.protocol import Engine, Image
from builder.errors import OperationFailed, StackError, ToolMissing, once_it_answers
from builder.image.basepins import (
    BASE_IDS_LABEL,
    BasePin,
    base_pins,
    base_trouble,
    recipe_trouble,
    recorded_bases,
)
from builder.image.basepull import base_unavailable_error, unpullable_base
from builder.image.buildcache import CacheSettings, cache_argv
from builder.image.buildclient import BuildClient
from builder.image.jobs import auto_max_jobs
from builder.image.names import content_tag, image_labels, local_ref, moving_ref
from builder.image.records import load_record, save_record
from builder.manifest.resolve import ResolvedStack
from builder.render.context import RenderedContext, pinned_context, write_context

TARGET_STAGE = "runtime"
#: Lines of the client's output kept for reading its final error (the full log is on disk).
TAIL_LINES = 40


class BuildFailed(OperationFailed):
    """The build itself failed (not the input): names the step and where the log is."""


@dataclass(frozen=True)
class BuildOptions:
    network: str = "host"
    #: CA bundle for TLS-intercepting proxies, passed as the `proxy-ca` BuildKit secret.
    ca_bundle: Path | None = None
    #: File holding a Hugging Face token, passed as the `hf-token` BuildKit secret.
    hf_token_file: Path | None = None
    #: Compile jobs for the JIT-cache stage; None keeps the manifest's number.
    max_jobs: int | None = None
    no_cache: bool = False
    live_progress: bool | None = None
    #: Inline cache metadata in the image, and registry cache sources (builder.image.buildcache).
    cache: CacheSettings = field(default_factory=CacheSettings)
    #: How long to wait for another build of the same stack to finish (0: refuse at once).
    lock_wait_s: float = 0.0


@dataclass(frozen=True)
class BuildOutcome:
    stack: str
    content_hash: str
    image_ref: str
    image_id: str
    reused: bool
    seconds: float
    log: Path | None = None
    command: Path | None = None


def find_image(engine: Engine, ref: str, content_hash: str) -> Image | None:
    """The local image under ref if it really carries this content hash."""
    image = engine.image(ref)
    if image is None or image.labels.get("sm120-stacks.content-hash") != content_hash:
        return None
    return image


def build_stack(
    stack: ResolvedStack,
    rendered: RenderedContext,
    build_dir: Path,
    client: Callable[[], BuildClient],
    engine: Engine,
    options: BuildOptions,
) -> BuildOutcome:
    """Build the image of rendered unless it exists. `client` is asked for only when a build
    runs: finding the client runs the docker CLI twice, a third of a no-op build's time."""
    started = time.monotonic()
    content_hash = rendered.content_hash()
    ref = local_ref(stack.name, content_hash)
    existing = find_image(engine, ref, content_hash)
    # Each base's tag is read once, here: FROM, the compile cache id and the label all name
    # what it held at this moment (image.basepins).
    pins = base_pins(engine, rendered.bases)
    recipe = recipe_trouble(pins)
    if recipe is not None:
        _say(f"{stack.name}: {recipe}; building, not reusing")
    reuse = existing is not None and not options.no_cache and recipe is None
    if existing is not None and reuse and _reusable(stack.name, existing, pins):
        return _reused(engine, build_dir, stack.name, existing, (ref, content_hash), started)
    stack_dir = build_dir / stack.name
    with stack_dir_lock(stack_dir, options.lock_wait_s) as waited:
        # Built while we waited? Without a wait nobody here was building it: the look above
        # still holds (at worst a build that ended in between is done again, all cached).
        existing = None if options.no_cache or not waited else find_image(engine, ref, content_hash)
        if existing is not None and recipe is None and base_trouble(existing, pins) is None:
            return _reused(engine, build_dir, stack.name, existing, (ref, content_hash), started)
        content_refs = {pin.reference: pin.content_ref for pin in pins.values()}
        pinned = pinned_context(rendered, stack, content_refs)
        context = write_context(pinned, stack_dir / "context")
        logs = stack_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{content_tag(stack.name, content_hash)}.log"
        command_path = logs / f"{content_tag(stack.name, content_hash)}.command.sh"
        _keep_previous(log_path)
        if options.max_jobs is None and stack.manifest.build.max_jobs == "auto":
            options = replace(options, max_jobs=auto_max_jobs(stack, engine.host()))
        image_id = _run_buildkit(
            stack, rendered, context, client(), engine, options, pins, (log_path, command_path)
        )
        engine.tag(image_id, ref)
        engine.tag(image_id, moving_ref(stack.name))
        _note_image(build_dir, stack.name, content_hash, image_id)
        return BuildOutcome(
            stack.name,
            content_hash,
            ref,
            image_id,
            False,
            time.monotonic() - started,
            log_path,
            command_path,
        )


def _run_buildkit(
    stack: ResolvedStack,
    rendered: RenderedContext,
    context: Path,
    build_client: BuildClient,
    engine: Engine,
    options: BuildOptions,
    pins: dict[str, BasePin],
    logs: tuple[Path, Path],
) -> str:
    """The build itself, the written context through BuildKit: its command saved to replay
    (logs: the log and the command's file), the bases' IDs labelled, and the image ID it
    wrote to its --iidfile returned, which only a finished build writes; nothing is tagged
    with the stack's name here, so a build that fails leaves no tag naming it."""
    log_path, command_path = logs
    with tempfile.TemporaryDirectory(prefix="sm120-build-") as scratch:
        iidfile = Path(scratch) / "iid"
        argv = build_argv(stack, rendered, context, build_client, options, iidfile)
        bases = json.dumps(recorded_bases(pins), sort_keys=True)
        argv[-1:-1] = ["--label", f"{BASE_IDS_LABEL}={bases}"]
        for pin in pins.values():  # the tags FROM names, made only now that a build runs
            engine.tag(pin.image.id, pin.content_ref)
        where = client_env(engine.address)
        _write_replay(command_path, build_client, argv, iidfile, where)
        written = (stack.manifest.bases.build.image, stack.manifest.bases.runtime.image)
        _run_build(stack.name, argv, build_client, log_path, options.live_progress, written, where)
        return iidfile.read_text().strip()


def _reused(
    engine: Engine,
    build_dir: Path,
    stack: str,
    image: Image,
    named: tuple[str, str],
    started: float,
) -> BuildOutcome:
    """An image of this content hash is there (named: its local reference and content hash):
    tagged as the stack's current one, noted in the record, and no build runs."""
    ref, content_hash = named
    engine.tag(image.id, moving_ref(stack))
    _note_image(build_dir, stack, content_hash, image.id)
    return BuildOutcome(stack, content_hash, ref, image.id, True, time.monotonic() - started)


def _note_image(build_dir: Path, stack: str, content_hash: str, image_id: str) -> None:
    """This build folder's record names the image its content tag holds. Another build folder
    (another user on the engine) may have built that content, or built it again: what this
    folder tested or pushed of another image is forgotten (`Record.attach_image`)."""
    record = load_record(build_dir, stack, content_hash)
    if record.image_id != image_id:
        record.attach_image(image_id)
        save_record(build_dir, record)


@contextmanager
def stack_dir_lock(stack_dir: Path, wait_s: float = 0.0) -> Iterator[bool]:
    """One build (or render) of a stack at a time: each rewrites build/STACK/context, which
    BuildKit reads during the whole build, so a second one would swap the files under the
    first and its image would be tagged with a content hash it was not built from.

    With wait_s, a second build waits for the first (saying so once, on stderr) and fails
    after wait_s; without, it is refused at once. The holder's pid is in the lock file, so the
    message can name it. The kernel drops the lock when its holder dies, even by SIGKILL.
    Yields whether it had to wait for another holder."""
    stack_dir.mkdir(parents=True, exist_ok=True)
    path = stack_dir / ".lock"
    with open(path, "a+") as handle:
        deadline = time.monotonic() + wait_s
        said = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _lock_holder(path)
                if wait_s <= 0:
                    raise StackError(
                        f"another build or render of {stack_dir.name} is running ({holder}; "
                        f"it holds {path})",
                        hint="wait for it to finish, or stop it; builds of other stacks may "
                        "run at once",
                    ) from None
                if time.monotonic() >= deadline:
                    raise OperationFailed(
                        f"waited {wait_s:.0f} s for the other build of {stack_dir.name} "
                        f"({holder}) to finish; it still holds {path}. Nothing was built."
                    ) from None
                if not said:
                    print(
                        f"waiting for the other build of {stack_dir.name} ({holder}) to finish "
                        f"(at most {wait_s:.0f} s; it holds {path})",
                        file=sys.stderr,
                        flush=True,
                    )
                    said = True
                time.sleep(LOCK_POLL_S)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        handle.flush()
        yield said


#: How often a waiting build tries the lock again.
LOCK_POLL_S = 1.0


def _lock_holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return text or "pid unknown"


def _keep_previous(log_path: Path) -> None:
    """A retry of the same content hash (after an interruption, or a failed compile) would
    overwrite the log that says what went wrong; the attempt before it stays as `.log.1`."""
    if log_path.exists():
        log_path.replace(log_path.with_name(log_path.name + ".1"))


def local_base_ids(engine: Engine, stack: ResolvedStack) -> dict[str, str]:
    """Image IDs of the stack's bases FROM names by tag, as this engine has them now (the
    label's value; base_pins holds the images themselves)."""
    named = {
        role: str(getattr(stack.manifest.bases, role).reference) for role in ("build", "runtime")
    }
    return recorded_bases(base_pins(engine, named))


def _bases_moved(image: Image, current: dict[str, str]) -> bool:
    """The image's label names other bases than current (reference -> image ID)."""
    recorded = json.loads(image.labels.get(BASE_IDS_LABEL, "{}"))
    return any(recorded.get(ref) != image_id for ref, image_id in current.items())


def _reusable(stack: str, image: Image, pins: dict[str, BasePin]) -> bool:
    """The image of this content hash was built on these bases; when not, says why (a build
    follows: never "up to date" for an image of another base)."""
    trouble = base_trouble(image, pins)
    if trouble is not None:
        _say(f"{stack}: the image {image.id.removeprefix('sha256:')[:12]} is not reused: {trouble}")
    return trouble is None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def build_argv(
    stack: ResolvedStack,
    rendered: RenderedContext,
    context: Path,
    client: BuildClient,
    options: BuildOptions,
    iidfile: Path,
) -> list[str]:
    argv = [
        *client.argv,
        "--progress=plain",
        "--network",
        options.network,
        "--platform",
        stack.manifest.platform,
        "--target",
        TARGET_STAGE,
        "--iidfile",
        str(iidfile),
        "--file",
        str(context / "Dockerfile"),
    ]
    for key, value in image_labels(stack, rendered).items():
        argv += ["--label", f"{key}={value}"]
    if options.ca_bundle is not None:
        argv += ["--secret", f"id=proxy-ca,src={options.ca_bundle}"]
    if options.hf_token_file is not None:
        argv += ["--secret", f"id=hf-token,src={options.hf_token_file}"]
    if options.max_jobs is not None:
        argv += ["--build-arg", f"MAX_JOBS={options.max_jobs}"]
    if options.no_cache:
        argv.append("--no-cache")
    argv += cache_argv(options.cache, client.kind)
    argv.append(str(context))
    return argv


def _write_replay(
    path: Path, client: BuildClient, argv: list[str], iidfile: Path, where: dict[str, str]
) -> None:
    """where: the engine the build ran on (DOCKER_HOST: a remote one over ssh://, or another
    socket), named in the script so that it replays there."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**where, **client.env}.items())
    replay = [a if a != str(iidfile) else "/tmp/sm120-stacks.iid" for a in argv]
    path.write_text(
        "#!/bin/sh\n# Replays this build exactly (the image is left untagged, as the tool does).\n"
        f"cd {shlex.quote(os.getcwd())}\n{env + ' ' if env else ''}{shlex.join(replay)}\n"
    )
    path.chmod(0o755)


def _run_build(
    stack: str,
    argv: list[str],
    client: BuildClient,
    log_path: Path,
    live: bool | None,
    bases: Sequence[str] = (),
    where: dict[str, str] | None = None,
) -> None:
    """Run the client, logging every line; a failure names its step, or the base image that
    could not be pulled (`bases`: the stack's base references as its manifest writes them).
    A log that cannot be written (its disk full) stops the build: nothing is tagged."""
    env = {**os.environ, **(where or {}), **client.env}
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    try:
        returncode, progress = _logged_build(stack, argv, env, log_path, tail, live)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise BuildFailed(
            f"build of {stack} stopped: its log {log_path} could not be written "
            f"({exc.strerror}); the build client was stopped and no image was tagged. Free "
            "space there and build again: the layers built so far are in the build cache."
        ) from None
    if returncode != 0:
        failed, current = progress.tracker.failed, progress.tracker.current
        if failed is None and _podman_api(tail):
            raise ToolMissing(PODMAN_CANNOT_BUILD, hint=f"log: {log_path}")
        if failed is None and (current is not None or _client_lost_engine(tail)):
            engine = (where or {}).get(ADDRESS_ENV)
            raise BuildFailed(_engine_lost(stack, current, tail, log_path, engine))
        step = f"step {_short(failed[0])}: {_short(failed[1])}" if failed else "its first step"
        failure = BuildFailed(f"build of {stack} failed at {step}\n  log: {log_path}")
        base = unpullable_base(failed, tail)
        if base is not None:
            raise base_unavailable_error(stack, base, bases, log_path) from failure
        raise failure


#: podman's Docker-compatible API has no BuildKit session endpoint: the docker CLI's BuildKit
#: build (DOCKER_HOST at podman's socket) fails at once with "failed to dial gRPC: unable to
#: upgrade to h2c, received 404" (podman 4.3, docs/gpu-host.md).
PODMAN_CANNOT_BUILD = (
    "this engine's API is podman's, which has no BuildKit (`unable to upgrade to h2c`): builds "
    "need Docker with BuildKit; podman can pin and deploy (GPUs through CDI, docs/gpu-host.md)"
)


def _podman_api(tail: deque[str]) -> bool:
    return any("unable to upgrade to h2c" in line for line in tail)


#: How the docker CLI says it lost its engine before any step ran (the engine killed as the
#: build began: bench/results/kill-sweep/outages/, engine-build-t0.70-killed.txt).
_CLIENT_LOST = ("error during connect", "cannot connect to the docker daemon")


def _client_lost_engine(tail: deque[str]) -> bool:
    return any(line.lower().startswith(_CLIENT_LOST) for line in tail)


def _engine_lost(
    stack: str, step: str | None, tail: deque[str], log_path: Path, engine: str | None = None
) -> str:
    """The client failed while no step had: the engine went away under the build (restarted,
    stopped, its socket gone), during a step or before the first. No step is to blame, and a
    retry is what recovers."""
    last = next((line for line in reversed(tail) if line.strip()), "no output")
    where = f"during step {_short(step, 100)}" if step else "before its first step"
    return (
        f"build of {stack} stopped {where} with no step failing: the "
        f"build client lost the engine (it said: {_short(last, 120)}); no image was tagged; "
        + once_it_answers(
            f"build again: the finished steps are in its build cache (log: {log_path})", engine
        )
    )


def _logged_build(
    stack: str,
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    tail: deque[str],
    live: bool | None,
) -> tuple[int, Progress]:
    """The client's exit status, each line of its output written to the log as it comes
    (line-buffered: a full disk shows at the line that did not fit, not at the end)."""
    with log_path.open("w", buffering=1) as log, Progress(stack, live=live) as progress:
        log.write(f"$ {shlex.join(argv)}\n")
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            assert process.stdout is not None
            for raw in process.stdout:
                line = raw.rstrip("\n")
                log.write(line + "\n")
                tail.append(line)
                progress.line(line)
            returncode = process.wait()
        except BaseException:
            _stop(process)
            with contextlib.suppress(OSError):  # the log's own disk may be what failed
                log.write("\n[sm120-stacks] build interrupted; no image was tagged\n")
            raise
    return returncode, progress


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stop(process: subprocess.Popen[str]) -> None:
    """Stop the client and everything it started (it runs in its own session)."""
    for sig, wait in ((signal.SIGINT, 10), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
