"""The runtime cache volume's layout (knowledge/cache_volume.yaml): where a pinned server's
caches live, and which kind of compile a file in each folder stands for.

It is one table so that the pin's environment, the warm-cache artifact's contents and the proof
at every start cannot disagree on where a cache is or what a new file there means.
"""

from __future__ import annotations

import fnmatch
from functools import cache
from typing import Annotated

from pydantic import Field, StringConstraints

from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict
from builder.knowledge.text import Identifier, Prose, SafeText, Slug

RelPath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.*-]+(/[A-Za-z0-9_.*-]+)*$")]
AbsPath = Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9_./-]+$")]
Kind = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")]
#: What a file of no listed folder is counted as (a cache the table does not know yet).
UNKNOWN_KIND = "other"


class Within(Strict):
    prefix: RelPath
    kind: Kind
    title: Prose
    source: Prose


class Folder(Strict):
    path: Slug
    env: Identifier
    kind: Kind
    title: Prose
    source: Prose
    within: list[Within] = Field(default_factory=list)


class CacheVolume(Strict):
    mount: AbsPath
    live: Slug
    folders: list[Folder] = Field(min_length=1)
    env: dict[Identifier, SafeText] = Field(default_factory=dict)
    never_capture: list[SafeText] = Field(default_factory=list)

    @property
    def live_path(self) -> str:
        """The live folder as the server sees it."""
        return f"{self.mount}/{self.live}"

    def environment(self) -> dict[str, str]:
        """The variables that point every cache writer into the volume's live folder."""
        found = {f.env: f"{self.live_path}/{f.path}" for f in self.folders}
        return found | dict(self.env)

    def kind_of(self, path: str) -> str:
        """The compile kind a file at path (relative to live/) stands for."""
        top, _, rest = path.partition("/")
        for folder in self.folders:
            if folder.path != top:
                continue
            for within in sorted(folder.within, key=lambda w: -len(w.prefix)):
                depth = within.prefix.count("/") + 1
                head = "/".join(rest.split("/")[:depth])
                if fnmatch.fnmatchcase(head, within.prefix):
                    return within.kind
            return folder.kind
        return UNKNOWN_KIND

    def skipped(self, path: str) -> bool:
        """Never captured or counted: a lock, a writer's temporary (any part of path)."""
        return any(
            fnmatch.fnmatchcase(part, pattern)
            for part in path.split("/")
            for pattern in self.never_capture
        )


@cache
def cache_volume() -> CacheVolume:
    doc = read_knowledge("cache_volume.yaml")
    return parse_document(doc, CacheVolume)
