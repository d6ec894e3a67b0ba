"""Shared fixtures: a scratch copy of the stacks folder and the CLI runner."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from builder import REPO_ROOT
from builder.cli import cli

STACKS = REPO_ROOT / "stacks"


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
