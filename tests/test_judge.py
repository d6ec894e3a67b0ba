"""One judgement for every command (builder/judge): `check`, `render` and `list` read the same
first error for the same stack, in one order: rules on the manifest, the lock's freshness,
rules on the lock's pins, a floating base."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from builder import REPO_ROOT
from builder.manifest.resolve import stack_names
from tests.conftest import STACKS


def _first_error(result: Result) -> str:
    """The error line a command ends with (the first line of its message)."""
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert lines, result.output
    return lines[0]


def _stale_and_firing(stacks_dir: Path) -> str:
    """vllm-0.22-marlin with a new vLLM (its lock is stale) and a MoE backend a rule refuses
    on the manifest alone: the case where `check` and `render` used to disagree."""
    path = stacks_dir / "vllm-0.22-marlin.yaml"
    text = path.read_text().replace("vllm: 0.22.1", "vllm: 0.22.2")
    path.write_text(text.replace("moe_backend: marlin", "moe_backend: flashinfer_trtllm"))
    return "vllm-0.22-marlin"


def test_check_and_render_give_the_same_first_error_for_a_stale_stack_a_rule_refuses(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    name = _stale_and_firing(stacks_dir)
    check = run_cli("check", name, stacks_dir=stacks_dir)
    render = run_cli("render", "--stdout", name, stacks_dir=stacks_dir)
    assert check.exit_code == render.exit_code == 2
    assert _first_error(check) == _first_error(render)
    assert "known-bad combination" in _first_error(check)  # the rule before the lock
    listed = run_cli("list", stacks_dir=stacks_dir)
    row = next(line for line in listed.output.splitlines() if f" {name} " in line)
    assert "rule:" in row  # the rule first, as check says (the id wraps in the cell)


def test_a_stale_lock_alone_is_the_first_error_of_both(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    path = stacks_dir / "vllm-0.22-marlin.yaml"
    path.write_text(path.read_text().replace("vllm: 0.22.1", "vllm: 0.22.2"))
    check = run_cli("check", "vllm-0.22-marlin", stacks_dir=stacks_dir)
    render = run_cli("render", "--stdout", "vllm-0.22-marlin", stacks_dir=stacks_dir)
    assert _first_error(check) == _first_error(render)
    assert "lock no longer matches" in _first_error(check)


def test_check_before_the_first_lock_names_the_missing_lock(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    (stacks_dir / "vllm-0.22-marlin.lock").unlink()
    check = run_cli("check", "vllm-0.22-marlin", stacks_dir=stacks_dir)
    assert check.exit_code == 2
    assert "has no lock yet" in check.output, check.output
    assert "sm120-stacks lock vllm-0.22-marlin" in check.output


@pytest.mark.parametrize("name", stack_names(STACKS))
def test_check_and_render_agree_on_every_stack(name: str, run_cli: Callable[..., Result]) -> None:
    check = run_cli("check", "--allow-floating-base", name)
    render = run_cli("render", "--stdout", name)
    assert check.exit_code == render.exit_code, (check.output, render.output)
    if check.exit_code:
        assert _first_error(check) == _first_error(render)


def test_only_the_judge_runs_the_rules_with_a_lock() -> None:
    """check_stack with versions (the rules on the lock's pins) is called in builder/judge/
    only: a command that judged a stack its own way could disagree with `check` again."""
    callers = set()
    for path in (REPO_ROOT / "builder").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "check_stack"
                and len(node.args) + len(node.keywords) > 1
            ):
                callers.add(path.relative_to(REPO_ROOT).as_posix())
    assert callers == {"builder/judge/judgement.py"}
