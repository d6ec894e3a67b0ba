"""docs/architecture.md stays true: its layers are .importlinter's, and its module list is the
folder list of builder/ (every module there, none that is not). A page that drifts from the
code misleads the newcomer it was written for, so a module added, moved or removed without
its line fails here."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from builder import REPO_ROOT

DOC = REPO_ROOT / "docs" / "architecture.md"
PACKAGE = REPO_ROOT / "builder"


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def contract_layers(importlinter: Path = REPO_ROOT / ".importlinter") -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(importlinter)
    layers = parser["importlinter:contract:pipeline"]["layers"]
    return [line.strip() for line in layers.splitlines() if line.strip()]


def documented_layers() -> list[str]:
    block = re.search(r"```text\n(.*?)```", _section("The layers"), re.S)
    assert block is not None, "docs/architecture.md: no ```text block under ## The layers"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def modules_on_disk(package: Path = PACKAGE) -> set[str]:
    """Every module of builder/ but the packages' own __init__.py (a package is its heading)."""
    found = set()
    for path in package.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        if path.name == "__init__.py" and (path.parent.parent == package or path.parent == package):
            continue
        found.add(path.relative_to(package.parent).as_posix())
    return found


def documented_modules() -> set[str]:
    return set(re.findall(r"^- `(builder/[\w/]+\.py)`", _section("Modules, one line each"), re.M))


def documented_folders() -> set[str]:
    return set(re.findall(r"^### (builder/\w+)/", _section("Modules, one line each"), re.M))


def test_the_layers_are_the_import_contracts() -> None:
    assert documented_layers() == contract_layers()


def test_every_module_of_builder_has_its_line_and_no_line_names_a_module_that_is_gone() -> None:
    on_disk, listed = modules_on_disk(), documented_modules()
    assert (
        not on_disk - listed
    ), f"modules without a line in docs/architecture.md: {on_disk - listed}"
    assert not listed - on_disk, f"lines for modules that do not exist: {listed - on_disk}"


def test_every_step_package_has_its_heading() -> None:
    packages = {p.parent.relative_to(REPO_ROOT).as_posix() for p in PACKAGE.glob("*/__init__.py")}
    assert documented_folders() == packages


def test_a_module_added_without_its_line_is_found(tmp_path: Path) -> None:
    """The comparison itself: a new file in a copy of the tree is named as missing."""
    package = tmp_path / "builder"
    (package / "lock").mkdir(parents=True)
    for name in ("__init__.py", "errors.py", "lock/__init__.py", "lock/new_job.py"):
        (package / name).write_text('"""x."""\n')
    assert modules_on_disk(package) == {"builder/errors.py", "builder/lock/new_job.py"}


def test_the_index_links_the_page() -> None:
    assert "(architecture.md)" in (REPO_ROOT / "docs" / "README.md").read_text()
