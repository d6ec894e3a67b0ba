"""scripts/host-setup.sh: what `make stack`, `make test` and CI run before anything else."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from builder import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "host-setup.sh"


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("su") is None, reason="needs root to become another user"
)
def test_a_user_who_cannot_install_is_told_the_one_command_to_run() -> None:
    result = subprocess.run(
        ["su", "nobody", "-s", "/bin/bash", "-c", f"DOCKER_HOST= {SCRIPT}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"run  sudo {SCRIPT}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.engine
def test_with_everything_up_it_does_nothing_and_says_nothing() -> None:
    result = subprocess.run([str(SCRIPT), "--registry"], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
