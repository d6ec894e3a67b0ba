"""Lock files: a stack's base images and complete Python dependency set, frozen with hashes.

The manifest pins what we chose (torch, vLLM, ...); a fresh resolution still floats everything
they pull in (environment.md: nvidia-cuda-nvcc floated to 13.5). `sm120-stacks lock STACK`
resolves the whole set once with uv for the stack's platform, Python and indexes and writes
stacks/STACK.lock; builds then install exactly that set with `pip --require-hashes --no-deps`.
The lock records the manifest inputs it was made from, so a lock that no longer matches its
manifest is refused by builds and reported by `check` instead of silently installing old pins.

This module is the lock file's schema and the digest of its Python set; the jobs around it
have their own modules: inputs.py (what a lock is made from, staleness, FROM), reading.py
(parsed once, the parse cache), bases.py (base digests from the registry), uv_compile.py
(making a lock), writing.py (the YAML), locked.py (the value a command hands down).
"""

from __future__ import annotations

import hashlib
import re
import weakref
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from builder.knowledge.strict import Strict
from builder.knowledge.text import Digest, ImageRef, PackageName, Url
from builder.manifest.resolve import canonical_json

LOCK_SCHEMA = 1

Hash = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]

Version = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.+!_-]+$")]

#: The note of a base the registry could not be asked about: recorded in the lock.
UNPINNED = "NOT PINNED: "


class LockedBase(Strict):
    image: ImageRef
    #: The digest the registry gave for image when locked; None when it could not be asked
    #: (the note says why: no engine, or a registry that could not be reached at all).
    digest: Digest | None = None
    note: str = ""

    @property
    def reference(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image

    @property
    def unpinned(self) -> bool:
        """A build FROM it takes whatever the tag points to that day."""
        return self.digest is None


class LockedBases(Strict):
    build: LockedBase
    runtime: LockedBase


class LockedPackage(Strict):
    version: Version
    hashes: list[Hash] = Field(min_length=1)


class VersionSource(Strict):
    """Another lock whose versions this one was resolved to prefer (`lock --versions-from`).

    A local variant of a flagship (another Python, say) then installs the flagship's locked
    set wherever its Python allows; the packages where it does not are listed, not hidden.
    """

    stack: str
    inputs_hash: Hash
    #: Packages at another version here, or on one side only: name -> "theirs -> ours".
    differs: dict[PackageName, str] = Field(default_factory=dict)


class LockedPython(Strict):
    version: str
    platform: str
    resolver: str
    index_url: Url
    extra_index_urls: list[Url] = Field(default_factory=list)
    #: The heavy packages (torch and all it needs): installed first, in a layer of their own.
    heavy: dict[PackageName, LockedPackage] = Field(default_factory=dict)
    #: Everything else the stack needs.
    packages: dict[PackageName, LockedPackage]
    versions_from: VersionSource | None = None

    def versions(self) -> dict[str, str]:
        return {name: pin.version for name, pin in {**self.heavy, **self.packages}.items()}


class Lock(Strict):
    schema_version: Literal[1]
    stack: str
    #: sha256 of the manifest inputs below; what builds and `check` compare.
    inputs_hash: Hash
    #: sha256 of what the lock pins (bases and the Python set): a lock cut short or edited by
    #: hand still validates package by package, so the whole is checked against this (kept
    #: near the top, where a cut leaves it). Locks made before it existed have none.
    locked_hash: Hash | None = None
    inputs: dict[str, Any]
    bases: LockedBases
    python: LockedPython

    def pinned_hash(self) -> str:
        pinned = self.model_dump(mode="json", include={"bases", "python"})
        return "sha256:" + hashlib.sha256(canonical_json(pinned).encode()).hexdigest()


#: Digests of parsed locks' Python sets, by lock object (frozen, so its digest cannot move;
#: a copy with changes is another object). The weak reference tells a reused id apart.
_python_digests: dict[int, tuple[weakref.ref[Lock], str]] = {}


def python_digest(lock: Lock) -> str:
    """sha256 of the locked Python set (where its versions came from left out: a note, not an
    input): what the JIT compile's objects are built against. Its canonical JSON is most of a
    lock's 400 kB, so a lock read from its file takes the digest from the parse cache, where it
    was worked out once for these very bytes."""
    known = _python_digests.get(id(lock))
    if known is not None and known[0]() is lock:
        return known[1]
    python = lock.python.model_dump(mode="json", exclude={"versions_from"})
    digest = "sha256:" + hashlib.sha256(canonical_json(python).encode()).hexdigest()
    remember_python_digest(lock, digest)
    return digest


def remember_python_digest(lock: Lock, digest: str) -> None:
    key = id(lock)
    _python_digests[key] = (weakref.ref(lock, lambda _: _python_digests.pop(key, None)), digest)


def normalize(name: str) -> str:
    """PEP 503 name: what uv prints and what comparisons use."""
    return re.sub(r"[-_.]+", "-", name).lower()
