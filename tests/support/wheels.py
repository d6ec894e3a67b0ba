"""Pinned wheels from PyPI, cached under build/wheel-cache/ between runs: tests that check the
stacks' data (patches, FlashInfer generator names) against the exact packages they pin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from builder import REPO_ROOT

CACHE = REPO_ROOT / "build" / "wheel-cache"


def pinned_wheel(package: str, version: str) -> Path:
    """The wheel of package==version for the stacks' platform (manylinux x86_64, Python 3.12)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    stem = package.replace("-", "_")
    found = list(CACHE.glob(f"{stem}-{version}-*.whl"))
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
