"""The kinds of runtime compile a server's log shows, and the patterns that find them
(knowledge/runtime_compiles.yaml): the schema of that file, its loader, and the vocabulary of
compile kinds the smoke and the cache volume's folders (knowledge/cache_volume.yaml) share."""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import Field

from builder.knowledge.cache_volume import CacheVolume
from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict

Event = Literal["compile", "autotune", "load", "trace", "total"]
#: Events that are work done at serve time (the rest are loads, per-start steps and summaries).
COMPILING: frozenset[str] = frozenset({"compile", "autotune"})


class _Pattern(Strict):
    event: Event
    regex: str


class CompileKind(Strict):
    title: str
    fails_smoke: bool
    visible_with: dict[str, str] = Field(default_factory=dict)
    #: Whether the smoke's own servers run with `visible_with` (False: its lines would flood
    #: the log, e.g. a DSL that logs every call).
    smoke_sets: bool = True
    notes: str = ""
    evidence: list[str] = Field(default_factory=list)
    patterns: list[_Pattern] = Field(min_length=1)


class NotLogged(Strict):
    """A kind a runtime cache holds that no log line names (the CUDA driver's JIT)."""

    title: str
    why: str


class _KindsFile(Strict):
    kinds: dict[str, CompileKind]
    not_logged: dict[str, NotLogged] = Field(default_factory=dict)


@cache
def _kinds_file() -> _KindsFile:
    return parse_document(read_knowledge("runtime_compiles.yaml"), _KindsFile)


def compile_kinds() -> dict[str, CompileKind]:
    return _kinds_file().kinds


def compile_vocabulary() -> dict[str, str]:
    """Every compile kind's name and title: the smoke's kinds and those no log shows. The
    cache volume's folders (knowledge/cache_volume.yaml) name their files with these, so the
    smoke and the warm proof say one thing by one name."""
    found = _kinds_file()
    return {name: k.title for name, k in found.kinds.items()} | {
        name: k.title for name, k in found.not_logged.items()
    }


def vocabulary_mismatches(volume: CacheVolume) -> list[str]:
    """Each kind of the cache volume's table that the vocabulary lacks, with where it is."""
    known = compile_vocabulary()
    found = []
    for folder in volume.folders:
        places = [(folder.path, folder.kind)]
        places += [(f"{folder.path}/{w.prefix}", w.kind) for w in folder.within]
        found += [f"{where}: kind {kind!r}" for where, kind in places if kind not in known]
    return found
