"""Shared fixtures: a scratch copy of the stacks folder and the CLI runner."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from builder import REPO_ROOT
from builder.cli.main import cli

STACKS = REPO_ROOT / "stacks"

# The suite's registries (127.0.0.1:5000, the fault tests' own, the namespace hosts') speak
# plain HTTP: named insecure here, as a user names theirs (docs/evidence.md). The TLS test
# (tests/engine/test_tls_registry.py) runs without it.
os.environ.setdefault("SM120_STACKS_INSECURE_REGISTRIES", "127.0.0.0/8,10.0.0.0/8")


@pytest.fixture
def stacks_dir(tmp_path: Path) -> Path:
    """A copy of stacks/ beside a link to patches/, so tests can add or break manifests."""
    target = tmp_path / "stacks"
    shutil.copytree(STACKS, target)
    (tmp_path / "patches").symlink_to(REPO_ROOT / "patches")
    return target


@pytest.fixture
def write_stack(stacks_dir: Path) -> Callable[..., Path]:
    def write(name: str, text: str | bytes | dict[str, object]) -> Path:
        path = stacks_dir / f"{name}.yaml"
        if isinstance(text, dict):
            text = yaml.safe_dump(text, sort_keys=False)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    return write


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., Result]:
    def run(*args: str, stacks_dir: Path | None = None) -> Result:
        options = [
            "--stacks-dir",
            str(stacks_dir or STACKS),
            "--build-dir",
            str(tmp_path / "build"),
        ]
        return CliRunner().invoke(cli, [*options, *args], catch_exceptions=False)

    return run


def marlin_manifest() -> dict[str, object]:
    loaded = yaml.safe_load((STACKS / "vllm-0.22-marlin.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


# --- engine tests -------------------------------------------------------------------------------

REQUIRE_ENGINE = os.environ.get("SM120_STACKS_REQUIRE_ENGINE") == "1"
_engine_skips: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Engine tests run whenever an engine answers; without one they skip loudly, or fail in CI.
    Tests that ask the real package index (marker `network`) likewise, when PyPI does not
    answer."""
    _skip_network_tests_loudly(config, items)
    engine_items = [item for item in items if item.get_closest_marker("engine")]
    if not engine_items:
        return
    from builder.engine.address import from_environment
    from builder.engine.docker_adapter import engine_reachable

    if engine_reachable(from_environment()):
        return
    reason = "no Docker engine reachable (start dockerd, or see .ci/run)"
    if REQUIRE_ENGINE:
        reason = "SM120_STACKS_REQUIRE_ENGINE=1 but " + reason
        for item in engine_items:
            item.add_marker(pytest.mark.xfail(reason=reason, run=False, strict=True))
        # strict xfail with run=False still reports as xfailed; force a failure instead:
        config.option.sm120_engine_failure = reason
    else:
        for item in engine_items:
            item.add_marker(pytest.mark.skip(reason=reason))
    _engine_skips.append(f"{len(engine_items)} engine tests NOT RUN: {reason}")


def _skip_network_tests_loudly(config: pytest.Config, items: list[pytest.Item]) -> None:
    network_items = [item for item in items if item.get_closest_marker("network")]
    if not network_items:
        return
    import urllib.request

    try:
        urllib.request.urlopen("https://pypi.org/simple/six/", timeout=10).close()
        return
    except OSError as exc:
        reason = f"the package index does not answer (https://pypi.org: {exc})"
    if REQUIRE_ENGINE:
        config.option.sm120_engine_failure = reason
    for item in network_items:
        item.add_marker(pytest.mark.skip(reason=reason))
    _engine_skips.append(f"{len(network_items)} network tests NOT RUN: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if getattr(session.config.option, "sm120_engine_failure", None):
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _engine_skips:
        terminalreporter.write_sep("!", line, red=True, bold=True)


@pytest.fixture(autouse=True)
def _fake_hosts_have_the_served_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hosts the unit tests pin are not this machine: `pin` reads their GPU kind as the
    one their records served on (tests/support/served.py), not this machine's (none)."""
    from tests.support.served import SERVED_GPU

    monkeypatch.setattr("builder.cli.hosts._host_gpu_kind", lambda engine: SERVED_GPU)
