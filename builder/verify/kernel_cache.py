"""Kernels a server compiles on the GPU and persists on disk: hit or miss, per kernel, per smoke.

Some kernels cannot be precompiled into an image (FlashInfer's b12x CuTe-DSL MoE kernels need
the GPU to compile: a stack's `jit_cache.not_precompiled`), but their package keeps them in a
disk cache that a volume carries from one start to the next. The smoke lists that cache before
its requests and after them: a kernel on disk before and not rewritten is a `hit` (loaded from
the persisted cache), one that appears or changes during the smoke is a `miss` (compiled at
serve, now persisted), one gone after it is `removed` (its module was invalidated and this shape
not compiled again). A miss is no failure: it is what a first start on an empty volume does.

Where the cache lies and how its files are named is version knowledge
(knowledge/runtime_caches.yaml); a smoke watches every layout there that applies to the stack's
pinned versions (FlashInfer 0.7's CuTe-DSL kernels and its autotune results), each reported as
its own kind. The listing itself (cache_listing.py) runs on a directory of
this machine (`smoke --url … --jit-cache-dir PATH`) or inside the container being tested
(`test --require-gpu`: before, in a throwaway container of the image; after, in the smoke's own
container before it is removed). The server log's lines of the layout's kind (verify.compiles:
cute_dsl, flashinfer_autotune) are held against the listing; where they disagree the result
says so in a note.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.engine.protocol import Container, Engine
from builder.engine.throwaway import json_result, read_json
from builder.render.context import VENV
from builder.spec.resolve import ResolvedStack
from builder.spec.runtime_caches import (
    CacheLayout,
    cache_layouts,
    group_patterns,
    layouts_for,
    layouts_of,
)
from builder.verify import cache_listing

STATUSES = ("hit", "miss", "removed", "listed")
#: Seconds a listing's throwaway container may take (it reads one folder tree).
LISTING_TIMEOUT_S = 300


# --- names -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelName:
    """What a kernel's file name says: its op family, kind, shape key and key digest."""

    module: str | None
    arch: str | None
    kind: str | None
    shape: dict[str, int]
    digest: str | None

    def describe(self) -> str:
        if self.kind is None:
            return "(name not in the known grammar)"
        return " ".join([self.kind, *(f"{k}={v}" for k, v in self.shape.items())])

    def key(self) -> dict[str, Any]:
        """The shape key as the report's JSON carries it."""
        return {"kind": self.kind, **self.shape, "digest": self.digest}


def parse_module_dir(layout: CacheLayout, name: str) -> tuple[str, str] | None:
    """(op family, arch) of a module folder's name, e.g. b12x_moe_sm120a_cute_dsl."""
    match = re.match(layout.module_dir, name)
    return (match.group("module"), match.group("arch")) if match else None


def parse_kernel_name(layout: CacheLayout, module_dir: str, kernel: str) -> KernelName:
    """The shape key of kernel (a file name without .o) in module_dir, by the family's grammar."""
    parsed = parse_module_dir(layout, module_dir)
    module, arch = parsed if parsed else (None, None)
    family = layout.families.get(module or "")
    for kind, regex in (family.kinds if family else {}).items():
        match = re.match(regex, kernel)
        if match:
            groups = match.groupdict()
            digest = groups.pop("digest", None)
            shape = {k: int(v) for k, v in groups.items() if v is not None}
            return KernelName(module, arch, kind, shape, digest)
    return KernelName(module, arch, None, {}, None)


# --- listings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelFile:
    module_path: str
    module_dir: str
    kernel: str
    size: int
    mtime_ns: int
    #: The file's name, in the module folder or its kernel folder (kernel_dir).
    file: str = ""
    kernel_dir: str = ""

    @property
    def path(self) -> str:
        folder = f"{self.module_path}/{self.kernel_dir}" if self.kernel_dir else self.module_path
        return f"{folder}/{self.file or self.kernel + '.o'}"


@dataclass
class Listing:
    """One listing of a cache (cache_listing.py's output)."""

    root: str
    exists: bool
    modules: list[dict[str, Any]]
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Listing:
        return cls(data["root"], bool(data["exists"]), data["modules"], data.get("errors", []))

    def kernels(self, layout: CacheLayout) -> dict[str, KernelFile]:
        """Every kernel file by its path."""
        files = {}
        for module in self.modules:
            name = Path(module["path"]).name
            for item in module["kernels"]:
                match = re.match(layout.kernel_file, item["file"])
                if match is None:
                    continue
                kernel = KernelFile(
                    module["path"],
                    name,
                    match.group("kernel"),
                    int(item["size"]),
                    int(item["mtime_ns"]),
                    item["file"],
                    module.get("kernel_dir") or "",
                )
                files[kernel.path] = kernel
        return files

    def metas(self) -> dict[str, Any]:
        return {m["path"]: m.get("meta") for m in self.modules}


