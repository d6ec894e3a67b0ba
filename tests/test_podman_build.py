"""`build` with its engine at podman's Docker-compatible API (host-setup's table tells a podman
user to point DOCKER_HOST there) says in one line that builds need Docker with BuildKit and that
podman can pin and deploy (issue 47, "Engines said as they are"). The engine is a stand-in for
podman's API (tests/support/podman_api.py; no podman is installed here); the build client is
this machine's real docker CLI, which fails as it did against podman 4.3.1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from builder.errors import ToolMissing
from builder.image.buildclient import detect_build_client
from tests.support.podman_api import podman_api


def test_build_at_podmans_api_says_builds_need_docker_with_buildkit(
    tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    try:
        client = detect_build_client()
    except ToolMissing:
        pytest.skip("no docker CLI that builds with BuildKit on this machine")
    if client.kind != "classic+buildkit":
        pytest.skip(f"checked with the classic client and DOCKER_BUILDKIT=1, not {client.kind}")
    socket = tmp_path / "podman.sock"
    with podman_api(socket) as asked:
        result = run_cli("build", "ci-tiny", "--engine", f"unix://{socket}")
    assert result.exit_code == 2, result.output
    assert "POST /session" in asked, "the client asked for BuildKit's session, podman has none"
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: this engine's API is podman's, which has no BuildKit (`unable to upgrade to "
        "h2c`): builds need Docker with BuildKit; podman can pin and deploy (GPUs through CDI, "
        "docs/gpu-host.md)"
    ]
    assert "Traceback" not in result.output
