"""Which client on this machine can build with BuildKit, or why none can.

Detection happens when a command needs a build, never at import time. Two build paths exist in
the wild: `docker buildx build` (buildx plugin) and the classic client with DOCKER_BUILDKIT=1,
which Docker clients before 23 still honour (Debian 12's docker.io 20.10). A 23+ client without
buildx refuses BuildKit, so it is skipped rather than used with the legacy builder: the
templates need RUN --mount and build secrets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from builder.errors import ToolMissing
from builder.image.engine import INSTALL_HINT

CLIENT_CANDIDATES = ("docker", "/usr/bin/docker", "/usr/local/bin/docker")
#: The first client major version that ignores DOCKER_BUILDKIT=1 without buildx.
BUILDX_REQUIRED_FROM = 23


@dataclass(frozen=True)
class BuildClient:
    """How to start a BuildKit build: argv prefix (before build options) and extra env."""

    kind: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        return f"{self.kind}: {env + ' ' if env else ''}{' '.join(self.argv)}"


def detect_build_client(candidates: Sequence[str] = CLIENT_CANDIDATES) -> BuildClient:
    """The first client on this machine that builds with BuildKit.

    The usual install places are tried after PATH: a newer client first on PATH (Docker's own
    packages in /usr/local/bin) often lacks buildx while the distribution's older one works.
    """
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
