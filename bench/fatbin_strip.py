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

The fatbin reader is builder/verify/fatbin.py (its docstring has the layout); this script
reads both sections, .nv_fatbin and __nv_relfatbin, and writes entries in place.
"""

from __future__ import annotations

import argparse
import mmap
import re
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's builder/
from builder.verify.fatbin import (
    ALL_SECTIONS,
    COMPRESSED,
    Entry,
    containers,
    fatbin_sections,
)


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
        if not fatbin_sections(data, ALL_SECTIONS):
            return
        kept = dropped = ptx_seen = 0
        counts: dict[str, int] = {}
        for entries in containers(data, ALL_SECTIONS):
            has_sass = any(e.kind == "elf" and _arch_names(e) & keep for e in entries)
            for e in entries:
                want = e.kind == "elf" and bool(_arch_names(e) & keep)
                if e.kind == "ptx":
                    ptx_seen += 1
                if e.kind == "ptx" and not has_sass:
                    want = ptx_index is None or ptx_seen in ptx_index
                    if ptx_filter is not None:
                        if e.compressed:
                            raise SystemExit(f"{path}: compressed PTX; --ptx-filter cannot read it")
                        want = bool(ptx_filter.search(data[e.payload]))
                key = f"{e.kind}:sm_{e.arch}:{'keep' if want else 'drop'}"
                counts[key] = counts.get(key, 0) + 1
                if want:
                    kept += e.size
                else:
                    dropped += e.size
                    data[e.payload] = bytes(e.size)
                    if e.compressed:  # no longer compressed data: say so, or a
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
