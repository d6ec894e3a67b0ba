"""The house as floors of packages, read from builder/'s own imports (issue 42's measure).

Usage: python bench/house_floors.py  -> one line per floor, top first: the packages on it
with their lines of code; then the imports that run against .importlinter's declared layers
(a lower step importing a higher one) and the circles between packages. A package sits one
floor above the highest package it imports; floor 1 imports no other. Nothing is run: the
imports are grimp's graph of builder/, as lint-imports reads them (TYPE_CHECKING imports
included).
"""

from __future__ import annotations

import configparser
import sys
from functools import cache
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
BUILDER = ROOT / "builder"


def package_of(module: str) -> str | None:
    """builder.lock.reading -> "lock"; builder.files -> "files.py"; outside builder: None."""
    parts = module.split(".")
    if parts[0] != "builder" or len(parts) < 2:
        return None
    return parts[1] if (BUILDER / parts[1]).is_dir() else f"{parts[1]}.py"


def house() -> tuple[dict[str, set[str]], dict[str, int]]:
    """package -> the packages it imports; package -> its lines. The imports are grimp's graph,
    the one lint-imports checks the layers on."""
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("builder", include_external_packages=False)
    arrows: dict[str, set[str]] = {}
    lines: dict[str, int] = {}
    for path in sorted(BUILDER.rglob("*.py")):
        if path.parent == BUILDER and path.name in ("__init__.py", "__main__.py"):
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        here = package_of(module)
        assert here is not None
        lines[here] = lines.get(here, 0) + len(path.read_text().splitlines())
        targets = {package_of(m) for m in graph.find_modules_directly_imported_by(module)}
        arrows.setdefault(here, set()).update(t for t in targets if t and t != here)
    return arrows, lines


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(arrows.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(arrows):
        if node not in index:
            visit(node)
    return found


def declared_layers() -> dict[str, int]:
    """package -> its step in .importlinter's pipeline contract (0 the top)."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    layers = config["importlinter:contract:pipeline"]["layers"].split("\n")
    step: dict[str, int] = {}
    for number, line in enumerate(filter(None, (x.strip() for x in layers))):
        for module in line.split("|"):
            package = package_of(module.strip())
            if package:
                step[package] = number
    return step


def main() -> int:
    arrows, lines = house()
    looped = circles(arrows)

    @cache
    def floor(package: str) -> int:
        below = [floor(t) for t in arrows.get(package, ()) if not any(package in c for c in looped)]
        return 1 + max(below, default=0)

    by_floor: dict[int, list[str]] = {}
    for package in sorted(arrows):
        by_floor.setdefault(floor(package), []).append(package)
    for number in sorted(by_floor, reverse=True):
        rooms = " · ".join(f"{p} {lines[p]}" for p in sorted(by_floor[number]))
        print(f"floor {number:2}  {rooms}")
    step = declared_layers()
    against = [
        f"{source} -> {target}"
        for source in sorted(arrows)
        for target in sorted(arrows[source])
        if source in step and target in step and step[target] < step[source]
    ]
    undeclared = sorted(p for p in arrows if p not in step)
    print(f"packages: {len(arrows)}; floors: {len(by_floor)}; lines: {sum(lines.values())}")
    print(f"imports against the declared layers: {len(against)}", *against, sep="\n  ")
    print(f"circles between packages: {len(looped)}", *(" -> ".join(c) for c in looped), sep="\n  ")
    print(f"packages the layers do not name: {len(undeclared)}", *undeclared, sep="\n  ")
    return 1 if against or looped else 0


if __name__ == "__main__":
    sys.exit(main())
