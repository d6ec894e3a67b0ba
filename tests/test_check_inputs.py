"""The image checks take their expectations from a plugin object, not the process environment.

Run against testinfra's local:// backend with only the checks that read the image's config (no
container needed). Two runs in one process with different expectations must each judge by their
own: the checks module stays imported between them, which is where import-time globals failed.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from builder.verify.run_checks import CheckInputs, run_checks

CONFIG_CHECKS = "labels_identify_the_stack or config_runs_the_serve_command"


def _expect(stack: str) -> dict[str, Any]:
    return {
        "stack": stack,
        "content_hash": "abc123",
        "env": {"FLASHINFER_CUDA_ARCH_LIST": "12.0f"},
        "packages": {},
        "patches": [],
        "cmd": ["vllm", "serve", "model"],
        "port": 8000,
    }


def _inspect(stack: str) -> dict[str, Any]:
    labels = {
        "sm120-stacks.stack": stack,
        "sm120-stacks.content-hash": "abc123",
        "sm120-stacks.arch": json.dumps({"FLASHINFER_CUDA_ARCH_LIST": "12.0f"}),
        "sm120-stacks.manifest": json.dumps({"name": stack}),
    }
    return {
        "Config": {
            "Labels": labels,
            "Cmd": ["vllm", "serve", "model"],
            "ExposedPorts": {"8000/tcp": {}},
            "Env": ["FLASHINFER_CUDA_ARCH_LIST=12.0f"],
        }
    }


def _verdicts(expect: dict[str, Any], inspect: dict[str, Any], workdir: Path) -> dict[str, bool]:
    inputs = CheckInputs(expect, inspect, [])
    return {r.name: r.passed for r in run_checks(inputs, "local://", workdir, CONFIG_CHECKS)}


def test_each_run_judges_by_its_own_expectations(tmp_path: Path) -> None:
    good = _verdicts(_expect("alpha"), _inspect("alpha"), tmp_path)
    assert good == {"labels_identify_the_stack": True, "config_runs_the_serve_command": True}
    mislabelled = _verdicts(_expect("beta"), _inspect("alpha"), tmp_path)
    assert mislabelled["labels_identify_the_stack"] is False
    assert mislabelled["config_runs_the_serve_command"] is True
    again = _verdicts(_expect("alpha"), _inspect("alpha"), tmp_path)
    assert again == good


def test_the_installed_set_must_equal_the_lock(tmp_path: Path) -> None:
    """Against this test's own environment: its exact set passes, one moved version fails, and a
    stack without a lock skips the check. Needs setuptools installed here (a dev dependency's)."""
    environment = {
        canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()
    }
    environment.pop("pip", None)
    expect = {**_expect("alpha"), "python": sys.executable, "locked": environment}

    def verdict(locked: dict[str, str] | None) -> Any:
        inputs = CheckInputs({**expect, "locked": locked}, _inspect("alpha"), [])
        (result,) = run_checks(inputs, "local://", tmp_path, "installed_set_equals_the_lock")
        return result

    assert verdict(environment).passed
    moved = verdict({**environment, "pyyaml": "0.0.1"})
    assert not moved.passed and "pyyaml 0.0.1 -> " in moved.detail
    assert "missing" in verdict({**environment, "not-installed-here": "1.0"}).detail
    # setuptools: seeded by venv on Python 3.11, so ignored unless the lock holds it.
    unseeded = {n: v for n, v in environment.items() if n != "setuptools"}
    assert verdict(unseeded).passed
    assert "setuptools 0.0.1 -> " in verdict({**environment, "setuptools": "0.0.1"}).detail
    assert verdict(None).skipped


def test_the_image_must_be_built_for_the_stack_platform(tmp_path: Path) -> None:
    """The image config's Os/Architecture against the stack's platform: an arm64 stack whose
    image came out amd64 fails, naming both."""
    expect = {**_expect("alpha"), "platform": "linux/arm64"}
    check = "image_is_built_for_the_stack_platform"

    def verdict(architecture: str) -> Any:
        inspect = {**_inspect("alpha"), "Os": "linux", "Architecture": architecture}
        (result,) = run_checks(CheckInputs(expect, inspect, []), "local://", tmp_path, check)
        return result

    assert verdict("arm64").passed
    wrong = verdict("amd64")
    assert not wrong.passed
    assert "image is linux/amd64, the stack says linux/arm64" in wrong.detail
