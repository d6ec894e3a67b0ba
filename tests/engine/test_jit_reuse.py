"""Rebuilds compile only what changed (issue 37): a child of ci-mini that adds one package
FlashInfer does not import rebuilds with its FlashInfer compile step CACHED, read from the
BuildKit log the tool keeps, and `test`'s per-module table still finds every module a hit in
the child's final image, with the child's own packages."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder.image.names import content_tag, local_ref
from builder.manifest.resolve import resolve
from builder.render.context import render, template_context

pytestmark = [
    pytest.mark.engine,
    pytest.mark.needs_ci_mini("ci-mini's compiled FlashInfer modules reused by a child"),
]

TOOL = "/opt/sm120-stacks/tools/flashinfer_jit.py"
#: The compile step's header in BuildKit's plain log: "#12 [jit-cache 3/3] RUN --mount=...".
COMPILE_STEP = re.compile(r"^(#\d+) \[jit-cache \d+/\d+\] RUN .*flashinfer_jit\.py", re.M)


def build_log(workspace: Path, stack: str) -> str:
    """The BuildKit log of the stack's current image (build/NAME/logs/TAG.log)."""
    content_hash = render(resolve(stack, workspace / "stacks")).content_hash()
    path = workspace / "build" / stack / "logs" / f"{content_tag(stack, content_hash)}.log"
    return path.read_text()


def compile_step_outcome(log: str) -> str:
    """CACHED, or DONE with its seconds, for the FlashInfer compile step of one build log."""
    header = COMPILE_STEP.search(log)
    assert header, "no jit-cache compile step in the build log"
    step = re.escape(header.group(1))
    outcome = re.findall(rf"^{step} (CACHED|DONE [\d.]+s)$", log, flags=re.M)
    assert outcome, f"the compile step {header.group(1)} never finished in the log"
    return outcome[-1]


def run_in(api: Any, image: str, script: str) -> str:
    """The output of a bash script in a throwaway container of image (no network); it must
    succeed."""
    container = api.containers.run(image, ["bash", "-c", script], detach=True, network_mode="none")
    try:
        status = container.wait(timeout=300)["StatusCode"]
        output = container.logs().decode()
        assert status == 0, output
        return output
    finally:
        container.remove(force=True)


def compiled_modules(api: Any, image: str, folders: list[str]) -> list[str]:
    """Every shared library under folders in the image, with its sha256 and modification time:
    a module compiled again has another time, if not other bytes."""
    find = f"find {' '.join(folders)} -name '*.so' -type f"
    script = f"{find} -exec sha256sum {{}} + && {find} -exec stat -c '%Y %n' {{}} +"
    return sorted(run_in(api, image, script).splitlines())


def test_a_child_adding_an_unrelated_package_reuses_the_compiled_modules(
    ci_mini: dict[str, str],
    cli_process: Callable[..., Any],
    variant: Callable[[str, str], str],
    workspace: Path,
    models: dict[str, Path],
    api: Any,
) -> None:
    child = variant("jit-reuse", "python: {packages: {six: 1.17.0}}")
    started = time.time()
    cli_process("build", child)
    log = build_log(workspace, child)
    assert compile_step_outcome(log) == "CACHED", "the child compiled FlashInfer again"
    assert "flashinfer_jit: [1/1] compiling norm" not in log
    # The modules were made before this build began: not compiled again.
    content_hash = render(resolve(child, workspace / "stacks")).content_hash()
    ctx = template_context(resolve(child, workspace / "stacks"))
    folders = [ctx.jit_env["FLASHINFER_WORKSPACE_BASE"], ctx.aot_dir]
    modules = [
        compiled_modules(api, ref, folders)
        for ref in (ci_mini["ref"], local_ref(child, content_hash))
    ]
    assert any(line.endswith("/norm.so") for line in modules[0]), modules[0]
    # Not the parent's bytes either: nvcc's output differs between two compiles of the same
    # inputs, and a build cache pruned since the parent was tagged (.ci/run on a full disk)
    # gives the child a later compile. What proves reuse is the step CACHED and its modules
    # older than this build.
    made = [int(line.split(" ", 1)[0]) for line in modules[1] if line.split(" ", 1)[0].isdigit()]
    assert made and max(made) < started, "a module of the child was made during its build"
    child_ref = local_ref(child, content_hash)
    assert run_in(api, child_ref, "python -c 'import six; print(six.__version__)'") == "1.17.0\n"
    result = cli_process(
        "test", child, "--volume", f"{models['trained']}:/models/tiny", "--json", check=False
    )
    assert result.stdout.startswith("{"), f"no JSON report:\n{result.stdout}\n{result.stderr}"
    report = json.loads(result.stdout)
    assert [(r["module"], r["status"], r["archs"]) for r in report["jit_cache"]] == [
        ("norm", "hit", ["sm_120f"])
    ]
    failed = [c["name"] for c in report["checks"] if not c["passed"] and not c["skipped"]]
    assert (result.returncode, failed) == (0, [])


def test_an_arch_change_is_never_served_the_parents_modules(
    ci_mini: dict[str, str],
    cli_process: Callable[..., Any],
    variant: Callable[[str, str], str],
    workspace: Path,
    api: Any,
) -> None:
    """A child of ci-mini for sm90 (ci-mini-sm90's arch): its compile step is its own (run now,
    or CACHED from an earlier build of exactly its inputs), and its module is sm_90a code."""
    stack = variant("jit-arch", "gpus: [sm90]")
    cli_process("build", stack)
    log = build_log(workspace, stack)
    outcome = compile_step_outcome(log)
    if outcome != "CACHED":
        assert "compiling norm for 9.0a" in log, outcome
    stacks = workspace / "stacks"
    resolved = resolve(stack, stacks)
    assert template_context(resolved).jit_cache_id != (
        template_context(resolve("ci-mini", stacks)).jit_cache_id
    )
    ref = local_ref(stack, render(resolved).content_hash())
    out = run_in(api, ref, f"python {TOOL} verify norm")
    row = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert (row["status"], row["archs"]) == ("hit", ["sm_90a"]), row
