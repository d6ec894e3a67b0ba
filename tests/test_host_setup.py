"""scripts/host-setup.sh: what `make stack`, `make test` and CI run before anything else."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from builder import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "host-setup.sh"


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("su") is None, reason="needs root to become another user"
)
def test_a_user_who_cannot_install_is_told_the_one_command_to_run() -> None:
    """Run from a copy in a folder everyone may enter: a checkout in `mktemp -d` (mode 0700, as
    CI's clean clone may be) is closed to the other user, who would get bash's 126 instead."""
    folder = Path(tempfile.mkdtemp(prefix="sm120-host-setup-"))
    try:
        folder.chmod(0o755)
        script = folder / SCRIPT.name
        shutil.copy2(SCRIPT, script)
        result = subprocess.run(
            ["su", "nobody", "-s", "/bin/bash", "-c", f"DOCKER_HOST= {script}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(folder)
    assert result.returncode == 2, result.stderr
    assert f"run  sudo {script}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.engine
def test_with_everything_up_it_does_nothing_and_says_nothing() -> None:
    result = subprocess.run([str(SCRIPT), "--registry"], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
