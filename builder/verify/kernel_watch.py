"""Watching a kernel cache across a smoke: a listing before its requests and one after, on a
directory of this machine (`smoke --url … --jit-cache-dir`) or inside the container under test
(before: a throwaway container of the image; after: the smoke's own, before it is removed),
then judged by kernel_cache.classify. A listing that fails is a note, never the smoke's end.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder.engine.protocol import Container, Engine
from builder.engine.throwaway import json_result, read_json
from builder.manifest.resolve import ResolvedStack
from builder.manifest.runtime_caches import (
    CacheLayout,
    cache_layouts,
    layouts_for,
)
from builder.verify.kernel_cache import KernelCacheResult, KernelCacheResults, classify
from builder.verify.kernel_listing import Listing, list_directory, listing_command

#: Seconds a listing's throwaway container may take (it reads one folder tree).
LISTING_TIMEOUT_S = 300


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
