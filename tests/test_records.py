"""The per-hash record and the build argv: what `push` and `pin` trust, and what BuildKit gets."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import Result

from builder.engine.protocol import Image
from builder.errors import StackError
from builder.image.build import BuildOptions, build_argv, stack_dir_lock
from builder.image.buildclient import BuildClient
from builder.image.distribute import push_stack
from builder.image.records import Record, load_record, save_record
from builder.image.registry import Registry
from builder.manifest.resolve import resolve
from builder.render.context import render


def test_a_new_image_under_the_same_hash_is_untested_and_unpushed(tmp_path: Path) -> None:
    """A rebuild after a moved base tag (or --no-cache) keeps the content hash but makes
    another image; `push` and `pin` must not take the old image's test for it."""
    record = Record(stack="s", content_hash="a" * 64)
    record.attach_image("sha256:old")
    record.static, record.report = "passed", "report.json"
    record.pushed = {"r/sm120-stacks": "r/sm120-stacks@sha256:" + "1" * 64}
    save_record(tmp_path, record)
    again = load_record(tmp_path, "s", "a" * 64)
    again.attach_image("sha256:old")
    assert again.static == "passed" and again.pushed, "the same image keeps its history"
    again.attach_image("sha256:new")
    assert (again.image_id, again.static, again.report, again.pushed) == (
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


# --- the record file ---------------------------------------------------------------------------


def test_a_record_carries_its_schema_version(tmp_path: Path) -> None:
    import json

    from builder.image.records import RECORD_SCHEMA, record_path

    path = save_record(tmp_path, Record(stack="s", content_hash="a" * 64, static="passed"))
    assert path == record_path(tmp_path, "s", "a" * 64)
    written = json.loads(path.read_text())
    assert written["schema_version"] == RECORD_SCHEMA == 2
    assert "tests" not in written and "smoke" not in written, "one verdict shape: Verdicts"


def test_a_record_of_the_previous_version_is_read_as_version_1(tmp_path: Path) -> None:
    """Records written before the schema field have exactly schema 1's fields."""
    import json

    from builder.image.records import record_path

    path = record_path(tmp_path, "s", "a" * 64)
    path.parent.mkdir(parents=True)
    old = {
        "stack": "s",
        "content_hash": "a" * 64,
        "image_id": "sha256:" + "b" * 64,
        "tests": "passed",
        "report": "build/s/reports/s-aaaa.json",
        "smoke": "skipped: no NVIDIA GPU",
        "pushed": {"r/sm120-stacks": "r/sm120-stacks@sha256:" + "c" * 64},
    }
    path.write_text(json.dumps(old))
    record = load_record(tmp_path, "s", "a" * 64)
    assert record.static == "passed" and record.pushed == old["pushed"]
    assert record.unserved == "no NVIDIA GPU" and record.served == []
    assert record.schema_version == 2, "read as schema 2, written as schema 2"


def test_a_schema_1_record_whose_tests_failed_asks_for_a_test_again(tmp_path: Path) -> None:
    """Schema 1's `tests: failed` does not say whether the static checks or the smoke failed:
    push refuses it as failed, naming `test`, rather than guessing it through."""
    import json

    from builder.image.records import record_path, require_tested

    path = record_path(tmp_path, "s", "a" * 64)
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps({"schema_version": 1, "stack": "s", "content_hash": "a" * 64, "tests": "failed"})
    )
    record = load_record(tmp_path, "s", "a" * 64)
    with pytest.raises(StackError, match="static checks of s have failed"):
        require_tested(record, "s", "refusing", hint="run `sm120-stacks test s`")


