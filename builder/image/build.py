"""Rendered build context -> image, through BuildKit, content-addressed.

The image is tagged only after BuildKit finished successfully (it builds by image ID into an
--iidfile), so an interrupted or failed build never leaves a tag naming a stack; the layer cache
keeps what was done. Each build writes its full log and the exact command to replay it under
build/STACK/logs/.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from builder.errors import StackError
from builder.image.engine import BuildClient
from builder.image.jobs import auto_max_jobs
from builder.image.names import content_tag, image_labels, local_ref, moving_ref
from builder.image.progress import Progress
from builder.image.records import load_record, save_record
from builder.render.context import RenderedContext, render, write_context
from builder.spec.resolve import ResolvedStack

TARGET_STAGE = "runtime"
#: Label recording the image IDs the base tags pointed to at build time.
BASE_IDS_LABEL = "sm120-stacks.base-ids"


class BuildFailed(Exception):
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


def find_image(api: Any, ref: str, content_hash: str) -> Any | None:
    """The local image under ref if it really carries this content hash."""
    from docker.errors import ImageNotFound

    try:
        image = api.images.get(ref)
    except ImageNotFound:
        return None
    labels = image.labels or {}
    return image if labels.get("sm120-stacks.content-hash") == content_hash else None


def build_stack(
    stack: ResolvedStack, build_dir: Path, client: BuildClient, api: Any, options: BuildOptions
) -> BuildOutcome:
    started = time.monotonic()
    rendered = render(stack)
    content_hash = rendered.content_hash()
    ref = local_ref(stack.name, content_hash)
    existing = find_image(api, ref, content_hash)
    bases = local_base_ids(api, stack)
    if existing is not None and not options.no_cache and not _bases_moved(existing, bases):
        existing.tag(moving_ref(stack.name))
        return BuildOutcome(
            stack.name, content_hash, ref, existing.id, True, time.monotonic() - started
        )
    stack_dir = build_dir / stack.name
    with stack_dir_lock(stack_dir):
        context = write_context(rendered, stack_dir / "context")
        logs = stack_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{content_tag(stack.name, content_hash)}.log"
        command_path = logs / f"{content_tag(stack.name, content_hash)}.command.sh"
        _keep_previous(log_path)
        if options.max_jobs is None and stack.manifest.build.max_jobs == "auto":
            options = replace(options, max_jobs=auto_max_jobs(stack))
        with tempfile.TemporaryDirectory(prefix="sm120-build-") as scratch:
            iidfile = Path(scratch) / "iid"
            argv = build_argv(stack, rendered, context, client, options, iidfile)
            argv[-1:-1] = ["--label", f"{BASE_IDS_LABEL}={json.dumps(bases, sort_keys=True)}"]
            _write_replay(command_path, client, argv, iidfile)
            _run_build(stack.name, argv, client, log_path, options.live_progress)
            image_id = iidfile.read_text().strip()
        image = api.images.get(image_id)
        image.tag(ref)
        image.tag(moving_ref(stack.name))
        record = load_record(build_dir, stack.name, content_hash)
        record.attach_image(image_id)
        save_record(build_dir, record)
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


@contextmanager
def stack_dir_lock(stack_dir: Path) -> Iterator[None]:
    """One build (or render) of a stack at a time: each rewrites build/STACK/context, which
    BuildKit reads during the whole build, so a second one would swap the files under the
    first and its image would be tagged with a content hash it was not built from."""
    stack_dir.mkdir(parents=True, exist_ok=True)
    with open(stack_dir / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StackError(
                f"another build or render of {stack_dir.name} is running (it holds "
                f"{stack_dir / '.lock'})",
                hint="wait for it to finish, or stop it; builds of other stacks may run at once",
            ) from None
        yield


def _keep_previous(log_path: Path) -> None:
    """A retry of the same content hash (after an interruption, or a failed compile) would
    overwrite the log that says what went wrong; the attempt before it stays as `.log.1`."""
    if log_path.exists():
        log_path.replace(log_path.with_name(log_path.name + ".1"))


def local_base_ids(api: Any, stack: ResolvedStack) -> dict[str, str]:
    """Image IDs of the stack's base references as this engine has them now.

    A tag can move (a base rebuilt with `make base-local`, a mirror updated) without the
    rendered context changing; recording what each FROM meant lets a later build notice.
    Bases pinned by digest cannot move and are left out, as are bases the engine lacks.
    """
    from docker.errors import ImageNotFound

    ids = {}
    for base in (stack.manifest.bases.build, stack.manifest.bases.runtime):
        if base.digest:
            continue
        try:
            ids[base.image] = str(api.images.get(base.image).id)
        except ImageNotFound:
            continue
    return ids


def _bases_moved(image: Any, current: dict[str, str]) -> bool:
    recorded = json.loads((image.labels or {}).get(BASE_IDS_LABEL, "{}"))
    return any(recorded.get(ref) not in (None, image_id) for ref, image_id in current.items())


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
    for key, value in image_labels(stack, rendered.content_hash()).items():
        argv += ["--label", f"{key}={value}"]
    if options.ca_bundle is not None:
        argv += ["--secret", f"id=proxy-ca,src={options.ca_bundle}"]
    if options.hf_token_file is not None:
        argv += ["--secret", f"id=hf-token,src={options.hf_token_file}"]
    if options.max_jobs is not None:
        argv += ["--build-arg", f"MAX_JOBS={options.max_jobs}"]
    if options.no_cache:
        argv.append("--no-cache")
    argv.append(str(context))
    return argv


def _write_replay(path: Path, client: BuildClient, argv: list[str], iidfile: Path) -> None:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in client.env.items())
    replay = [a if a != str(iidfile) else "/tmp/sm120-stacks.iid" for a in argv]
    path.write_text(
        "#!/bin/sh\n# Replays this build exactly (the image is left untagged, as the tool does).\n"
        f"cd {shlex.quote(os.getcwd())}\n{env + ' ' if env else ''}{shlex.join(replay)}\n"
    )
    path.chmod(0o755)


def _run_build(
    stack: str, argv: list[str], client: BuildClient, log_path: Path, live: bool | None
) -> None:
    env = {**os.environ, **client.env}
    with log_path.open("w") as log, Progress(stack, live=live) as progress:
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
                progress.line(line)
            returncode = process.wait()
        except BaseException:
            _stop(process)
            log.write("\n[sm120-stacks] build interrupted; no image was tagged\n")
            raise
    if returncode != 0:
        failed = progress.tracker.failed
        step = f"step {_short(failed[0])}: {_short(failed[1])}" if failed else "its first step"
        raise BuildFailed(f"build of {stack} failed at {step}\n  log: {log_path}")


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
