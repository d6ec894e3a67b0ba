"""Keep only the device code one GPU can load in a CUDA library's fatbins, in place.

The GPU machine takes at most 64 MiB per run, and a CUDA library carries machine code for every
architecture it was built for (torch 2.14.0's libtorch_cuda.so: sm_75 ... sm_121a, 333 MB of
fatbin). This zero-fills the payload of every fatbin entry the target GPU cannot use, so the
file keeps its size and every offset (the host code points into .nv_fatbin by address) and xz
squeezes the zeros to nothing. An entry is kept when it is machine code (ELF) for one of the
KEEP architectures, or PTX of a container that holds no kept machine code (the driver must
JIT-compile that one; only when --keep-ptx-where-needed, the default). Everything else in the
file stays byte for byte.

    python3 bench/fatbin_strip.py [--keep sm_90,sm_90a] [--ptx-filter REGEX | --ptx-index N,...]
                                  [--report] LIB...

--ptx-filter keeps PTX only of containers whose PTX text matches REGEX (e.g. a head dim), for a
library whose PTX is what the GPU runs (vLLM's FA2: sm_80 machine code and sm_80 PTX only);
compressed PTX cannot be read here, so --ptx-index names the PTX entries to keep by their number
in `cuobjdump -xptx all` order (1-based, the file's order: checked by each entry's uncompressed
size against the extracted file), chosen by reading the extracted PTX.

Fatbin layout (as cuobjdump reads it; checked against `cuobjdump -lelf/-lptx` counts): a
container is a 16-byte header (magic 0xBA55ED50, u16 version, u16 header size, u64 size of the
entries), then entries, each a header (u16 kind: 1 PTX, 2 ELF; u16; u32 header size; u64
payload size; ...; u32 arch at offset 28; u64 flags at offset 40, 0x2000 or 0x8000 = compressed; u64
uncompressed size at offset 56) and its payload.
"""

from __future__ import annotations

import argparse
import mmap
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xBA55ED50
KIND = {1: "ptx", 2: "elf"}
COMPRESSED = 0x2000 | 0x8000  # the two compression flags seen (0x8000 in torch 2.14's libraries)


@dataclass
class Entry:
    offset: int  # of the entry header in the file
    header_size: int
    size: int
    kind: str
    arch: int
    flags: int

    @property
    def payload(self) -> slice:
        start = self.offset + self.header_size
        return slice(start, start + self.size)


def _sections(data: mmap.mmap) -> list[tuple[int, int]]:
    """(offset, size) of the ELF sections named .nv_fatbin / __nv_relfatbin."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:
        return []  # not a 64-bit ELF file: nothing to strip
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    strtab_off = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    out = []
    for i in range(shnum):
        base = shoff + i * shentsize
        (name_off,) = struct.unpack_from("<I", data, base)
        name = data[strtab_off + name_off : data.find(b"\0", strtab_off + name_off)]
        (sh_type,) = struct.unpack_from("<I", data, base + 4)
        off, size = struct.unpack_from("<QQ", data, base + 0x18)
        if name in (b".nv_fatbin", b"__nv_relfatbin") and sh_type != 8:  # 8: NOBITS
            out.append((off, size))
    return out


def containers(data: mmap.mmap) -> list[list[Entry]]:
    found = []
    for off, size in _sections(data):
        pos, end = off, off + size
        while pos + 16 <= end:
            magic, _version, hsize, fat_size = struct.unpack_from("<IHHQ", data, pos)
            if magic != MAGIC:  # padding between containers
                pos += 8
                continue
            entries, epos, eend = [], pos + hsize, pos + hsize + fat_size
            while epos < eend:
                kind, _v, ehsize, esize = struct.unpack_from("<HHIQ", data, epos)
                (arch,) = struct.unpack_from("<I", data, epos + 28)
                (flags,) = struct.unpack_from("<Q", data, epos + 40)
                entries.append(Entry(epos, ehsize, esize, KIND.get(kind, str(kind)), arch, flags))
                epos += ehsize + esize
            found.append(entries)
            pos = eend
    return found


def _arch_names(entry: Entry) -> set[str]:
    # The header's arch is the number (90); the "a"/"f" variants share it: keep both names.
    return {f"sm_{entry.arch}", f"sm_{entry.arch}a", f"sm_{entry.arch}f"}


def strip(
    path: Path,
    keep: set[str],
    ptx_filter: re.Pattern[bytes] | None,
    ptx_index: set[int] | None,
    report: bool,
    quiet: bool = False,
) -> None:
    if path.stat().st_size == 0:
        return
    with path.open("r+b") as fh, mmap.mmap(fh.fileno(), 0) as data:
        if not _sections(data):
            return
        kept = dropped = ptx_seen = 0
        counts: dict[str, int] = {}
        for entries in containers(data):
            has_sass = any(e.kind == "elf" and _arch_names(e) & keep for e in entries)
            for e in entries:
                want = e.kind == "elf" and bool(_arch_names(e) & keep)
                if e.kind == "ptx":
                    ptx_seen += 1
                if e.kind == "ptx" and not has_sass:
                    want = ptx_index is None or ptx_seen in ptx_index
                    if ptx_filter is not None:
                        if e.flags & COMPRESSED:
                            raise SystemExit(f"{path}: compressed PTX; --ptx-filter cannot read it")
                        want = bool(ptx_filter.search(data[e.payload]))
                key = f"{e.kind}:sm_{e.arch}:{'keep' if want else 'drop'}"
                counts[key] = counts.get(key, 0) + 1
                if want:
                    kept += e.size
                else:
                    dropped += e.size
                    data[e.payload] = bytes(e.size)
                    if e.flags & COMPRESSED:  # no longer compressed data: say so, or a
                        # reader that walks every entry (cuobjdump -lelf) fails to uncompress it
                        struct.pack_into("<Q", data, e.offset + 40, e.flags & ~COMPRESSED)
                        struct.pack_into("<Q", data, e.offset + 56, 0)  # uncompressed size
        data.flush()
    if quiet and not dropped:
        return
    print(f"{path}: kept {kept / 1e6:.1f} MB of device code, zeroed {dropped / 1e6:.1f} MB")
    if report:
        for key in sorted(counts):
            print(f"  {key}: {counts[key]}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", default="sm_90,sm_90a")
    parser.add_argument("--ptx-filter", default=None)
    parser.add_argument("--ptx-index", default=None)
    parser.add_argument("--report", action="store_true")
    parser.add_argument(
        "--quiet", action="store_true", help="say nothing of files left as they are"
    )
    parser.add_argument("libs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    keep = set(args.keep.split(","))
    flt = re.compile(args.ptx_filter.encode()) if args.ptx_filter else None
    for lib in args.libs:
        index = {int(n) for n in args.ptx_index.split(",")} if args.ptx_index else None
        strip(lib, keep, flt, index, args.report, args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
