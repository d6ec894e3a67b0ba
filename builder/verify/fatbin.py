"""Read the device code a CUDA library carries: the fatbins in its ELF .nv_fatbin sections.

The standard library only, and nothing imported from the package: the same file reads libraries
on this machine (bench/fatbin_strip.py) and, as `python -c`, inside a container of an image
(builder/verify/device_code.py), whose base has no cuobjdump. Reads headers, not payloads: a
library's fatbin entries are walked by their sizes, and only a module without machine code for
a target GPU has its kernels counted (from its cubin's symbols or its uncompressed PTX).

Layout, as cuobjdump reads it (checked against cuobjdump 13.5 on vLLM 0.33's libraries and on
nvcc 13.0 output: bench/results/device-code/, tests/engine/test_device_code.py): a container
is a 16-byte header (magic 0xBA55ED50, u16 version, u16 header size, u64 size of its entries),
then entries, each a header (u16 kind: 1 PTX, 2 ELF; u16; u32 header size; u64 payload size;
u32 arch at offset 28, the number: 80, 90, 120; u64 flags at offset 40: 0x2000 or 0x8000
compressed, 0x100000 arch-specific; u64 uncompressed size at offset 56, 0 when not
compressed) and its payload. One container is one compiled module: its PTX and its cubins
declare the same kernels.

    python fatbin.py '{"roots": [...], "targets": {"sm_120": [12, 0]}, ...}'   # prints a JSON scan
"""

from __future__ import annotations

import fnmatch
import json
import mmap
import os
import re
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any

MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "elf"}
#: The two compression flags seen (0x8000, zstd, in torch 2.14's and vLLM 0.33's libraries).
COMPRESSED = 0x2000 | 0x8000
#: Arch-specific code (sm_90a, compute_90a): runs on that very capability only. cuobjdump names
#: exactly the entries with this flag sm_90a (27 cubins of vLLM 0.33's _C_stable_libtorch, all
#: 192 of its FA3 library: bench/results/device-code/arch-specific-names.txt).
ARCH_SPECIFIC = 0x100000
#: The section the driver loads modules from; __nv_relfatbin holds relocatable device code for
#: nvcc's device link (-rdc), which cuobjdump too leaves out unless told (-all).
LOADED = (b".nv_fatbin",)
ALL_SECTIONS = (b".nv_fatbin", b"__nv_relfatbin")
_SHT_NOBITS, _SHT_SYMTAB, _STT_FUNC = 8, 2, 2
#: st_other of a kernel (an entry function) in a cubin's symbol table; device functions lack it.
_STO_CUDA_ENTRY = 0x10
_PTX_ENTRY = re.compile(rb"^\s*(?:\.visible\s+|\.weak\s+)*\.entry\s", re.MULTILINE)


@dataclass(frozen=True)
class Entry:
    """One fatbin entry: PTX or a cubin (ELF) for one arch."""

    offset: int  # of the entry header in the file
    header_size: int
    size: int
    kind: str
    arch: int
    flags: int
    uncompressed_size: int

    @property
    def payload(self) -> slice:
        start = self.offset + self.header_size
        return slice(start, start + self.size)

    @property
    def compressed(self) -> bool:
        return bool(self.flags & COMPRESSED)

    @property
    def specific(self) -> bool:
        return bool(self.flags & ARCH_SPECIFIC)

    @property
    def name(self) -> str:
        """As cuobjdump names it: sm_80 for machine code, compute_80 for PTX, a for specific."""
        kind = "compute" if self.kind == "ptx" else "sm"
        return f"{kind}_{self.arch}{'a' if self.specific else ''}"

    def runs_on(self, major: int, minor: int) -> bool:
        """Machine code for sm_XY runs on a GPU of major X and minor >= Y (sm_80 on 8.6, not on
        9.0); sm_XYa on X.Y only."""
        if self.kind != "elf":
            return False
        if self.specific:
            return self.arch == major * 10 + minor
        return self.arch // 10 == major and self.arch % 10 <= minor

    def jits_on(self, major: int, minor: int) -> bool:
        """PTX for compute_XY is compiled by the driver for a GPU of capability X.Y or later;
        compute_XYa for X.Y only."""
        if self.kind != "ptx":
            return False
        target = major * 10 + minor
        return self.arch == target if self.specific else self.arch <= target

    @property
    def text_size(self) -> int:
        """The payload's size once uncompressed: the PTX text the driver would compile."""
        return self.uncompressed_size if self.compressed and self.uncompressed_size else self.size


