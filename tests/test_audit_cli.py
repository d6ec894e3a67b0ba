"""`audit` from the command line: bad input exits 2 naming it and writes nothing; one network
test audits vLLM 0.33.0 -> 0.34.0 from PyPI (skipped loudly without it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder import REPO_ROOT
from builder.errors import StackError
from builder.upstream.wheelcache import _check_zip


def _audit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", "audit", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_release_name_without_a_version_is_bad_input() -> None:
    done = _audit("vllm", "--against", "vllm-0.33-marlin", "--no-device-code")
    assert done.returncode == 2, done.stderr
    assert "vllm: name a release as NAME==VERSION" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_wheel_that_is_not_a_zip_is_bad_input_naming_it(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"<html>not a wheel</html>")
    with pytest.raises(StackError, match=f"{wheel}: not a wheel"):
        _check_zip(wheel)


@pytest.mark.network
def test_vllm_0_34_against_the_0_33_marlin_stack_finds_what_the_field_scan_found() -> None:
    done = _audit("vllm==0.34.0", "--against", "vllm-0.33-marlin", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    lost = {(f["library"], f["lost"]) for f in result["device"] if f["lost"] > 0}
    assert ("vllm/_moe_C_stable_libtorch.abi3.so", 876) in lost
    texts = [f"{f['subject']}: {f['text']}" for f in result["findings"]]
    assert any(t.startswith("flashinfer-python: flashinfer-python==0.7.3 is not on") for t in texts)
    assert any(t.startswith("VLLM_USE_V2_MODEL_RUNNER: newly raises") for t in texts)
    assert any(t.startswith("VLLM_MARLIN_INPUT_DTYPE: newly raises") for t in texts)


@pytest.mark.network
def test_a_release_that_does_not_exist_is_bad_input_naming_it() -> None:
    done = _audit("vllm==0.34.99", "--against", "vllm-0.33-marlin", "--no-device-code")
    assert done.returncode == 2, done.stderr
    assert "vllm 0.34.99 has no wheel for linux/amd64 on https://pypi.org/simple" in done.stderr


@pytest.mark.network
def test_propose_with_audit_prints_the_findings_before_it_refuses(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    shutil.copytree(REPO_ROOT / "stacks", stacks)
    done = subprocess.run(
        [sys.executable, "-m", "builder", "--stacks-dir", str(stacks), "propose",
         "vllm-0.34-marlin", "--from", "vllm-0.33-marlin", "--set", "vllm=0.34.0",
         "--no-lock", "--audit"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "lost sm_120f machine code: 876 functions of Marlin MoE" in done.stdout
    assert "flashinfer-python==0.7.3 is not on https://pypi.org/simple" in done.stdout
    assert "requires flashinfer-python==0.7.3" in done.stderr
    assert not (stacks / "vllm-0.34-marlin.yaml").exists()
