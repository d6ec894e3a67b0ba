"""`diff A B`: two stacks side by side, from manifest to Dockerfile."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from packaging.version import Version

from builder.errors import StackError
from builder.lock.inputs import flatten, lock_path, stale_reason
from builder.lock.lockfile import Lock
from builder.lock.reading import read_lock
from builder.manifest.resolve import ResolvedStack
from builder.render.context import render
from builder.upstream.releases import Kind, classify
from builder.upstream.ruling import firing

_ABSENT = object()


@dataclass(frozen=True)
class Change:
    """A flattened key whose value differs; `only` names the side that has it at all."""

    key: str
    a: Any
    b: Any
    only: Literal["a", "b"] | None = None


@dataclass(frozen=True)
class PackageChange:
    package: str
    a: str | None
    b: str | None
    change: Literal["added", "removed", "moved"]
    #: The size of a move (None for added and removed).
    kind: Kind | None = None
    #: A move to an older version.
    down: bool = False


@dataclass
class LockDiff:
    a: str | None  # "locked", "stale: why" or None without a lock
    b: str | None
    packages: list[PackageChange] = field(default_factory=list)
    same: int = 0


@dataclass
class StackDiff:
    a: str
    b: str
    manifest: list[Change]
    derived: list[Change]
    jit_modules: dict[str, list[str]]
    locks: LockDiff
    rules: dict[str, list[str]]
    dockerfile: list[str]
    #: Why a side could not be rendered (a stale lock, a missing wheel).
    render_errors: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def same(self) -> bool:
        return not (
            self.manifest
            or self.derived
            or self.locks.packages
            or self.dockerfile
            or any(self.jit_modules.values())
            or self.rules["only_a"]
            or self.rules["only_b"]
        )


def diff_stacks(a: ResolvedStack, b: ResolvedStack) -> StackDiff:
    ja, jb = a.to_json(), b.to_json()
    da, db = ja.pop("derived"), jb.pop("derived")
    for data in (ja, jb):
        data.pop("name")
    mods_a, mods_b = da.pop("jit_modules"), db.pop("jit_modules")
    rules_a, rules_b = firing(a), firing(b)
    dockerfile, errors = _dockerfiles(a, b)
    return StackDiff(
        a=a.name,
        b=b.name,
        manifest=changes(ja, jb),
        derived=changes(da, db),
        jit_modules={
            "only_a": [m for m in mods_a if m not in mods_b],
            "only_b": [m for m in mods_b if m not in mods_a],
        },
        locks=diff_locks(a, b),
        rules={
            "a": rules_a,
            "b": rules_b,
            "only_a": [r for r in rules_a if r not in rules_b],
            "only_b": [r for r in rules_b if r not in rules_a],
        },
        dockerfile=dockerfile,
        render_errors=errors,
    )


def changes(a: dict[str, Any], b: dict[str, Any]) -> list[Change]:
    """Flattened key paths (maps only; a list is one value) whose values differ."""
    fa, fb = flatten(a), flatten(b)
    out = []
    for key in sorted(fa.keys() | fb.keys()):
        va, vb = fa.get(key, _ABSENT), fb.get(key, _ABSENT)
        if va == vb:
            continue
        only: Literal["a", "b"] | None = "a" if vb is _ABSENT else "b" if va is _ABSENT else None
        out.append(Change(key, None if va is _ABSENT else va, None if vb is _ABSENT else vb, only))
    return out


def diff_locks(a: ResolvedStack, b: ResolvedStack) -> LockDiff:
    la, sa = _lock(a)
    lb, sb = _lock(b)
    result = LockDiff(a=sa, b=sb)
    if la is None or lb is None:
        return result
    va, vb = la.python.versions(), lb.python.versions()
    for name in sorted(va.keys() | vb.keys()):
        old, new = va.get(name), vb.get(name)
        if old == new:
            result.same += 1
        elif old is None:
            result.packages.append(PackageChange(name, None, new, "added"))
        elif new is None:
            result.packages.append(PackageChange(name, old, None, "removed"))
        else:
            down = Version(new) < Version(old)
            result.packages.append(PackageChange(name, old, new, "moved", classify(old, new), down))
    return result


def _lock(stack: ResolvedStack) -> tuple[Lock | None, str | None]:
    path = lock_path(stack)
    if not path.is_file():
        return None, None
    lock = read_lock(path)
    reason = stale_reason(stack, lock)
    return lock, "locked" if reason is None else f"stale: {reason}"


def _dockerfiles(a: ResolvedStack, b: ResolvedStack) -> tuple[list[str], dict[str, str]]:
    texts: dict[str, str] = {}
    errors: dict[str, str] = {}
    for side, stack in (("a", a), ("b", b)):
        try:
            texts[side] = render(stack).dockerfile
        except StackError as exc:
            errors[side] = str(exc)
    if errors:
        return [], errors
    lines = difflib.unified_diff(
        texts["a"].splitlines(),
        texts["b"].splitlines(),
        fromfile=f"{a.name}/Dockerfile",
        tofile=f"{b.name}/Dockerfile",
        lineterm="",
    )
    return list(lines), errors
