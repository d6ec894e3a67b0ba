"""The soak, for real: ci-mini's image serves the trained tiny model under concurrent streaming
chat. It must pass as it is, and fail by the right check (its name) when a hook in the server's
Python makes every soak stream stop sending (the sm12x sampler freeze's symptom: /health still
answers) or leak memory on each soak request. The hooks act only on the soak's requests (its
User-Agent), so the smoke before the soak passes each time.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from builder.engine.docker_adapter import DockerEngine
from builder.manifest.resolve import ResolvedStack, resolve
from builder.verify.smoke import run_smoke
from builder.verify.smoke_report import SmokeReport
from builder.verify.soak import after_smoke
from builder.verify.soak_load import USER_AGENT
from builder.verify.soak_verdict import CHECK_ERRORS, CHECK_MEMORY, CHECK_STALL
from tests.engine.test_smoke import HEALTH_TIMEOUT_S, MODEL_PATH, failed_names, site_packages

pytestmark = [pytest.mark.engine, pytest.mark.needs_ci_mini("soaks transformers serve")]

#: Long enough for the tiny model to go through every prompt length many times on 2 cores.
PASS_SECONDS = 12
#: A soak that must fail ends at its failure; this is only its ceiling.
FAIL_SECONDS = 60
#: Short enough that the warm-up (a tenth, at least 2 s) ends before the leak's cap.
LEAK_SECONDS = 30

#: Every soak stream stops sending after the server's 4th soak request (open ones included):
#: the server stays up and answers /health, as a frozen sampler's does.
STALL_HOOK = f"""
import sys
if "serve" in sys.argv:
    import asyncio
    import fastapi

    _call = fastapi.FastAPI.__call__
    _soak = {{"requests": 0}}

    async def _stall_soak(self, scope, receive, send):
        agent = dict(scope.get("headers") or []).get(b"user-agent", b"")
        if scope.get("path") != "/v1/chat/completions" or not agent.startswith(
            {USER_AGENT.encode()!r}
        ):
            return await _call(self, scope, receive, send)
        _soak["requests"] += 1

        async def held(message):
            if _soak["requests"] > 4 and message.get("type") == "http.response.body":
                await asyncio.sleep(3600)
            await send(message)

        return await _call(self, scope, receive, held)

    fastapi.FastAPI.__call__ = _stall_soak
"""

#: Every soak request leaves 8 MB behind in the server (touched, so it is resident), up to 2 GB:
#: past a 100 MB bound within seconds of the warm-up, whether the tiny model answers 40
#: requests a second (an idle machine) or 2 (a loaded one). A cap reached within the warm-up
#: would leave nothing to see after it.
LEAK_HOOK = f"""
import sys
if "serve" in sys.argv:
    import fastapi

    _call = fastapi.FastAPI.__call__
    _kept = []

    async def _leak_soak(self, scope, receive, send):
        agent = dict(scope.get("headers") or []).get(b"user-agent", b"")
        if scope.get("path") == "/v1/chat/completions" and agent.startswith(
            {USER_AGENT.encode()!r}
        ) and len(_kept) < 256:
            _kept.append(b"\\x01" * (8 << 20))
        return await _call(self, scope, receive, send)

    fastapi.FastAPI.__call__ = _leak_soak
