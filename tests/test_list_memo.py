"""`list` with nothing changed prints what the last full listing printed, from file metadata
alone (builder.cli.list_memo); a manifest edited, a record written, another option or a damaged
memo takes the full path, which lists afresh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from click.testing import Result

from builder import REPO_ROOT
from builder.cli.list_memo import listing_folders, listing_memo

#: Prints the kept listing, or NONE, and which pipeline modules it imported.
FAST = """
import sys
from pathlib import Path
from builder.cli.list_memo import kept_listing
listing = kept_listing(Path(sys.argv[1]), Path(sys.argv[2]))
print("NONE" if listing is None else listing, end="")
heavy = [m for m in ("pydantic", "jinja2", "yaml", "builder.render.context") if m in sys.modules]
print(f"\\nimported: {heavy}")
"""


def _kept(build_dir: Path, stacks_dir: Path) -> tuple[str | None, str]:
    """The kept listing as a fresh `list` process sees it (stdout is a pipe, as in the test's
    full listing), and what it imported."""
    result = subprocess.run(
        [sys.executable, "-c", FAST, str(build_dir), str(stacks_dir)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    listing, _, imported = result.stdout.rpartition("\nimported: ")
    return (None if listing == "NONE" else listing), imported.strip()


def test_an_unchanged_listing_is_printed_again_without_the_pipeline(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    build_dir = tmp_path / "build"
    full = run_cli("list", stacks_dir=stacks_dir)
    assert full.exit_code == 0, full.output
    assert "vllm-0.22-marlin" in full.output
    kept, imported = _kept(build_dir, stacks_dir)
    assert kept == full.output
    assert imported == "[]"  # no pydantic, Jinja, YAML or renderer: metadata only


def test_an_edited_manifest_or_a_new_record_lists_afresh(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    build_dir = tmp_path / "build"
    run_cli("list", stacks_dir=stacks_dir)
    manifest = stacks_dir / "vllm-0.22-b12x.yaml"
    manifest.write_text(manifest.read_text() + "# edited\n")
    assert _kept(build_dir, stacks_dir)[0] is None
    relisted = run_cli("list", stacks_dir=stacks_dir).output
    assert _kept(build_dir, stacks_dir)[0] == relisted
    memo = json.loads(listing_memo(build_dir).read_text())
    record = Path(next(r for r in memo["records"] if "/vllm-0.22-b12x/" in r))
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("{}")  # `test` wrote the stack's record
    assert _kept(build_dir, stacks_dir)[0] is None


def test_a_damaged_memo_lists_afresh(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    build_dir = tmp_path / "build"
    run_cli("list", stacks_dir=stacks_dir)
    listing_memo(build_dir).write_text('{"schema": 1, "key": 3')
    assert _kept(build_dir, stacks_dir)[0] is None
    assert run_cli("list", stacks_dir=stacks_dir).exit_code == 0


def test_only_a_bare_list_takes_the_kept_answer() -> None:
    assert listing_folders(["list"]) == (Path("stacks"), Path("build"))
    assert listing_folders(["--stacks-dir", "s", "--build-dir=b", "list"]) == (
        Path("s"),
        Path("b"),
    )
    assert listing_folders(["--substitute-base", "a=b", "list"]) is None
    assert listing_folders(["list", "--help"]) is None
    assert listing_folders(["check"]) is None
    assert listing_folders(["--stacks-dir", "list"]) is None