def _elf_sections(data: Any, base: int = 0) -> list[tuple[bytes, int, int, int, int]]:
    """(name, type, offset from base, size, entry size) of each section of the ELF64 at base."""
    if data[base : base + 4] != b"\x7fELF" or data[base + 4] != 2:
        return []
    (shoff,) = struct.unpack_from("<Q", data, base + 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, base + 0x3A)
    if not shoff or shstrndx >= shnum:
        return []
    strtab = base + struct.unpack_from("<Q", data, base + shoff + shstrndx * shentsize + 0x18)[0]
    out = []
    for index in range(shnum):
        header = base + shoff + index * shentsize
        name_off, sh_type = struct.unpack_from("<II", data, header)
        offset, size = struct.unpack_from("<QQ", data, header + 0x18)
        (entsize,) = struct.unpack_from("<Q", data, header + 0x38)
        start = strtab + name_off
        name = bytes(data[start : data.find(b"\0", start, start + 4096)])
        out.append((name, sh_type, offset, size, entsize))
    return out


def fatbin_sections(data: Any, names: tuple[bytes, ...] = LOADED) -> list[tuple[int, int]]:
    """(offset, size) of a 64-bit ELF file's sections of those names (.nv_fatbin)."""
    if len(data) < 64:
        return []
    return [
        (offset, size)
        for name, sh_type, offset, size, _ in _elf_sections(data)
        if name in names and sh_type != _SHT_NOBITS
    ]


def containers(data: Any, names: tuple[bytes, ...] = LOADED) -> list[list[Entry]]:
    """Every fatbin container in those sections, as its entries (empty containers left out)."""
    found = []
    for offset, size in fatbin_sections(data, names):
        pos, end = offset, min(offset + size, len(data))
        while pos + 16 <= end:
            magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
            if magic != MAGIC:  # padding between containers
                pos += 8
                continue
            entries, epos, eend = [], pos + header_size, min(pos + header_size + fat_size, end)
            while epos + 64 <= eend:
                kind, _v, ehsize, esize = struct.unpack_from("<HHIQ", data, epos)
                if ehsize < 64:
                    break  # not an entry header: the rest of this container is unreadable
                (arch,) = struct.unpack_from("<I", data, epos + 28)
                flags, _, uncompressed = struct.unpack_from("<QQQ", data, epos + 40)
                name = KINDS.get(kind, str(kind))
                entries.append(Entry(epos, ehsize, esize, name, arch, flags, uncompressed))
                epos += ehsize + esize
            if entries:
                found.append(entries)
            pos = max(eend, pos + 16)
    return found


def cubin_kernels(data: Any, entry: Entry) -> int | None:
    """Kernels (entry functions) in an uncompressed cubin: None where it cannot be read."""
    if entry.kind != "elf" or entry.compressed:
        return None
    base = entry.payload.start
    try:
        sections = _elf_sections(data, base)
        count = 0
        for _name, sh_type, offset, size, entsize in sections:
            if sh_type != _SHT_SYMTAB or entsize < 24:
                continue
            for sym in range(base + offset, base + offset + size - entsize + 1, entsize):
                info, other = data[sym + 4], data[sym + 5]
                count += (info & 0xF) == _STT_FUNC and bool(other & _STO_CUDA_ENTRY)
    except (struct.error, IndexError, ValueError):
        return None
    return count if sections else None


def ptx_kernels(data: Any, entry: Entry) -> int | None:
    """`.entry` declarations in uncompressed PTX: None where it is compressed."""
    if entry.kind != "ptx" or entry.compressed:
        return None
    return len(_PTX_ENTRY.findall(bytes(data[entry.payload])))


# --- which code runs on which GPU --------------------------------------------------------------


