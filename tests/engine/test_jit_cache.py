"""The image's FlashInfer cache, checked inside ci-mini with the image's own environment."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = [
    pytest.mark.engine,
    pytest.mark.needs_ci_mini("ci-mini's precompiled FlashInfer module"),
]

TOOL = "/opt/sm120-stacks/tools/flashinfer_jit.py"


def _run(api: Any, image: str, script: str) -> str:
    container = api.containers.run(image, ["bash", "-c", script], detach=True, network_mode="none")
    try:
        container.wait(timeout=300)
        return str(container.logs().decode())
    finally:
        container.remove(force=True)


def test_listed_module_is_a_hit_with_sm_120f_code_and_fresh_for_ninja(
    ci_mini: dict[str, str], api: Any
) -> None:
    out = _run(api, ci_mini["ref"], f"python {TOOL} verify norm")
    row = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert row["status"] == "hit" and row["aot"] and row["jit_fresh"], row
    assert "sm_120f" in row["archs"]


def test_a_module_not_in_the_cache_is_a_miss_by_name_and_is_not_compiled(
    ci_mini: dict[str, str], api: Any
) -> None:
    out = _run(
        api,
        ci_mini["ref"],
        f"python {TOOL} verify page; echo rc=$?; "
        "ls $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/*/120f/cached_ops/",
    )
    row = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert row == {
        "module": "page",
        "aot": False,
        "cached": False,
        "status": "miss",
        "detail": "no precompiled .so: it would compile on first use",
    }
    assert "rc=1" in out
    assert "page" not in out.split("rc=1", 1)[1], "verify must never compile"


def test_an_unknown_module_name_is_refused(ci_mini: dict[str, str], api: Any) -> None:
    out = _run(api, ci_mini["ref"], f"python {TOOL} verify no_such_module; echo rc=$?")
    assert "unknown module(s) no_such_module" in out and "rc=2" in out
