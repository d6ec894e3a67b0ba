"""The stacks' patches apply cleanly to the exact pinned packages (downloaded from PyPI).

Each patch is dry-run with GNU patch against the files it touches, extracted from the pinned
wheel, so a patch that drifts from its package fails here, long before an hours-long build.
The wheels are cached under build/wheel-cache/ between runs.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder import REPO_ROOT
from builder.expectations import added_lines
from builder.resolve import resolve, stack_names
from tests.conftest import STACKS

CACHE = REPO_ROOT / "build" / "wheel-cache"


def _patched_stacks() -> list[str]:
    return [n for n in stack_names(STACKS) if resolve(n, STACKS).manifest.patches]


def _wheel(package: str, version: str) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    stem = package.replace("-", "_")
    found = [p for p in CACHE.glob(f"{stem}-{version}-*.whl")]
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                "manylinux_2_31_x86_64",
                "--python-version",
                "3.12",
                "-d",
                str(CACHE),
                f"{package}=={version}",
            ],
            check=True,
        )
        found = list(CACHE.glob(f"{stem}-{version}-*.whl"))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("name", _patched_stacks())
def test_patches_apply_to_the_pinned_wheels(name: str, tmp_path: Path) -> None:
    stack = resolve(name, STACKS)
    python = stack.manifest.python
    pins = {**python.packages, **python.overrides}
    for patch in stack.manifest.patches:
        wheel = _wheel(patch.package, pins[patch.package].version)
        patch_file = stack.local_file(patch.file)
        targets = added_lines(patch_file.read_text(), patch.strip)
        site = tmp_path / patch.package
        with zipfile.ZipFile(wheel) as archive:
            for target in targets:
                archive.extract(target, site)
        result = subprocess.run(
            [
                "patch",
                "--dry-run",
                "--forward",
                "--batch",
                f"--strip={patch.strip}",
                f"--directory={site}",
                f"--input={patch_file}",
            ],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, f"{patch.file} on {wheel.name}:\n{result.stdout}"
        assert "FAILED" not in result.stdout and "offset" not in result.stdout, result.stdout