def _lacking(data: Any, found: list[list[Entry]], major: int, minor: int) -> dict[str, Any]:
    """What a GPU of capability major.minor gets from the modules without machine code for it:
    PTX the driver compiles (jit) or nothing at all (no_code); kernels None where unknown."""
    tally: dict[str, Any] = dict.fromkeys(["sass_modules", "jit_modules", "no_code_modules"], 0)
    tally["ptx_bytes"] = 0
    kernels: dict[str, int | None] = {"jit": 0, "no_code": 0}
    ptx_archs: set[str] = set()
    for entries in found:
        if any(e.runs_on(major, minor) for e in entries):
            tally["sass_modules"] += 1
            continue
        usable = [e for e in entries if e.jits_on(major, minor)]
        best = max(usable, key=lambda e: e.arch) if usable else None  # the newest it can
        count = ptx_kernels(data, best) if best else None
        for cubin in (e for e in entries if e.kind == "elf"):
            count = cubin_kernels(data, cubin) if count is None else count
        if count == 0:
            continue  # a module without kernels (a device runtime stub): nothing to load
        what = "jit" if best else "no_code"
        tally[f"{what}_modules"] += 1
        if best is not None:
            tally["ptx_bytes"] += best.text_size
            ptx_archs.add(best.name)
        known = kernels[what]
        kernels[what] = None if known is None or count is None else known + count
    tally.update(
        kernels=kernels["jit"], no_code_kernels=kernels["no_code"], ptx_archs=sorted(ptx_archs)
    )
    return tally


def library_code(path: str, targets: dict[str, list[int]]) -> dict[str, Any] | None:
    """A library's device code, and per target GPU (name -> [major, minor]) what its modules
    lack; None for a file with no fatbin (most shared libraries)."""
    with open(path, "rb") as handle:
        if handle.read(4) != b"\x7fELF" or os.fstat(handle.fileno()).st_size < 64:
            return None
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found = containers(data)
            if not found:
                return None
            names = {e.name for entries in found for e in entries}
            lacking = {}
            for gpu, (major, minor) in targets.items():
                missing = _lacking(data, found, major, minor)
                if missing["jit_modules"] or missing["no_code_modules"]:
                    lacking[gpu] = missing
            return {
                "path": path,
                "bytes": len(data),
                "modules": len(found),
                "sass": sorted(n for n in names if n.startswith("sm_")),
                "ptx": sorted(n for n in names if n.startswith("compute_")),
                "lacking": lacking,
            }


# --- a scan of an image's libraries ------------------------------------------------------------


def _roots(names: list[str]) -> list[str]:
    """Folders to scan: `site-packages` is this Python's purelib and platlib."""
    import sysconfig

    out: list[str] = []
    for name in names:
        paths = (
            [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
            if name == "site-packages"
            else [os.path.expanduser(name)]
        )
        for path in paths:
            if os.path.isdir(path) and os.path.realpath(path) not in map(os.path.realpath, out):
                out.append(path)
    return out


def scan(config: dict[str, Any]) -> dict[str, Any]:
    """Every library under the roots whose name matches a pattern, within budget_s seconds: the
    ones with device code, what each lacks per target; files left when time ran out counted."""
    started = time.monotonic()
    deadline = started + float(config.get("budget_s", 60))
    patterns = config.get("patterns", ["*.so", "*.so.*"])
    roots = _roots(config.get("roots", ["site-packages"]))
    result: dict[str, Any] = {"roots": roots, "files": 0, "unscanned": 0, "libraries": []}
    errors: list[str] = []
    seen: set[tuple[int, int]] = set()
    for root in roots:
        for folder, dirs, files in os.walk(root, onerror=lambda exc: errors.append(str(exc))):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                if not any(fnmatch.fnmatch(name, p) for p in patterns) or os.path.islink(path):
                    continue
                stat = os.stat(path)
                if (stat.st_dev, stat.st_ino) in seen:
                    continue
                seen.add((stat.st_dev, stat.st_ino))
                if time.monotonic() > deadline:
                    result["unscanned"] += 1
                    continue
                result["files"] += 1
                try:
                    code = library_code(path, config.get("targets", {}))
                except (OSError, ValueError, struct.error, IndexError) as exc:
                    errors.append(f"{path}: {type(exc).__name__}: {exc}"[:300])
                    continue
                if code is not None:
                    code["relative"] = os.path.relpath(path, root)
                    result["libraries"].append(code)
    result["errors"] = errors
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


if __name__ == "__main__":
    print(json.dumps(scan(json.loads(sys.argv[1])), sort_keys=True))
