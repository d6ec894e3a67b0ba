"""Damaged runtime cache entries, found before a server loads them.

A start killed while it compiled leaves entries its writer never finished: a zero-length or
cut-short CuTe-DSL `.o`, objects without their module's meta.json, a Triton group file naming a
file that is not there. The next start loads them and fails, or quietly compiles them again, so
a warm artifact made of them is neither warm nor safe. knowledge/cache_integrity.yaml says what
a whole entry is, per folder; this module holds a listing (path and size of every file below
live/, plus the first bytes of the few files whose format is checked) to it, whatever the
listing was read from: a folder, the artifact's tar, or a host's cache volume. It is used at
`cache capture` (a damaged live/ is never pushed), at a restore (an artifact whose files would
be damaged is refused before anything is written into the volume) and by `doctor --host`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import struct
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.errors import StackError
from builder.knowledge.cache_integrity import CacheIntegrity, Entry, FileRule, cache_integrity
from builder.knowledge.cache_volume import CacheVolume, cache_volume
from builder.warm.volume import ROOT, VolumeAccess

#: How many leading bytes each format check reads (a JSON file longer than this is not judged).
READ_LIMIT = {"elf": 64, "json": 1 << 20}
#: The volume's files are read through one shell command per batch of this many bytes of names.
BATCH_CHARS = 60_000
ELF_MAGIC = b"\x7fELF"
SHOWN = 10


@dataclass(frozen=True)
class Damage:
    """One damaged or missing file, relative to live/, in the entry folder that holds it."""

    path: str
    folder: str
    entry: str
    why: str

    def describe(self) -> str:
        return f"{self.path}: {self.why}"


def wanted(sizes: Mapping[str, int], rules: CacheIntegrity | None = None) -> dict[str, int]:
    """The files whose first bytes the checks read, and how many of them."""
    rules = rules or cache_integrity()
    found: dict[str, int] = {}
    for path, size in sizes.items():
        folder, _, name = path.rpartition("/")
        entry = rules.entry_of(folder)
        if entry is None or size == 0:
            continue
        limits = [READ_LIMIT[r.format] for r in entry.rules_for(name) if r.format]
        if limits:
            found[path] = max(limits)
    return found


def inspect(
    sizes: Mapping[str, int],
    contents: Mapping[str, bytes],
    rules: CacheIntegrity | None = None,
    layout: CacheVolume | None = None,
) -> list[Damage]:
    """Every damaged file of the listing (sizes: path below live/ -> bytes; contents: the
    first bytes of the files `wanted` names), in path order."""
    rules, layout = rules or cache_integrity(), layout or cache_volume()
    folders: dict[str, list[str]] = {}
    for path in sizes:
        folder, _, name = path.rpartition("/")
        folders.setdefault(folder, []).append(name)
    damage: list[Damage] = []
    for folder, names in sorted(folders.items()):
        entry = rules.entry_of(folder)
        if entry is not None:
            damage += _entry_damage(entry, folder, set(names), sizes, contents, layout)
    return sorted(damage, key=lambda d: d.path)


def _entry_damage(
    entry: Entry,
    folder: str,
    names: set[str],
    sizes: Mapping[str, int],
    contents: Mapping[str, bytes],
    layout: CacheVolume,
) -> list[Damage]:
    found: list[Damage] = []
    for name in sorted(names):
        path = f"{folder}/{name}"
        for rule in entry.rules_for(name):
            why = _file_damage(rule, path, sizes, contents, layout)
            if why is not None:
                found.append(Damage(path, folder, entry.name, why))
                break
    for companion in entry.requires:
        present = any(fnmatch.fnmatchcase(n, companion.file) for n in names)
        if not present and any(fnmatch.fnmatchcase(n, companion.when) for n in names):
            why = f"missing beside {companion.when}: {companion.why}"
            found.append(Damage(f"{folder}/{companion.file}", folder, entry.name, why))
    return found


def _file_damage(
    rule: FileRule,
    path: str,
    sizes: Mapping[str, int],
    contents: Mapping[str, bytes],
    layout: CacheVolume,
) -> str | None:
    """Why the file breaks the rule, or None."""
    size = sizes[path]
    if size == 0:
        return f"is empty ({rule.why})" if rule.non_empty else None
    head = contents.get(path)
    if rule.format is None or head is None:
        return None
    if rule.format == "elf":
        return _elf_damage(head, size)
    if size > READ_LIMIT["json"]:
        return None
    try:
        data = json.loads(head)
    except ValueError:
        return f"is not whole JSON ({size} bytes; {rule.why})"
    if rule.keys or rule.children:
        if not isinstance(data, dict):
            return "is JSON but not an object"
        lacking = [key for key in (*rule.keys, *filter(None, [rule.children])) if key not in data]
        if lacking:
            return f"lacks {', '.join(lacking)} ({rule.why})"
    if rule.children:
        return _children_damage(data[rule.children], path, sizes, layout)
    return None


def _elf_damage(head: bytes, size: int) -> str | None:
    """An ELF file whose header is whole and whose header tables end inside it."""
    if head[:4] != ELF_MAGIC:
        return "is not an ELF object (no ELF magic: zero-filled or overwritten)"
    wide, order = head[4:5] == b"\x02", "<" if head[5:6] == b"\x01" else ">"
    header = 64 if wide else 52
    if size < header or len(head) < header:
        return f"is cut short: {size} bytes, less than its ELF header"
    if wide:
        phoff, shoff = struct.unpack_from(order + "QQ", head, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 0x36)
    else:
        phoff, shoff = struct.unpack_from(order + "II", head, 0x1C)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 0x2A)
    end = max(phoff + phentsize * phnum if phoff else 0, shoff + shentsize * shnum if shoff else 0)
    if end > size:
        return f"is cut short: {size} bytes, its ELF header names tables up to byte {end}"
    return None


def _children_damage(
    children: Any, path: str, sizes: Mapping[str, int], layout: CacheVolume
) -> str | None:
    """A group file's children (names in its folder, or a map of names to paths): each must
    be in the listing and not empty."""
    folder = path.rpartition("/")[0]
    if isinstance(children, dict):
        named = [str(value) for value in children.values()]
    elif isinstance(children, list):
        named = [str(value) for value in children]
    else:
        return "names its files in neither a list nor a map"
    prefix = layout.live_path + "/"
    for child in named:
        if child.startswith("/") and not child.startswith(prefix):
            return f"names {child}, outside the cache volume's {layout.live_path}"
        relative = child.removeprefix(prefix) if child.startswith("/") else f"{folder}/{child}"
        if relative not in sizes:
            return f"names {relative}, which is not there (a start killed while it wrote them)"
        if sizes[relative] == 0:
            return f"names {relative}, which is empty"
    return None


# -- what the listing is read from --


def inspect_folder(root: Path, layout: CacheVolume | None = None) -> list[Damage]:
    """A live/ folder on this machine (a test's, or one an operator copied out)."""
    layout = layout or cache_volume()
    sizes: dict[str, int] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            relative = path.relative_to(root).as_posix()
            if path.is_file() and not layout.skipped(relative):
                sizes[relative] = path.stat().st_size
    contents = {}
    for relative, limit in wanted(sizes).items():
        with (root / relative).open("rb") as handle:
            contents[relative] = handle.read(limit)
    return inspect(sizes, contents, layout=layout)


def inspect_tar(tar_path: Path, layout: CacheVolume | None = None) -> list[Damage]:
    """The artifact's tar (members relative to live/), read before it is pushed or unpacked."""
    with tarfile.open(tar_path, "r:") as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        sizes = {name: member.size for name, member in members.items()}
        contents = {}
        for name, limit in wanted(sizes).items():
            handle = tar.extractfile(members[name])
            assert handle is not None
            contents[name] = handle.read(limit)
    return inspect(sizes, contents, layout=layout)


def inspect_volume(access: VolumeAccess) -> list[Damage]:
    """live/ of a host's cache volume, through its helper container: one listing, then the
    first bytes of the files checked, as hex, in a few shell commands."""
    sizes = {path: entry.size for path, entry in access.listing().items()}
    contents: dict[str, bytes] = {}
    batch: list[str] = []
    for path, limit in sorted(wanted(sizes).items()):
        batch.append(f"{limit} {shlex.quote(path)}")
        if sum(map(len, batch)) > BATCH_CHARS:
            contents |= _read_heads(access, batch)
            batch = []
    if batch:
        contents |= _read_heads(access, batch)
    return inspect(sizes, contents, layout=access.layout)


def _read_heads(access: VolumeAccess, batch: list[str]) -> dict[str, bytes]:
    pairs = " ".join(batch)
    out = access.sh(
        f"cd {ROOT}/{access.layout.live} && set -- {pairs}; "
        'while [ $# -gt 1 ]; do printf "%s\\t" "$2"; head -c "$1" -- "$2" | od -An -v -tx1 '
        "| tr -d ' \\n'; printf '\\n'; shift 2; done",
        "reading the cache's entries",
    )
    heads = {}
    for line in out.splitlines():
        path, _, hexed = line.rpartition("\t")
        if path:
            heads[path] = bytes.fromhex(hexed)
    return heads


# -- what is said --


def counted(damage: list[Damage]) -> str:
    return f"{len(damage)} damaged cache file{'s' * (len(damage) != 1)}"


def listed(damage: list[Damage]) -> str:
    """The damaged files, one a line (the first SHOWN)."""
    lines = [f"  {d.describe()}" for d in damage[:SHOWN]]
    if len(damage) > SHOWN:
        lines.append(f"  ... and {len(damage) - SHOWN} more")
    return "\n".join(lines)


def remedy(damage: list[Damage], volume: str, image: str) -> str:
    """What to do: remove the damaged entries' folders (their writers compile them again at the
    next start), or restart the server to regenerate them, then capture again."""
    rules = cache_integrity()
    folders = sorted({d.folder for d in damage})
    again = "; ".join(
        sorted({e.remedy for e in rules.entries if any(d.entry == e.name for d in damage)})
    )
    paths = " ".join(shlex.quote(f"{ROOT}/{cache_volume().live}/{f}") for f in folders)
    return (
        f"with the server stopped, remove the damaged entries on the host's engine "
        f"(`docker run --rm -v {volume}:{ROOT} --entrypoint rm {image} -rf -- {paths}`), or "
        f"restart the server to regenerate them ({again}); serve its smoke, then capture again"
    )


def refused_capture(damage: list[Damage], host: str, volume: str, image: str) -> StackError:
    """`cache capture` of a damaged live/: nothing is pushed."""
    return StackError(
        f"the cache volume {volume} on {host} holds {counted(damage)} (a start "
        f"killed while it compiled leaves these); nothing was pushed:\n{listed(damage)}",
        hint=remedy(damage, volume, image),
    )


def refused_restore(damage: list[Damage]) -> StackError:
    """A restore of an artifact whose files would be damaged: nothing is written."""
    first = damage[0].describe()
    more = f" and {len(damage) - 1} more" if len(damage) > 1 else ""
    return StackError(
        f"the warm-cache artifact holds damaged cache files ({first}{more}); nothing was restored",
        hint="capture it again from a host whose cache is whole (`sm120-stacks doctor --host "
        "HOST` finds the damage, `sm120-stacks cache capture HOST` refuses it)",
    )
