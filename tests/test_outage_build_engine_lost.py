"""The engine killed as a build begins (bench/kill_outages.py, engine build t0.70): the docker
CLI loses it before any step started and says `error during connect: ... EOF`. That is the
engine lost, not a failed first step: the message says so and that a build again recovers
(before the fix: "build of STACK failed at its first step", naming nothing to do)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from builder.image.build import BuildFailed, _run_build
from builder.image.buildclient import BuildClient

#: What the classic client printed (bench/results/kill-sweep/outages/engine-build-t0.70-killed.txt,
#: its query string cut short).
LOST_BEFORE_A_STEP = (
    'error during connect: Post "http://%2Frun%2Fsm120-outage%2Fh1%2Fdocker.sock/v1.41/build'
    '?buildargs=%7B%7D&target=runtime&version=2": EOF\n'
)
NO_STEP_NO_ENGINE_WORD = "unknown flag: --frobnicate\n"


def client_printing(text: str) -> tuple[list[str], BuildClient]:
    argv = [sys.executable, "-c", f"import sys; sys.stdout.write({text!r}); sys.exit(1)"]
    return argv, BuildClient("test", tuple(argv))


def test_an_engine_lost_before_the_first_step_is_said_with_what_to_do(tmp_path: Path) -> None:
    argv, client = client_printing(LOST_BEFORE_A_STEP)
    with pytest.raises(BuildFailed) as caught:
        _run_build("s", argv, client, tmp_path / "s.log", live=False)
    message = str(caught.value)
    assert "stopped before its first step with no step failing" in message
    assert "the build client lost the engine" in message and "no image was tagged" in message
    assert "once it answers again (`docker version`), build again" in message
    assert "failed at its first step" not in message


def test_a_client_that_fails_on_its_own_still_fails_at_its_first_step(tmp_path: Path) -> None:
    argv, client = client_printing(NO_STEP_NO_ENGINE_WORD)
    with pytest.raises(BuildFailed, match="failed at its first step"):
        _run_build("s", argv, client, tmp_path / "s.log", live=False)


#: What the docker CLI printed with DOCKER_HOST at podman 4.3.1's API socket (the field report of
#: 2026-12-06, shared/reference/hosts_registries_2026-12-06.md, F3).
PODMAN_API = "ERROR: failed to dial gRPC: unable to upgrade to h2c, received 404\n"


def test_podman_s_api_is_said_in_one_line_builds_need_docker_with_buildkit(
    tmp_path: Path,
) -> None:
    from builder.errors import ToolMissing

    argv, client = client_printing(PODMAN_API)
    with pytest.raises(ToolMissing) as caught:
        _run_build("s", argv, client, tmp_path / "s.log", live=False)
    first = str(caught.value).splitlines()[0]
    assert "podman's, which has no BuildKit" in first
    assert "builds need Docker with BuildKit" in first and "podman can pin and deploy" in first
