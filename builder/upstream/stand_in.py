"""Whether a release the index has could stand in for one a pin asks for and the index lacks, as
far as names go: every `from PKG... import NAME` and `import PKG.X` in the release's Python,
looked up in the stand-in's modules (a module file, a subpackage, or a name bound at a module's
top level; a module with `__getattr__` takes any name).

Signatures and behaviour are not read: a clean result is necessary, not sufficient (vLLM 0.34.0
imports 287 FlashInfer names; all resolve in 0.7.4, two do not in 0.7.2.post1).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from builder.upstream.source_audit import WheelSource


@dataclass(frozen=True)
class Unresolved:
    module: str
    name: str  # empty: the module itself is missing
    where: str  # FILE:LINE in the importing wheel


def top_packages(wheel: WheelSource, distribution: str) -> set[str]:
    """The import names of a distribution: its wheel's top-level folders with an __init__.py
    that its name starts with (flashinfer-python: flashinfer; not the b12x stub FlashInfer's
    wheels also carry, which the standalone b12x package fills), else all of them."""
    found = {
        n.split("/")[0] for n in wheel.names if n.count("/") == 1 and n.endswith("/__init__.py")
    }
    stem = canonicalize_name(distribution).replace("-", "_")
    named = {p for p in found if stem == p or stem.startswith(p + "_")}
    return named or found


def imports_of(source: WheelSource, packages: set[str]) -> list[tuple[str, str, str]]:
    """(module, name or '', FILE:LINE) of every import of those packages in the wheel's Python."""

    def ours(module: str) -> bool:
        return module.split(".")[0] in packages

    out = []
    for file in source.python_files():
        try:
            tree = ast.parse(source.archive.read(file))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and ours(node.module or ""):
                out += [(node.module or "", a.name, f"{file}:{node.lineno}") for a in node.names]
            elif isinstance(node, ast.Import):
                out += [(a.name, "", f"{file}:{node.lineno}") for a in node.names if ours(a.name)]
    return out


def _bound(tree: ast.Module) -> set[str] | None:
    """Names bound at a module's top level (inside if/try too); None with a __getattr__."""
    names: set[str] = set()
    for node in tree.body:
        for inner in ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]:
            if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if inner.name == "__getattr__" and inner in tree.body:
                    return None
                names.add(inner.name)
            elif isinstance(inner, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in inner.names)
            elif isinstance(inner, ast.Assign | ast.AnnAssign):
                targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def unresolved(
    importer: WheelSource, stand_in: WheelSource, distribution: str
) -> tuple[int, list[Unresolved]]:
    """How many imports of the stand-in's packages the importer makes, and those it lacks."""
    modules = {
        n[:-3].replace("/", ".").removesuffix(".__init__"): n
        for n in stand_in.names
        if n.endswith(".py")
    }
    found = imports_of(importer, top_packages(stand_in, distribution))
    bound: dict[str, set[str] | None] = {}
    missing = []
    for module, name, where in found:
        if module not in modules:
            missing.append(Unresolved(module, "", where))
            continue
        if not name or f"{module}.{name}" in modules:
            continue
        if module not in bound:
            bound[module] = _bound(ast.parse(stand_in.archive.read(modules[module])))
        names = bound[module]
        if names is not None and name not in names:
            missing.append(Unresolved(module, name, where))
    return len(found), missing
