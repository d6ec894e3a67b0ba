"""`list` with nothing changed, answered from file metadata alone, as `build` with nothing to
do is (builder.image.uptodate, whose fingerprint this uses).

Listing every stack resolves, checks and renders each one: pydantic, Jinja and every manifest,
lock and knowledge file, about half a second of a command people run to look around. What it
prints depends only on the files uptodate.fingerprint covers (stacks, knowledge, templates,
patches, the tool's own code, the input environment), the local wheels the stacks copy, each
stack's test record, and how the output is shown (a terminal gets colours). After each full
listing the printed text is kept with the metadata of all of those; while none moved, `list`
prints it again without importing any of the pipeline. Any doubt (a file moved, an option,
an error of any kind) takes the full path, which lists afresh and keeps the new answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from builder.cli import console_width
from builder.files import fingerprint as file_fingerprint
from builder.files import memo_path as memo_file
from builder.files import write_atomic
from builder.image.uptodate import fingerprint

SCHEMA = 1
#: What changes how rich shows the table (colours, a terminal or a pipe); its width is
#: console_width's, also in the key.
DISPLAY_ENV = ("TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE")


def listing_memo(build_dir: Path) -> Path:
    return memo_file(build_dir, "list.json")


def _key(stacks_dir: Path, wheels: Sequence[str], records: Sequence[str]) -> str:
    """sha256 over the inputs' fingerprint, the records' metadata and the display."""
    digest = hashlib.sha256(fingerprint(stacks_dir, wheels).encode())
    for record in records:
        digest.update(f"{record}\0{file_fingerprint(record)}\0".encode())
    display = {name: os.environ.get(name, "") for name in DISPLAY_ENV}
    shown = [sys.stdout.isatty(), console_width(), display]
    digest.update(json.dumps(shown, sort_keys=True).encode())
    return digest.hexdigest()


def kept_listing(build_dir: Path, stacks_dir: Path) -> str | None:
    """What the last full `list` printed, when nothing it depends on moved since; else None."""
    try:
        memo = json.loads(listing_memo(build_dir).read_text())
        if memo.get("schema") != SCHEMA or memo.get("stacks_dir") != str(stacks_dir.resolve()):
            return None
        if _key(stacks_dir, memo["wheels"], memo["records"]) != memo["key"]:
            return None
        return str(memo["output"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no memo or a damaged one: the full path lists and keeps a new one


def keep_listing(
    build_dir: Path,
    stacks_dir: Path,
    taken: str,
    wheels: Sequence[str],
    records: Sequence[str],
    output: str,
) -> None:
    """Keep a full listing. `taken` is the fingerprint (without wheels) from before anything
    was read: if an input moved meanwhile, nothing is kept."""
    if fingerprint(stacks_dir, []) != taken:
        return
    memo = {
        "schema": SCHEMA,
        "stacks_dir": str(stacks_dir.resolve()),
        "wheels": sorted(set(wheels)),
        "records": sorted(set(records)),
        "key": _key(stacks_dir, sorted(set(wheels)), sorted(set(records))),
        "output": output,
    }
    with contextlib.suppress(OSError):  # a memo that cannot be written costs time only
        write_atomic(listing_memo(build_dir), json.dumps(memo, sort_keys=True) + "\n")


def listing_folders(args: Sequence[str]) -> tuple[Path, Path] | None:
    """(stacks dir, build dir) of a bare `[--stacks-dir D] [--build-dir D] list`; None for any
    other command line (it takes the full path)."""
    from builder.cli import DEFAULT_BUILD_DIR, DEFAULT_STACKS_DIR

    folders = {"--stacks-dir": DEFAULT_STACKS_DIR, "--build-dir": DEFAULT_BUILD_DIR}
    words = list(args)
    if not words or words[-1] != "list":
        return None
    words.pop()
    while words:
        option, _, value = words.pop(0).partition("=")
        if option not in folders:
            return None
        if not value:
            if not words:
                return None
            value = words.pop(0)
        folders[option] = Path(value)
    return folders["--stacks-dir"], folders["--build-dir"]