@pytest.mark.parametrize(
    ("text", "key", "said"),
    [
        ("{not json", None, "not valid JSON"),
        ("[1, 2]", None, "Input should be"),
        ('{"stack": "s", "content_hash": "' + "a" * 64 + '", "tests": 1}', "tests", "Input"),
        (
            '{"schema_version": 2, "stack": "s", "content_hash": "' + "a" * 64 + '", '
            '"tests": "passed"}',
            "tests",
            "unknown",
        ),
        ('{"stack": "s", "content_hash": "' + "a" * 64 + '", "static": "ok"}', "static", "Input"),
        (
            '{"stack": "s", "content_hash": "' + "a" * 64 + '", "tested": "yes"}',
            "tested",
            "unknown",
        ),
        (
            '{"schema_version": 3, "stack": "s", "content_hash": "' + "a" * 64 + '"}',
            "schema_version",
            "schema_version 3",
        ),
        ('{"stack": "other", "content_hash": "' + "a" * 64 + '"}', "stack", "'other'"),
    ],
)
def test_a_malformed_record_is_an_error_naming_the_file(
    tmp_path: Path, text: str, key: str | None, said: str
) -> None:
    from builder.errors import StackError
    from builder.image.records import record_path

    path = record_path(tmp_path, "s", "a" * 64)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(StackError) as caught:
        load_record(tmp_path, "s", "a" * 64)
    assert caught.value.file == path and caught.value.key == key
    assert said in caught.value.message
    assert "delete it and run `sm120-stacks test s`" in str(caught.value.hint)


def test_commands_reading_a_malformed_record_exit_2_and_list_still_prints(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    from builder.image.records import record_path

    stack = "vllm-0.22-marlin"
    content_hash = render(resolve(stack, stacks_dir)).content_hash()
    path = record_path(tmp_path / "build", stack, content_hash)
    path.parent.mkdir(parents=True)
    path.write_text('{"stack": "vllm-0.22-marlin", "tests": "passed"')
    pinned = run_cli("pin", "gpu-node-07", stack, stacks_dir=stacks_dir)
    assert pinned.exit_code == 2 and "Traceback" not in pinned.output, pinned.output
    assert path.name in pinned.output
    listed = run_cli("list", stacks_dir=stacks_dir)
    assert listed.exit_code == 0, listed.output
    assert "record unreadable" in listed.output and "vllm-0.22-b12x" in listed.output


def test_atomic_writes_give_new_files_the_usual_mode_and_keep_an_existing_one(
    tmp_path: Path,
) -> None:
    from builder.files import write_atomic

    umask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.yaml"
        write_atomic(fresh, "a: 1\n")
        assert fresh.stat().st_mode & 0o777 == 0o644
        kept = tmp_path / "kept.yaml"
        kept.write_text("old\n")
        kept.chmod(0o640)
        write_atomic(kept, "new\n")
        assert (kept.read_text(), kept.stat().st_mode & 0o777) == ("new\n", 0o640)
    finally:
        os.umask(umask)


class _OneImageEngine:
    """An engine whose content tag names one image (another build folder's, in the test)."""

    def __init__(self, image_id: str, content_hash: str) -> None:
        labels = {"sm120-stacks.content-hash": content_hash}
        self.held = Image(image_id, {"Config": {"Labels": labels}})

    def image(self, ref: str) -> Image | None:
        return self.held


@dataclass
class _Rendered:
    stack: str
    hash: str

    def content_hash(self) -> str:
        return self.hash


def test_push_refuses_an_image_this_folder_did_not_test(tmp_path: Path) -> None:
    """Another build folder on the engine built the same content again: the content tag names
    its image, which this folder never tested; this folder's verdict is not taken for it."""
    record = Record(stack="s", content_hash="a" * 64)
    record.attach_image("sha256:tested-here")
    record.static = "passed"
    save_record(tmp_path, record)
    engine = _OneImageEngine("sha256:built-elsewhere", "a" * 64)
    with pytest.raises(StackError, match="have not been run; refusing to push an untested"):
        rendered: Any = _Rendered("s", "a" * 64)
        push_stack(rendered, tmp_path, cast(Any, engine), Registry.parse("r.example/x"))
