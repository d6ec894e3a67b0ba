"""What a whole runtime cache entry looks like (knowledge/cache_integrity.yaml): per cache
folder, the files that must not be empty, the formats that must be whole, the companion files
that must be there and the group files that name others.

Data, not code, so that a writer whose layout changes is a reviewed YAML change; the checks
themselves are builder/warm/integrity.py.
"""

from __future__ import annotations

import fnmatch
from functools import cache
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict
from builder.knowledge.text import Identifier, Prose, Slug

Glob = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.*?\[\]-]+$", max_length=128)]
FolderGlob = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9_.*?-]+(/[A-Za-z0-9_.*?-]+)*$", max_length=400)
]


class FileRule(Strict):
    name: Glob
    non_empty: bool = False
    format: Literal["elf", "json"] | None = None
    #: For json: the keys the top-level object must hold.
    keys: list[Identifier] = Field(default_factory=list)
    #: For json: the key whose value names the entry's other files.
    children: Identifier | None = None
    why: Prose


class Companion(Strict):
    when: Glob
    file: Glob
    why: Prose


class Entry(Strict):
    name: Slug
    title: Prose
    folder: FolderGlob
    files: list[FileRule] = Field(default_factory=list)
    requires: list[Companion] = Field(default_factory=list)
    remedy: Prose
    source: Prose

    def holds(self, folder: str) -> bool:
        """Whether folder (relative to live/) is one of this entry's folders: one glob per
        path segment, so `*` never crosses a `/`."""
        want, have = self.folder.split("/"), folder.split("/")
        return len(want) == len(have) and all(
            fnmatch.fnmatchcase(part, glob) for part, glob in zip(have, want, strict=True)
        )

    def rules_for(self, name: str) -> list[FileRule]:
        return [rule for rule in self.files if fnmatch.fnmatchcase(name, rule.name)]


class CacheIntegrity(Strict):
    entries: list[Entry] = Field(min_length=1)

    def entry_of(self, folder: str) -> Entry | None:
        """The first entry whose folder glob matches folder (relative to live/)."""
        return next((entry for entry in self.entries if entry.holds(folder)), None)


@cache
def cache_integrity() -> CacheIntegrity:
    doc = read_knowledge("cache_integrity.yaml")
    return parse_document(doc, CacheIntegrity)