def list_directory(layout: CacheLayout, root: Path) -> Listing:
    """List a cache on this machine, from any folder on the way down to its module folders."""
    return Listing.from_json(cache_listing.list_cache(layout.listing_config(str(root))))


def listing_command(layout: CacheLayout, python: str = f"{VENV}/bin/python") -> list[str]:
    """argv that lists the cache of the server's own workspace, where the image's Python runs."""
    source = Path(cache_listing.__file__).read_text()
    return [python, "-c", source, json.dumps(layout.listing_config(), sort_keys=True)]


# --- the verdict -------------------------------------------------------------------------------


@dataclass
class KernelRow:
    #: The kernel as the server log names it: {module folder}/{kernel}.
    name: str
    module: str | None
    arch: str | None
    kind: str | None
    shape: dict[str, Any]
    bytes: int
    status: str
    detail: str
    path: str


@dataclass
class KernelCacheResult:
    cache: str
    title: str
    #: The runtime-compile kind this cache's kernels are (knowledge/runtime_compiles.yaml).
    log_kind: str
    #: What was listed: "container PATH" or "directory PATH".
    where: str
    listed: bool
    kernels: list[KernelRow] = field(default_factory=list)
    #: Per module folder: its meta file before and after the smoke.
    modules: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: False when judging the listings raised (the notes say why): no kernel rows.
    judged: bool = True
    #: What a miss did: compiled, tuned.
    verb: str = "compiled"

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for k in self.kernels if k.status == s) for s in STATUSES}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["counts"] = self.counts
        return data


def classify(
    cache_id: str,
    layout: CacheLayout,
    before: Listing | None,
    after: Listing | None,
    *,
    where: str,
    version: str | None = None,
    runtime_compiles: dict[str, Any] | None = None,
) -> KernelCacheResult:
    """Hit, miss or removed per kernel from the listings before and after the smoke, checked
    against the compile lines of the server log (runtime_compiles: verify.compiles' JSON; None
    when no log was read)."""
    result = KernelCacheResult(
        cache_id, layout.title, layout.log_kind, where, listed=after is not None, verb=layout.verb
    )
    if after is None:
        result.notes.append("the cache was not listed after the smoke: no hit or miss is known")
        return result
    for listing in (before, after):
        if listing is not None and listing.errors:
            result.notes.append("listing errors: " + "; ".join(listing.errors[:3]))
    if before is None:
        result.notes.append("the cache was not listed before the smoke: kernels are only listed")
    others: set[str] = set()
    old = _of_version(layout, before.kernels(layout) if before else {}, version, others)
    new = _of_version(layout, after.kernels(layout), version, others)
    if others:
        result.notes.append(
            f"left out: kernels of {layout.package} {', '.join(sorted(others))} "
            f"(the stack has {version})"
        )
    old_meta = before.metas() if before else {}
    new_meta = after.metas()
    compiled, loaded = _log_names(runtime_compiles, layout)
    for path in sorted(old.keys() | new.keys()):
        kernel = new.get(path) or old[path]
        name = f"{kernel.module_dir}/{kernel.kernel}"
        parsed = parse_kernel_name(layout, kernel.module_dir, kernel.kernel)
        status, detail = _status(
            old.get(path), new.get(path), before is not None, name, compiled, loaded
        )
        detail = detail.replace("compiled", layout.verb)
        described = parsed.describe() if layout.families else layout.kernel_title
        meta_moved = (
            before is not None
            and kernel.module_path in old_meta
            and old_meta[kernel.module_path] != new_meta.get(kernel.module_path)
        )
        if meta_moved and status != "hit":
            detail += " (its module was invalidated: meta.json changed)"
        result.kernels.append(
            KernelRow(
                name=name,
                module=parsed.module,
                arch=parsed.arch,
                kind=parsed.kind,
                shape=parsed.key(),
                bytes=kernel.size,
                status=status,
                detail=f"{described}; {detail}",
                path=kernel.path,
            )
        )
    for path in sorted(old_meta.keys() | new_meta.keys()):
        result.modules.append(
            {"path": path, "meta_before": old_meta.get(path), "meta_after": new_meta.get(path)}
        )
    if layout.log_name is None:
        result.notes += _count_disagreement(result, layout, runtime_compiles)
    else:
        result.notes += _disagreements(result, layout, new, runtime_compiles, compiled)
    return result


