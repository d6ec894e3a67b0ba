"""The tiny stack (stacks/ci-tiny.yaml) the registry, evidence, trust, pin and fault tests take
instead of ci-mini: a real stack, through the same code paths as every stack. Checked, rendered,
built, tested (its static checks; its GPU smoke skips here), pushed (under this run's own name:
the registry keeps every earlier run's evidence) with evidence signed by a build key, and that
evidence read back and trusted under a policy; megabytes, not gigabytes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder.image.records import load_record
from builder.image.registry import Registry
from tests.engine.conftest import TINY

pytestmark = pytest.mark.engine
#: ci-mini is 3.6 GB; the tiny stack is the local Debian + Python base (about 190 MB) and a
#: virtual environment with one package on top.
TINY_MAX_MB = 400


def test_the_tiny_stack_is_checked_built_and_tested_like_every_stack(
    tiny_stack: dict[str, str], cli_process: Callable[..., Any], workspace: Path, api: Any
) -> None:
    assert cli_process("check", TINY).stdout.strip() == f"ok  {TINY}"
    image = api.images.get(tiny_stack["ref"])
    assert image.labels["sm120-stacks.content-hash"] == tiny_stack["hash"]
    assert image.attrs["Size"] < TINY_MAX_MB << 20, image.attrs["Size"]
    record = load_record(workspace / "build", TINY, tiny_stack["hash"])
    assert (record.static, record.tests) == ("passed", "passed")


def test_the_tiny_stack_is_pushed_with_evidence_a_trust_policy_relies_on(
    tiny_pushed: dict[str, str],
    tiny_signing_key: Path,
    registry: Registry,
    cli_process: Callable[..., Any],
    tmp_path: Path,
) -> None:
    assert tiny_pushed["digest_ref"].startswith(f"{registry.repository}@sha256:")
    hosts = tmp_path / "hosts"
    (hosts / "keys").mkdir(parents=True)
    public = tiny_signing_key.with_suffix(".pub")
    shutil.copy(public, hosts / "keys" / public.name)
    policy = {
        "version": 1,
        "keys": {"tiny-build": f"keys/{public.name}"},
        "purposes": {"build": ["tiny-build"], "served": {}},
    }
    (hosts / "trust.yaml").write_text(json.dumps(policy))
    name = tiny_pushed["name"]
    shown = cli_process("--hosts-dir", str(hosts), "evidence", name, "--registry", registry.host)
    assert "static: passed  (tests: passed)" in shown.stdout, shown.stdout
    assert "signed by: tiny-build (" in shown.stdout, shown.stdout
    as_json = cli_process("evidence", name, "--registry", registry.host, "--json")
    assert json.loads(as_json.stdout)["static"] == "passed"
