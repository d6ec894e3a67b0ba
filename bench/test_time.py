"""Where the test suite's time goes, by file, from pytest's JUnit XML (`make test` writes
build/test-junit.xml): seconds (setup + call + teardown, pytest's default junit duration), tests,
skipped and failed per file, slowest first, as a Markdown table. With two files, before and
after side by side (issue 41: bench/RESULTS.md "Test time", raw files in
bench/results/test-time/).

    .venv/bin/python bench/test_time.py build/test-junit.xml
    .venv/bin/python bench/test_time.py BEFORE.xml AFTER.xml

A file that is not JUnit XML is an error naming it (exit 2).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class FileTime:
    seconds: float = 0.0
    tests: int = 0
    skipped: int = 0
    failed: int = 0


def test_file(classname: str) -> str:
    """tests.engine.test_x (or tests.engine.test_x.TestClass) as tests/engine/test_x.py: the
    longest prefix of its dotted parts that names a .py file here, else the parts as a path."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (REPO_ROOT / candidate).is_file():
            return candidate
    return "/".join(parts) + ".py"


def by_file(path: Path) -> dict[str, FileTime]:
    """Every testcase of the JUnit XML at path, summed by its file."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as exc:
        raise SystemExit(f"error: {path}: not a JUnit XML file pytest wrote ({exc})") from None
    files: dict[str, FileTime] = {}
    for case in root.iter("testcase"):
        entry = files.setdefault(test_file(case.get("classname", "")), FileTime())
        entry.seconds += float(case.get("time") or 0)
        entry.tests += 1
        entry.skipped += case.find("skipped") is not None
        entry.failed += case.find("failure") is not None or case.find("error") is not None
    return files


def _total(files: dict[str, FileTime]) -> FileTime:
    total = FileTime()
    for entry in files.values():
        total.seconds += entry.seconds
        total.tests += entry.tests
        total.skipped += entry.skipped
        total.failed += entry.failed
    return total


def table(files: dict[str, FileTime]) -> str:
    lines = ["| file | seconds | tests | skipped | failed |", "|---|---:|---:|---:|---:|"]
    ranked = sorted(files.items(), key=lambda item: (-item[1].seconds, item[0]))
    for name, t in [*ranked, ("**all**", _total(files))]:
        lines.append(f"| {name} | {t.seconds:.1f} | {t.tests} | {t.skipped} | {t.failed} |")
    return "\n".join(lines)


def comparison(before: dict[str, FileTime], after: dict[str, FileTime]) -> str:
    """Both runs by file, slowest before first; a file absent from one run is a dash there."""
    lines = [
        "| file | before s | after s | saved s | tests before | tests after |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    names = sorted(
        before.keys() | after.keys(),
        key=lambda n: (-(before[n].seconds if n in before else 0.0), n),
    )
    rows = [(n, before.get(n), after.get(n)) for n in names]
    rows.append(("**all**", _total(before), _total(after)))
    for name, old, new in rows:
        saved = f"{old.seconds - new.seconds:.1f}" if old and new else "–"
        lines.append(
            f"| {name} | {f'{old.seconds:.1f}' if old else '–'} | "
            f"{f'{new.seconds:.1f}' if new else '–'} | {saved} | "
            f"{old.tests if old else '–'} | {new.tests if new else '–'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, nargs="+", help="one JUnit XML, or BEFORE AFTER")
    args = parser.parse_args(argv)
    if len(args.junit) > 2:
        parser.error("one JUnit XML file, or two (before, after)")
    try:
        runs = [by_file(path) for path in args.junit]
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    print(table(runs[0]) if len(runs) == 1 else comparison(runs[0], runs[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