def _status(
    old: KernelFile | None,
    new: KernelFile | None,
    had_before: bool,
    name: str,
    compiled: set[str],
    loaded: set[str],
) -> tuple[str, str]:
    if new is None:
        return "removed", "gone after the smoke: its module was wiped, not compiled again"
    if not had_before:
        return "listed", "on disk after the smoke (no listing before it to compare)"
    if old is None:
        return "miss", "compiled during the smoke, now persisted"
    if (old.size, old.mtime_ns) != (new.size, new.mtime_ns):
        return "miss", "rewritten during the smoke (compiled again, persisted again)"
    if name in compiled:
        return "miss", (
            "on disk before the smoke, unchanged, yet the server log names its compile: compiled "
            "by this server before the first listing (or not persisted again)"
        )
    if name in loaded:
        return "hit", "persisted before the smoke, loaded from disk (the log says so)"
    return "hit", "persisted before the smoke, not rewritten (loaded from disk where served)"


def _of_version(
    layout: CacheLayout,
    kernels: dict[str, KernelFile],
    version: str | None,
    others: set[str],
) -> dict[str, KernelFile]:
    """The kernels under the stack's package version (the ops folder's path says it, where the
    listing saw that far up); a cache volume shared with other versions holds theirs too, and
    `others` collects those versions."""
    if version is None:
        return kernels
    kept = {}
    for path, kernel in kernels.items():
        match = re.search(layout.ops_dir.regex, str(Path(kernel.module_path).parent))
        found = match.groupdict().get("flashinfer_version") if match else None
        if found is None or found == version:
            kept[path] = kernel
        else:
            others.add(found)
    return kept


def _log_names(
    runtime_compiles: dict[str, Any] | None, layout: CacheLayout
) -> tuple[set[str], set[str]]:
    """Kernel names (module folder/kernel) the log's compile and load lines of the layout's
    kind give; none where its lines name no file (log_name unset)."""
    compiled: set[str] = set()
    loaded: set[str] = set()
    for event in (runtime_compiles or {}).get("events", []) if layout.log_name else []:
        name = event.get("name") or ""
        if event.get("kind") != layout.log_kind or "/" not in name:
            continue
        if event.get("event") == "compile":
            compiled.add(name)
        elif event.get("event") == "load":
            loaded.add(name)
    return compiled, loaded


def _count_disagreement(
    result: KernelCacheResult, layout: CacheLayout, runtime_compiles: dict[str, Any] | None
) -> list[str]:
    """For a cache whose log lines name no file: the log's work of its kind against what was
    written (the autotuner names ops, its entries are digests)."""
    if runtime_compiles is None:
        return ["no server log read: hits and misses are the listing's alone"]
    worked = sum(
        1
        for e in runtime_compiles.get("events", [])
        if e.get("kind") == layout.log_kind and e.get("event") in ("compile", "autotune")
    )
    written = sum(1 for k in result.kernels if k.status in ("miss", "listed"))
    if worked and not written:
        return [
            f"the server log shows {worked} {layout.log_kind} line(s) of work but nothing was "
            "written to this cache: it is kept elsewhere (another layout, or a variable "
            "pointing away from the listed root)"
        ]
    return []


def _disagreements(
    result: KernelCacheResult,
    layout: CacheLayout,
    after: dict[str, KernelFile],
    runtime_compiles: dict[str, Any] | None,
    compiled: set[str],
) -> list[str]:
    """Where the server log's CuTe-DSL compile lines and the listing tell different stories."""
    if runtime_compiles is None:
        return ["no server log read: hits and misses are the listing's alone"]
    notes = []
    on_disk = {f"{k.module_dir}/{k.kernel}" for k in after.values()}
    missing = sorted(compiled - on_disk)
    if missing:
        notes.append(
            f"the server log names {len(missing)} CuTe-DSL kernel compile(s) not on disk after "
            f"the smoke ({_few(missing)}): the disk cache is off "
            "(FLASHINFER_CUTE_DSL_DISABLE_CACHE=1), persisting failed, or this is not the "
            "server's cache"
        )
    misses = [k for k in result.kernels if k.status == "miss"]
    unnamed = sorted(k.name for k in misses if k.name not in compiled)
    if unnamed:
        notes.append(
            f"{len(unnamed)} kernel(s) written during the smoke that no compile line of the "
            f"server log names ({_few(unnamed)}): the log is not this server's, or FlashInfer's "
            "INFO lines are off (FLASHINFER_LOGGING_LEVEL)"
        )
    dsl_only = sum(
        1
        for e in runtime_compiles.get("events", [])
        if e.get("kind") == layout.log_kind
        and e.get("event") == "compile"
        and "/" not in (e.get("name") or "")
    )
    if dsl_only and not misses and not compiled:
        notes.append(
            f"the server log has {dsl_only} CuTe-DSL compile line(s) but no kernel was written "
            "to the disk cache: kernels kept in memory only (b12x W4A16, direct micro) or the "
            "disk cache is off"
        )
    return notes


