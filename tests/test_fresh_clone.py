"""A fresh clone has fetched nothing into build/: what a manifest says is still valid there.

`check` and `list` read manifests only; the local wheel a test stack names is needed where its
bytes are read (rendering the context, making the lock), and its absence is an error there,
naming the file, key and line (it used to fail `check` with no stack named)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from click.testing import Result


def test_check_and_list_need_no_fetched_wheel(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    assert not (stacks_dir.parent / "build" / "wheels").exists()
    checked = run_cli("check", "ci-mini", stacks_dir=stacks_dir)
    assert checked.exit_code == 0, checked.output
    listed = run_cli("list", stacks_dir=stacks_dir)
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if " ci-mini " in f" {line} ")
    assert "invalid" not in row.lower(), row


def test_render_names_the_missing_wheel_by_file_key_and_line(
    stacks_dir: Path, run_cli: Callable[..., Result], tmp_path: Path
) -> None:
    result = run_cli("render", "ci-mini", stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    line = next(
        n
        for n, text in enumerate((stacks_dir / "ci-mini.yaml").read_text().splitlines(), 1)
        if "wheels:" in text
    )
    assert f"ci-mini.yaml:{line}" in result.output, result.output
    assert (
        "does not exist on this machine" in result.output and "make wheels-local" in result.output
    )
    assert "Traceback" not in result.output
    assert not (tmp_path / "build" / "ci-mini" / "context").exists()


def test_check_of_several_failing_stacks_names_each(
    stacks_dir: Path, run_cli: Callable[..., Result], write_stack: Callable[..., Path]
) -> None:
    write_stack("bad-one", "extends: ci-mini\ncuda: '13.0'\nnot_a_key: 1\n")
    write_stack("bad-two", "extends: ci-mini\nsmoke: {concurrency: -1}\n")
    result = run_cli("check", "bad-one", "bad-two", "ci-mini", stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert "2 stacks failed" in result.output
    assert "- bad-one: " in result.output and "- bad-two: " in result.output
    assert "ok  ci-mini" in result.output
