"""The stacks' patches apply cleanly to the exact pinned packages (downloaded from PyPI).

Each patch is dry-run with GNU patch against the files it touches, extracted from the pinned
wheel, so a patch that drifts from its package fails here, long before an hours-long build.
The wheels are cached under build/wheel-cache/ between runs.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from builder.manifest.resolve import resolve, stack_names
from builder.verify.expectations import added_lines
from tests.conftest import STACKS
from tests.support.wheels import pinned_wheel

#: Asks the real package index (PyPI): skipped loudly where it does not answer.
pytestmark = pytest.mark.network


def _patched_stacks() -> list[str]:
    return [n for n in stack_names(STACKS) if resolve(n, STACKS).manifest.patches]


@pytest.mark.parametrize("name", _patched_stacks())
def test_patches_apply_to_the_pinned_wheels(name: str, tmp_path: Path) -> None:
    stack = resolve(name, STACKS)
    python = stack.manifest.python
    pins = {**python.packages, **python.overrides}
    for patch in stack.manifest.patches:
        wheel = pinned_wheel(patch.package, pins[patch.package].version)
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
