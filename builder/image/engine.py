"""The container engine: find a BuildKit-capable build client and the engine API, or say why not.

Detection happens when a command needs an engine, never at import time. Two build paths exist
in the wild: `docker buildx build` (buildx plugin) and the classic client with DOCKER_BUILDKIT=1,
which Docker clients before 23 still honour (Debian 12's docker.io 20.10). A 23+ client without
buildx refuses BuildKit, so it is skipped rather than used with the legacy builder: the
templates need RUN --mount and build secrets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from builder.errors import ToolMissing

INSTALL_HINT = (
    "install a Docker engine with BuildKit: on Debian `apt-get install docker.io` (12) or "
    "`apt-get install docker.io docker-buildx` (13+), then start dockerd"
)
CLIENT_CANDIDATES = ("docker", "/usr/bin/docker", "/usr/local/bin/docker")


@dataclass(frozen=True)
class BuildClient:
    """How to start a BuildKit build: argv prefix (before build options) and extra env."""

    kind: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        return f"{self.kind}: {env + ' ' if env else ''}{' '.join(self.argv)}"


def detect_build_client() -> BuildClient:
    """The first client on this machine that builds with BuildKit."""
    seen: set[str] = set()
    tried: list[str] = []
    for candidate in CLIENT_CANDIDATES:
        path = shutil.which(candidate)
        if path is None or os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        if _succeeds([path, "buildx", "version"]):
            return BuildClient("buildx", (path, "buildx", "build", "--load"))
        version = _client_version(path)
        if version is not None and version < 23:
            return BuildClient("classic+buildkit", (path, "build"), {"DOCKER_BUILDKIT": "1"})
        tried.append(f"{path} (client {version}, no buildx plugin)")
    found = "; ".join(tried) if tried else "no docker client on PATH"
    raise ToolMissing(f"no client here can build with BuildKit: {found}", hint=INSTALL_HINT)


def engine_api() -> Any:
    """A docker SDK client for what the engine API does well: inspect, tag, push, pull, run."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except DockerException as exc:
        raise ToolMissing(
            f"cannot reach a Docker engine ({exc.__class__.__name__}: {str(exc)[:200]})",
            hint=INSTALL_HINT + "; set DOCKER_HOST if it listens elsewhere",
        ) from None
    return client


def engine_reachable() -> bool:
    try:
        engine_api()
    except ToolMissing:
        return False
    return True


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
