"""Reading a lock file: validated, parsed once per process while the file is unchanged, and
kept parsed on disk by its bytes' sha256 (the parse cache), so `list` and `check` do not pay
for YAML parsing every time; the stack's lock as a build takes it (current_lock) or as the
rules read it (locked_versions).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from pathlib import Path

from builder.errors import (
    StackError,
)
from builder.files import fingerprint, write_atomic
from builder.knowledge.loader import parse_document
from builder.knowledge.strict import Strict
from builder.knowledge.yamlsafe import MAX_BYTES, load_yaml
from builder.lock.inputs import inputs_hash, lock_inputs, lock_path, stale_reason
from builder.lock.lockfile import LOCK_SCHEMA, Hash, Lock, python_digest, remember_python_digest
from builder.manifest.resolve import ResolvedStack

#: What a parse cache file holds (_ParseCacheEntry); 1 was the bare lock.
PARSE_CACHE_FORMAT = 2


def read_lock(path: Path) -> Lock:
    """A lock file, validated; any problem is a StackError with the file, key and line.

    A lock is a few hundred kB of hashes, and one command asks for it several times (its
    freshness, its versions for the rules, its requirements for the context): it is parsed once
    per process for as long as the file is unchanged (size, mtime, inode), and the parsed lock
    is frozen, so sharing it is safe."""
    if path.stat().st_size > MAX_BYTES:
        raise StackError(f"lock file is larger than {MAX_BYTES} bytes", file=path)
    return _parsed_lock(path.resolve(), fingerprint(path))


@functools.lru_cache(maxsize=64)
def _parsed_lock(path: Path, seen: str) -> Lock:
    """Parsed from the YAML, or from the parse cache when these very bytes were parsed before:
    YAML parsing is most of what `list` and `check` cost (30 ms a lock), the validated JSON of
    the same lock loads in 2."""
    raw = path.read_bytes()
    cached = _parse_cache_file(raw)
    if cached is not None:
        try:
            entry = _ParseCacheEntry.model_validate_json(cached.read_bytes())
        except (OSError, ValueError):
            pass  # unreadable or from another version of the model: parse the YAML again
        else:
            remember_python_digest(entry.lock, entry.python_digest)
            return entry.lock
    lock = parse_document(load_yaml(path), Lock)
    if lock.locked_hash is not None and lock.locked_hash != lock.pinned_hash():
        raise StackError(
            "what the lock pins does not match its locked_hash: the file was cut short or "
            "edited by hand",
            file=path,
            key="locked_hash",
            hint=f"run `sm120-stacks lock {lock.stack}` again (or restore the file from git)",
        )
    if cached is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written costs time only
            entry = _ParseCacheEntry(lock=lock, python_digest=python_digest(lock))
            write_atomic(cached, entry.model_dump_json())
    return lock


class _ParseCacheEntry(Strict):
    """A parse cache file: the validated lock and what is slow to derive from it."""

    python_digest: Hash
    lock: Lock


def _parse_cache_file(raw: bytes) -> Path | None:
    """Where the parsed form of a lock with these bytes is kept: named by their sha256 and
    the lock schema, so it cannot go stale; $SM120_STACKS_CACHE_DIR, else the user's cache
    folder ($XDG_CACHE_HOME or ~/.cache); None where neither can be found."""
    explicit, user = os.environ.get("SM120_STACKS_CACHE_DIR"), os.environ.get("XDG_CACHE_HOME")
    if explicit:
        base = Path(explicit)
    elif user:
        base = Path(user) / "sm120-stacks"
    else:
        try:
            base = Path.home() / ".cache" / "sm120-stacks"
        except RuntimeError:  # no home directory
            return None
    digest = hashlib.sha256(raw).hexdigest()
    return base / "parsed-locks" / f"v{LOCK_SCHEMA}-c{PARSE_CACHE_FORMAT}-{digest}.json"


def inherited_lock(stack: ResolvedStack) -> tuple[Path, Lock] | None:
    """The lock of the nearest ancestor whose lock inputs (platform, bases, python section,
    local wheels) are this stack's too: a child that changes only serve settings, env or JIT
    modules installs exactly what its parent's lock pins, bases by digest included, so it checks
    and builds on that lock without one of its own. None where the stack has its own lock file,
    or no ancestor's lock matches."""
    if lock_path(stack).is_file():
        return None
    wanted: str | None = None  # read only where an ancestor has a lock: a fresh clone's check
    for source in stack.sources[1:]:  # of a lock-less stack reads no local wheel
        path = source.with_name(f"{source.stem}.lock")
        if not path.is_file():
            continue
        wanted = wanted or inputs_hash(lock_inputs(stack))
        lock = read_lock(path)
        if inputs_hash(lock.inputs) == lock.inputs_hash == wanted:
            return path, lock
    return None


def shares_packages_layer(ancestor: Lock, lock: Lock) -> bool:
    """Whether ancestor's package set can be the first layer of lock's packages stage: the same
    Python, platform, indexes, heavy part and bases, so its install runs over the very layers
    the ancestor's image has (BuildKit then finds the step cached) and installs on this stack's
    interpreter."""
    mine, theirs = lock.python, ancestor.python
    return (
        (theirs.version, theirs.platform, theirs.index_url, theirs.extra_index_urls)
        == (mine.version, mine.platform, mine.index_url, mine.extra_index_urls)
        and theirs.heavy == mine.heavy
        and ancestor.bases == lock.bases
    )


def packages_base_lock(stack: ResolvedStack, lock: Lock) -> Lock:
    """The lock whose packages the packages stage installs first, in a layer of its own: the
    farthest ancestor's lock that shares_packages_layer with this one, else the lock itself.
    Every descendant of that ancestor then starts from one and the same layer, and a child
    that adds one package installs one package over it (issue 46), where a whole install of
    its own lock copied and byte-compiled the flagship's set again. Whether an ancestor's lock
    is fresh does not matter: the stack's own lock is installed over it, extras removed."""
    for source in reversed(stack.sources[1:]):  # the farthest ancestor first
        path = source.with_name(f"{source.stem}.lock")
        if path.is_file():
            ancestor = read_lock(path)
            if shares_packages_layer(ancestor, lock):
                return ancestor
    return lock


def current_lock(stack: ResolvedStack) -> Lock | None:
    """The stack's lock for a build: None without one (nor a parent's that matches it:
    inherited_lock); a stale or broken lock is an error."""
    path = lock_path(stack)
    if not path.is_file():
        inherited = inherited_lock(stack)
        return inherited[1] if inherited else None
    lock = read_lock(path)
    reason = stale_reason(stack, lock)
    if reason is not None:
        raise StackError(
            f"lock no longer matches stacks/{stack.name}.yaml: {reason}",
            file=path,
            key="inputs_hash",
            hint=f"run `sm120-stacks lock {stack.name}`, or delete the lock to build without one",
        )
    return lock


def locked_versions(stack: ResolvedStack) -> dict[str, str] | None:
    """The versions the stack's lock installs (name -> version), for the compatibility rules:
    None without a lock or with a stale one (`check` reports that on its own)."""
    path = lock_path(stack)
    if not path.is_file():
        inherited = inherited_lock(stack)
        return inherited[1].python.versions() if inherited else None
    lock = read_lock(path)
    return lock.python.versions() if stale_reason(stack, lock) is None else None