"""


@pytest.fixture(scope="module")
def soak_stack(workspace: Path, ci_mini: dict[str, str]) -> ResolvedStack:
    stack = resolve("ci-mini", workspace / "stacks")
    smoke = stack.manifest.smoke.model_copy(update={"health_timeout_s": HEALTH_TIMEOUT_S})
    return dataclasses.replace(stack, manifest=stack.manifest.model_copy(update={"smoke": smoke}))


def with_soak(stack: ResolvedStack, **changes: Any) -> ResolvedStack:
    smoke = stack.manifest.smoke
    soak = smoke.soak.model_copy(update=changes)
    updated = smoke.model_copy(update={"soak": soak})
    return dataclasses.replace(stack, manifest=stack.manifest.model_copy(update={"smoke": updated}))


def soaked(
    engine: DockerEngine,
    ci_mini: dict[str, str],
    stack: ResolvedStack,
    models: dict[str, Path],
    report_dir: Path,
    seconds: int,
    hook: str | None = None,
) -> SmokeReport:
    mounts = {str(models["trained"]): MODEL_PATH}
    if hook is not None:
        site = site_packages(engine.sdk, ci_mini, stack)
        hook_file = report_dir / "zz_soak_hook.py"
        pth = report_dir / "zz_soak_hook.pth"
        report_dir.mkdir(parents=True, exist_ok=True)
        hook_file.write_text(hook)
        pth.write_text("import zz_soak_hook\n")
        for path in (hook_file, pth):
            path.chmod(0o644)
        mounts |= {str(hook_file): f"{site}/zz_soak_hook.py", str(pth): f"{site}/zz_soak_hook.pth"}
    return run_smoke(
        engine,
        ci_mini["ref"],
        stack,
        mounts=mounts,
        gpu=False,
        report_path=report_dir / "report" / "ci-mini-smoke.json",
        log=lambda line: None,
        after=after_smoke(stack, seconds, report_dir / "report" / "ci-mini-soak"),
    )


def test_the_tiny_model_passes_a_soak_with_its_numbers(
    engine: DockerEngine,
    ci_mini: dict[str, str],
    soak_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
) -> None:
    report = soaked(engine, ci_mini, soak_stack, models, tmp_path, PASS_SECONDS)
    assert report.passed, report.failed()
    names = {c.name for c in report.checks}
    assert {CHECK_STALL, CHECK_ERRORS, CHECK_MEMORY} <= names
    soak = report.soak
    assert soak is not None and soak["passed"] and soak["stopped_early"] is None
    assert soak["ran_s"] >= PASS_SECONDS
    assert soak["requests"] >= 3 and soak["errors"] == 0
    assert sum(kind["requests"] for kind in soak["by_kind"].values()) == soak["requests"]
    assert soak["ttft_s"]["p50"] and soak["ttft_s"]["p99"] and soak["itl_s"]["p99"]
    assert soak["memory"]["source"] == "container memory (engine stats)"
    assert soak["memory"]["samples"] >= PASS_SECONDS - 2
    folder = tmp_path / "report"
    assert json.loads((folder / "ci-mini-soak.json").read_text())["passed"] is True
    rows = list(csv.DictReader((folder / "ci-mini-soak.csv").open()))
    assert len(rows) >= PASS_SECONDS and any(float(r["tokens_per_s"]) > 0 for r in rows)
    assert (folder / "ci-mini-soak.png").read_bytes().startswith(b"\x89PNG")
    smoke = json.loads((folder / "ci-mini-smoke.json").read_text())
    assert smoke["soak"]["files"]["png"].endswith("ci-mini-soak.png")


def test_streams_that_stop_while_the_server_is_up_fail_as_a_stall(
    engine: DockerEngine,
    ci_mini: dict[str, str],
    soak_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
) -> None:
    stack = with_soak(soak_stack, stall_s=4)
    report = soaked(engine, ci_mini, stack, models, tmp_path, FAIL_SECONDS, STALL_HOOK)
    assert failed_names(report) == {CHECK_STALL}, report.failed()
    detail = report.failed()[0].detail
    assert "while the server was up" in detail and "open streams for" in detail
    assert report.soak is not None and report.soak["ran_s"] < 30


def test_a_server_that_leaks_fails_on_memory_growth(
    engine: DockerEngine,
    ci_mini: dict[str, str],
    soak_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
) -> None:
    stack = with_soak(soak_stack, max_memory_growth_mb=100)
    report = soaked(engine, ci_mini, stack, models, tmp_path, LEAK_SECONDS, LEAK_HOOK)
    assert failed_names(report) == {CHECK_MEMORY}, report.failed()
    assert "at most 100 MB" in report.failed()[0].detail
    assert report.soak is not None and report.soak["ran_s"] < 30