def _few(names: list[str], count: int = 3) -> str:
    return ", ".join(names[:count]) + (" ..." if len(names) > count else "")


def summary_lines(
    cache: dict[str, Any] | None, indent: str = "  ", kernels: bool = True
) -> list[str]:
    """A result's JSON for people: counts, one line per kernel (unless a table shows them),
    the notes (the smoke's table and `test`'s); of each cache, where the JSON holds several."""
    if cache is None:
        return []
    if "caches" in cache:
        return [line for one in cache["caches"] for line in summary_lines(one, indent, kernels)]
    counts = cache.get("counts", {})
    head = f"{indent}{cache['title']} ({cache['where']}): "
    if not cache.get("judged", True):
        lines = [head + "not judged"]
    elif not cache.get("listed"):
        lines = [head + "not listed"]
    elif not cache.get("kernels"):
        lines = [head + "no kernel on disk before or after the smoke"]
    else:
        summary = ", ".join(f"{counts.get(s, 0)} {s}" for s in ("hit", "miss", "removed"))
        if counts.get("listed"):
            summary += f", {counts['listed']} listed"
        verb = cache.get("verb", "compiled")
        lines = [head + summary + f" (a miss: {verb} at serve, now persisted; no failure)"]
        for row in cache["kernels"] if kernels else []:
            size = f"{row['bytes'] / 1e6:.1f} MB"
            lines.append(f"{indent}  {row['status']:<8} {row['name']}  {size}  {row['detail']}")
    lines += [f"{indent}  note: {note}" for note in cache.get("notes", [])]
    return lines


# --- watches: a listing before the smoke, one after ----------------------------------------------


class KernelCacheWatch:
    """Lists one cache before the smoke and after it; `result` judges the two."""

    def __init__(self, cache_id: str, layout: CacheLayout, version: str | None, where: str):
        self.cache_id = cache_id
        self.layout = layout
        self.version = version
        self.where = where
        self.before_listing: Listing | None = None
        self.after_listing: Listing | None = None
        self.failures: list[str] = []

    def before(self) -> None:
        self.before_listing = self._safely("before", lambda: self._list(None))

    def after(self, container: Container | None = None) -> None:
        self.after_listing = self._safely("after", lambda: self._list(container))

    def result(self, runtime_compiles: dict[str, Any] | None) -> KernelCacheResult:
        result = classify(
            self.cache_id,
            self.layout,
            self.before_listing,
            self.after_listing,
            where=self._where(),
            version=self.version,
            runtime_compiles=runtime_compiles,
        )
        result.notes[:0] = self.failures
        return result

    def failed_result(self, exc: BaseException) -> KernelCacheResult:
        """The result when judging the listings raised: no kernel rows, the failure a note (the
        smoke's report is written all the same)."""
        try:
            where = self._where()
        except Exception:
            where = self.where
        note = f"judging the listings failed: {type(exc).__name__}: {exc}"[:500]
        return KernelCacheResult(
            self.cache_id,
            self.layout.title,
            self.layout.log_kind,
            where,
            listed=self.after_listing is not None,
            notes=[*self.failures, note],
            judged=False,
            verb=self.layout.verb,
        )

    def _list(self, container: Container | None) -> Listing:
        raise NotImplementedError

    def _where(self) -> str:
        return self.where

    def _safely(self, when: str, list_it: Callable[[], Listing]) -> Listing | None:
        """A listing that fails is a note in the result, never a lost smoke report."""
        try:
            return list_it()
        except Exception as exc:
            self.failures.append(f"listing {when} the smoke failed: {exc}"[:500])
            return None


class DirectoryWatch(KernelCacheWatch):
    """A cache directory on this machine: the volume of a server started elsewhere."""

    def __init__(self, cache_id: str, layout: CacheLayout, version: str | None, root: Path):
        super().__init__(cache_id, layout, version, f"directory {root}")
        self.root = root

    def _list(self, container: Container | None) -> Listing:
        return list_directory(self.layout, self.root)


