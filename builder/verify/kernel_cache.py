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

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.manifest.runtime_caches import (
    CacheLayout,
)
from builder.verify.kernel_listing import (
    KernelFile,
    Listing,
    parse_kernel_name,
)

STATUSES = ("hit", "miss", "removed", "listed")


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
    metas = (old_meta if before is not None else None, new_meta)
    for path in sorted(old.keys() | new.keys()):
        result.kernels.append(_row(layout, old.get(path), new.get(path), metas, compiled, loaded))
    for path in sorted(old_meta.keys() | new_meta.keys()):
        result.modules.append(
            {"path": path, "meta_before": old_meta.get(path), "meta_after": new_meta.get(path)}
        )
    if layout.log_name is None:
        result.notes += _count_disagreement(result, layout, runtime_compiles)
    else:
        result.notes += _disagreements(result, layout, new, runtime_compiles, compiled)
    return result


def _row(
    layout: CacheLayout,
    old: KernelFile | None,
    new: KernelFile | None,
    metas: tuple[dict[str, Any] | None, dict[str, Any]],
    compiled: set[str],
    loaded: set[str],
) -> KernelRow:
    """One kernel's row: its status from the listings (metas: each listing's meta.json per
    module; before's None when the cache was not listed before) and the log's compile lines."""
    kernel = new or old
    assert kernel is not None, "a row is made for a kernel of one listing at least"
    old_meta, new_meta = metas
    name = f"{kernel.module_dir}/{kernel.kernel}"
    parsed = parse_kernel_name(layout, kernel.module_dir, kernel.kernel)
    status, detail = _status(old, new, old_meta is not None, name, compiled, loaded)
    detail = detail.replace("compiled", layout.verb)
    described = parsed.describe() if layout.families else layout.kernel_title
    meta_moved = (
        old_meta is not None
        and kernel.module_path in old_meta
        and old_meta[kernel.module_path] != new_meta.get(kernel.module_path)
    )
    if meta_moved and status != "hit":
        detail += " (its module was invalidated: meta.json changed)"
    return KernelRow(
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
