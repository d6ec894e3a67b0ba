"""Which client on this machine can build with BuildKit, or why none can.

Detection happens when a command needs a build, never at import time. Two build paths exist in
the wild: `docker buildx build` (buildx plugin) and the classic client with DOCKER_BUILDKIT=1,
which Docker clients before 23 still honour (Debian 12's docker.io 20.10). A 23+ client without
buildx refuses BuildKit, so it is skipped rather than used with the legacy builder: the
templates need RUN --mount and build secrets.

Asking takes up to four runs of the docker CLI, two of them round trips to the engine: 0.3 s
and more of a rebuild that BuildKit does in 0.1 s. With a memo file the answer is kept, keyed by
the metadata (path, size, mtime, inode) of every candidate client and of the folders where the
CLI finds its buildx plugin: a client or plugin installed, removed or upgraded asks again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from builder.engine.protocol import INSTALL_HINT
from builder.errors import ToolMissing
from builder.files import fingerprint as file_fingerprint
from builder.files import memo_path as memo_file
from builder.files import write_atomic

CLIENT_CANDIDATES = ("docker", "/usr/bin/docker", "/usr/local/bin/docker")
#: The first client major version that ignores DOCKER_BUILDKIT=1 without buildx.
BUILDX_REQUIRED_FROM = 23
#: Where the docker CLI looks for plugins (besides $DOCKER_CONFIG/cli-plugins): a buildx added
#: or removed there changes the answer.
PLUGIN_DIRS = (
    "/usr/local/lib/docker/cli-plugins",
    "/usr/local/libexec/docker/cli-plugins",
    "/usr/lib/docker/cli-plugins",
    "/usr/libexec/docker/cli-plugins",
)


@dataclass(frozen=True)
class BuildClient:
    """How to start a BuildKit build: argv prefix (before build options) and extra env."""

    kind: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        return f"{self.kind}: {env + ' ' if env else ''}{' '.join(self.argv)}"


def client_memo(build_dir: Path) -> Path:
    """Where a build folder keeps the answer (one machine's clients: beside the folder's other
    caches)."""
    return memo_file(build_dir, "build-client.json")


def detect_build_client(
    candidates: Sequence[str] = CLIENT_CANDIDATES, memo: Path | None = None
) -> BuildClient:
    """The first client on this machine that builds with BuildKit.

    The usual install places are tried after PATH: a newer client first on PATH (Docker's own
    packages in /usr/local/bin) often lacks buildx while the distribution's older one works.
    With memo (a file), an answer found before for the same clients and plugins is reused;
    no client found is never kept.
    """
    if memo is None:
        return _detect(candidates)
    key = _installation_key(candidates)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        kept = json.loads(memo.read_text())
        if kept["key"] == key:
            client = kept["client"]
            return BuildClient(client["kind"], tuple(client["argv"]), dict(client["env"]))
    found = _detect(candidates)
    with contextlib.suppress(OSError):  # a memo that cannot be written costs time only
        write_atomic(memo, json.dumps({"key": key, "client": asdict(found)}) + "\n")
    return found


def _installation_key(candidates: Sequence[str]) -> str:
    """sha256 over what decides the answer: each candidate as PATH resolves it and the file it
    is, and the plugin folders with the buildx plugin in each."""
    config = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    digest = hashlib.sha256()

    def note(label: str, path: str) -> None:
        digest.update(f"{label}\0{path}\0{file_fingerprint(path)}\0".encode())

    for candidate in candidates:
        path = shutil.which(candidate)
        note(f"{candidate} -> {path}", os.path.realpath(path) if path else "")
    for folder in (os.path.join(config, "cli-plugins"), *PLUGIN_DIRS):
        note("plugins", folder)
        note("buildx", os.path.join(folder, "docker-buildx"))
    return digest.hexdigest()


def _detect(candidates: Sequence[str]) -> BuildClient:
    seen: set[str] = set()
    tried: list[str] = []
    for candidate in candidates:
        path = shutil.which(candidate)
        if path is None or os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        if _succeeds([path, "buildx", "version"]):
            return BuildClient("buildx", (path, "buildx", "build", "--load"))
        version = _client_version(path)
        if version is not None and version < BUILDX_REQUIRED_FROM:
            return BuildClient("classic+buildkit", (path, "build"), {"DOCKER_BUILDKIT": "1"})
        tried.append(f"{path} (client {version}, no buildx plugin)")
    found = "; ".join(tried) if tried else "no docker client on PATH"
    raise ToolMissing(f"no client here can build with BuildKit: {found}", hint=INSTALL_HINT)


def _succeeds(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _client_version(path: str) -> int | None:
    try:
        result = subprocess.run(
            [path, "version", "--format", "{{.Client.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    head = result.stdout.strip().split(".")[0]
    return int(head) if head.isdigit() else None
