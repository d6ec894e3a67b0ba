"""The per-hash record and the build argv: what `push` and `pin` trust, and what BuildKit gets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from click.testing import Result

from builder.image.build import BuildOptions, build_argv, stack_dir_lock
from builder.image.engine import BuildClient
from builder.image.records import Record, load_record, save_record
from builder.render.context import render
from builder.spec.resolve import resolve


def test_a_new_image_under_the_same_hash_is_untested_and_unpushed(tmp_path: Path) -> None:
    """A rebuild after a moved base tag (or --no-cache) keeps the content hash but makes
    another image; `push` and `pin` must not take the old image's test for it."""
    record = Record(stack="s", content_hash="a" * 64)
    record.attach_image("sha256:old")
    record.tests, record.report = "passed", "report.json"
    record.pushed = {"r/sm120-stacks": "r/sm120-stacks@sha256:1"}
    save_record(tmp_path, record)
    again = load_record(tmp_path, "s", "a" * 64)
    again.attach_image("sha256:old")
    assert again.tests == "passed" and again.pushed, "the same image keeps its history"
    again.attach_image("sha256:new")
    assert (again.image_id, again.tests, again.report, again.pushed) == (
        "sha256:new",
        None,
        None,
        {},
    )


def test_the_manifest_platform_reaches_buildkit(stacks_dir: Path, tmp_path: Path) -> None:
    (stacks_dir / "spark.yaml").write_text(
        "extends: vllm-0.22-marlin\nplatform: linux/arm64\ngpus: [sm121]\n"
    )
    stack = resolve("spark", stacks_dir)
    client = BuildClient("docker", ("docker", "buildx", "build"))
    argv = build_argv(stack, render(stack), tmp_path, client, BuildOptions(), tmp_path / "iid")
    assert argv[argv.index("--platform") + 1] == "linux/arm64"


def test_a_second_build_or_render_of_a_stack_waits_its_turn(
    tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    """While one build holds build/STACK/ (BuildKit reads its context for hours), another
    render or build of that stack is refused instead of swapping the files under it."""
    with stack_dir_lock(tmp_path / "build" / "vllm-0.22-marlin"):
        result = run_cli("render", "vllm-0.22-marlin")
        assert result.exit_code == 2, result.output
        assert "another build or render of vllm-0.22-marlin is running" in result.output
        assert run_cli("render", "vllm-0.22-b12x").exit_code == 0, "other stacks go ahead"
    assert run_cli("render", "vllm-0.22-marlin").exit_code == 0