class ContainerWatch(KernelCacheWatch):
    """The server's own workspace inside the container being tested: before the smoke in a
    throwaway container of the image (what the smoke's container starts with), after it in the
    smoke's container, before that is removed."""

    def __init__(
        self,
        cache_id: str,
        layout: CacheLayout,
        version: str | None,
        engine: Engine,
        image_ref: str,
    ):
        where = f"container {layout.workspace.env}/{layout.workspace.below}"
        super().__init__(cache_id, layout, version, where)
        self.engine = engine
        self.image_ref = image_ref

    def _where(self) -> str:
        listing = self.after_listing or self.before_listing
        return f"container {listing.root}" if listing else self.where

    def _list(self, container: Container | None) -> Listing:
        argv = listing_command(self.layout)
        if container is None:
            found = read_json(self.engine, self.image_ref, argv, timeout_s=LISTING_TIMEOUT_S)
            return Listing.from_json(found)
        container.reload()
        if not container.attrs.get("State", {}).get("Running"):
            raise RuntimeError("the smoke's container had stopped")
        status, output = container.exec(argv)
        if status != 0:
            raise RuntimeError(f"exit status {status}: {output.strip()[-300:]}")
        return Listing.from_json(json_result(output))


@dataclass
class KernelCacheResults:
    """The smoke's watch of every cache that applies: one result per layout."""

    results: list[KernelCacheResult]

    def cache(self, cache_id: str) -> KernelCacheResult:
        return next(r for r in self.results if r.cache == cache_id)

    def to_json(self) -> dict[str, Any]:
        caches = [r.to_json() for r in self.results]
        counts = {s: sum(c["counts"][s] for c in caches) for s in STATUSES}
        return {"caches": caches, "counts": counts}


class CacheWatches:
    """Every layout's watch for one smoke, listed and judged one by one: a layout whose judgement
    raises is a note in its own result, the others' results stand."""

    def __init__(self, watches: list[KernelCacheWatch]):
        self.watches = watches

    def before(self) -> None:
        for watch in self.watches:
            watch.before()

    def after(self, container: Container | None = None) -> None:
        for watch in self.watches:
            watch.after(container)

    def result(self, runtime_compiles: dict[str, Any] | None) -> KernelCacheResults:
        results = []
        for watch in self.watches:
            try:
                results.append(watch.result(runtime_compiles))
            except Exception as exc:
                results.append(watch.failed_result(exc))
        return KernelCacheResults(results)

    def failed_result(self, exc: BaseException) -> KernelCacheResults:
        return KernelCacheResults([watch.failed_result(exc) for watch in self.watches])

    def watch(self, cache_id: str) -> KernelCacheWatch:
        return next(w for w in self.watches if w.cache_id == cache_id)


def _applying(stack: ResolvedStack) -> list[tuple[str, CacheLayout, str]]:
    """Every layout whose package version the stack pins and whose versions hold it."""
    return [
        (cache_id, layout, version)
        for cache_id, layout, version in layouts_for(stack)
        if version is not None and layout.applies_to(version)
    ]


def container_watch(engine: Engine, image_ref: str, stack: ResolvedStack) -> CacheWatches | None:
    """The watch for `test`'s GPU smoke: every layout the stack's package versions have; None
    when none (a stack whose FlashInfer keeps no such cache, or one nobody read)."""
    watches: list[KernelCacheWatch] = [
        ContainerWatch(cache_id, layout, version, engine, image_ref)
        for cache_id, layout, version in _applying(stack)
    ]
    return CacheWatches(watches) if watches else None


def directory_watch(stack: ResolvedStack, root: Path) -> CacheWatches:
    """The watch for `smoke --url --jit-cache-dir PATH`: every layout that applies, each
    listed under PATH. A stack whose package version has no known layout is still listed with
    the nearest one, and says so."""
    applying = _applying(stack)
    if applying:
        return CacheWatches([DirectoryWatch(c, lay, v, root) for c, lay, v in applying])
    layouts = layouts_for(stack) or [(n, lay, None) for n, lay in cache_layouts().items()]
    cache_id, layout, version = layouts[0]
    watch = DirectoryWatch(cache_id, layout, None, root)
    watch.failures.append(
        f"{stack.name} has {layout.package} {version or '(not pinned)'}; the layout was read for "
        f"{layout.versions} (knowledge/runtime_caches.yaml): the listing may miss its kernels"
    )
    return CacheWatches([watch])


__all__ = [
    "CacheLayout",
    "CacheWatches",
    "ContainerWatch",
    "DirectoryWatch",
    "KernelCacheResult",
    "KernelCacheResults",
    "KernelCacheWatch",
    "KernelName",
    "KernelRow",
    "Listing",
    "cache_layouts",
    "classify",
    "container_watch",
    "directory_watch",
    "group_patterns",
    "layouts_of",
    "list_directory",
    "listing_command",
    "parse_kernel_name",
    "parse_module_dir",
    "summary_lines",
]
