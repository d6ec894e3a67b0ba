"""`outdated`: the releases on a stack's own indexes that are newer than its pins."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from packaging.utils import canonicalize_name

from builder.errors import StackError
from builder.lock.inputs import lock_path
from builder.lock.reading import read_lock
from builder.manifest.resolve import ResolvedStack
from builder.upstream.index import IndexClient
from builder.upstream.releases import KINDS, Kind, classify, newer
from builder.upstream.ruling import StackRules, retired, stack_rules

Source = Literal["pin", "override", "lock"]
WORKERS = 8


@dataclass(frozen=True)
class Newer:
    version: str
    kind: Kind
    #: The stack's rules this version retires.
    retires: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    stack: str
    package: str
    source: Source
    pinned: str
    newer: tuple[Newer, ...] = ()
    #: Why the row has no answer: an index that failed (the whole message, naming the index).
    error: str | None = None
    #: Something worth knowing that is not a failure (the package is on none of the indexes).
    note: str | None = None

    def newest(self, kind: Kind) -> str | None:
        found = [n.version for n in self.newer if n.kind == kind]
        return found[-1] if found else None

    def retires(self) -> dict[str, str]:
        """rule id -> the first newer version that retires it."""
        out: dict[str, str] = {}
        for item in self.newer:
            for rule in item.retires:
                out.setdefault(rule, item.version)
        return out

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["newest"] = {kind: self.newest(kind) for kind in KINDS}
        data["retires"] = self.retires()
        return data


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    source: Source


@dataclass
class Outdated:
    stack: str
    rows: list[Row] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return list(dict.fromkeys(r.error for r in self.rows if r.error))


def pinned_packages(stack: ResolvedStack, include_lock: bool = False) -> list[Package]:
    """The manifest's pins and overrides; with include_lock every other package of its lock."""
    py = stack.manifest.python
    packages = [Package(n, p.version, "pin") for n, p in py.packages.items()]
    packages += [Package(n, p.version, "override") for n, p in py.overrides.items()]
    path = lock_path(stack)
    if include_lock and path.is_file():
        seen = {canonicalize_name(p.name) for p in packages}
        for name, version in sorted(read_lock(path).python.versions().items()):
            if canonicalize_name(name) not in seen:
                packages.append(Package(name, version, "lock"))
    return packages


def outdated(stack: ResolvedStack, client: IndexClient, include_lock: bool = False) -> Outdated:
    """One row per package; an index failure is that row's error, not the end of the others."""
    py = stack.manifest.python
    indexes = [py.index_url, *py.extra_index_urls]
    rules = stack_rules(stack)
    packages = pinned_packages(stack, include_lock)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        rows = list(pool.map(lambda p: _row(stack, client, indexes, rules, p), packages))
    return Outdated(stack=stack.name, rows=rows)


def _row(
    stack: ResolvedStack, client: IndexClient, indexes: list[str], rules: StackRules, pkg: Package
) -> Row:
    base = Row(stack=stack.name, package=pkg.name, source=pkg.source, pinned=pkg.version)
    try:
        projects = client.projects(indexes, pkg.name)
    except StackError as exc:
        return replace(base, error=str(exc))
    if not projects:
        return replace(base, note="on none of the stack's indexes")
    versions = {v for project in projects for v in project.available()}
    found = tuple(
        Newer(
            version=str(v),
            kind=classify(pkg.version, v),
            retires=tuple(retired(rules, pkg.name, str(v))) if rules.all else (),
        )
        for v in newer(pkg.version, versions)
    )
    return replace(base, newer=found)
