"""Real ELF files with fatbins, written byte by byte: what a CUDA library and its cubins are to a
reader of their headers (builder/verify/fatbin.py), without nvcc.

A host library is an ELF64 file with a .nv_fatbin section of containers; a container holds
entries, each a cubin (itself an ELF64 file whose symbol table marks kernels STO_CUDA_ENTRY) or
PTX text, compressed or not. The engine test compiles the same shapes with nvcc.
"""

from __future__ import annotations

import struct

MAGIC = 0xBA55ED50
PTX, ELF = 1, 2
PLAIN, ZSTD = 0x11, 0x8011
ARCH_SPECIFIC = 0x100000
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_STRTAB = 1, 2, 3


def elf64(sections: list[tuple[str, int, bytes, int]], machine: int = 0x3E) -> bytes:
    """An ELF64 little-endian file of (name, type, data, entry size) sections, a section-name
    string table added last."""
    names = b"\0"
    offsets = []
    for name, *_ in sections:
        offsets.append(len(names))
        names += name.encode() + b"\0"
    shstr_name = len(names)
    names += b".shstrtab\0"
    everything = [*sections, (".shstrtab", _SHT_STRTAB, names, 0)]
    body = b""
    placed = []
    for _name, _type, data, _entsize in everything:
        body += b"\0" * (-len(body) % 8)
        placed.append(64 + len(body))
        body += data
    body += b"\0" * (-len(body) % 8)
    shoff = 64 + len(body)
    headers = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    name_offsets = [*offsets, shstr_name]
    for index, ((_n, sh_type, data, entsize), where, name_off) in enumerate(
        zip(everything, placed, name_offsets, strict=True)
    ):
        link = index + 2 if sh_type == _SHT_SYMTAB else 0  # its strings: the section after it
        headers += struct.pack(
            "<IIQQQQIIQQ", name_off, sh_type, 0, 0, where, len(data), link, 0, 8, entsize
        )
    count = len(everything) + 1
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header = struct.pack(
        "<16sHHIQQQIHHHHHH", ident, 3, machine, 1, 0, 0, shoff, 0, 64, 0, 0, 64, count, count - 1
    )
    return header + body + headers


def cubin(kernels: list[str], device_functions: tuple[str, ...] = ()) -> bytes:
    """A cubin whose symbol table holds kernels (STO_CUDA_ENTRY) and device functions."""
    strings = b"\0"
    symbols = struct.pack("<IBBHQQ", 0, 0, 0, 0, 0, 0)
    for name, other in [(k, 0x10) for k in kernels] + [(f, 0) for f in device_functions]:
        symbols += struct.pack("<IBBHQQ", len(strings), 0x12, other, 1, 0, 0)
        strings += name.encode() + b"\0"
    text = (".text", _SHT_PROGBITS, b"\0" * 16, 0)
    return elf64(
        [text, (".symtab", _SHT_SYMTAB, symbols, 24), (".strtab", _SHT_STRTAB, strings, 0)]
    )


def ptx(kernels: list[str], arch: int) -> bytes:
    """PTX text declaring these kernels (and one device function, which is no kernel)."""
    lines = [".version 9.0", f".target sm_{arch}", ".address_size 64", ".func helper()", "{ ret; }"]
    for kernel in kernels:
        lines += [f".visible .entry {kernel}(", "\t.param .u64 x", ")", "{ ret; }"]
    return ("\n".join(lines) + "\n").encode()


def entry(kind: int, arch: int, payload: bytes, flags: int = PLAIN, uncompressed: int = 0) -> bytes:
    """One fatbin entry: its 64-byte header (kind, header size, payload size, arch at 28,
    flags at 40, uncompressed size at 56) and its payload, padded to 8 bytes."""
    padded = payload + b"\0" * (-len(payload) % 8)
    header = struct.pack(
        "<HHIQIIHHIIIQQQ",
        kind,
        0x0101,
        64,
        len(padded),
        0,
        0,
        0,
        0,
        arch,
        0,
        0,
        flags,
        0,
        uncompressed,
    )
    return header + padded


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


def library(*containers: bytes, relocatable: bytes = b"") -> bytes:
    """A host library: its containers in .nv_fatbin (8-byte padding between them, as linkers
    leave it), relocatable device code in __nv_relfatbin."""
    fatbin = b"".join(c + b"\0" * 8 for c in containers)
    sections = [(".text", _SHT_PROGBITS, b"\x90" * 32, 0), (".nv_fatbin", _SHT_PROGBITS, fatbin, 0)]
    if relocatable:
        sections.append(("__nv_relfatbin", _SHT_PROGBITS, relocatable, 0))
    return elf64(sections)


def fa2_like(kernels_per_module: int = 3, modules: int = 2) -> tuple[bytes, int]:
    """A library shaped as vLLM 0.33's FA2: sm_80 cubins and zstd-compressed compute_80 PTX
    only; returns it and the PTX's uncompressed size in all."""
    parts = []
    total = 0
    for module in range(modules):
        names = [
            f"_Z15flash_fwd_kernelILi{module}ELi{k}EEv6Params" for k in range(kernels_per_module)
        ]
        text = ptx(names, 80)
        total += len(text)
        squeezed = b"\x28\xb5\x2f\xfd" + bytes(len(text) // 4)  # a zstd frame's magic, then bytes
        parts.append(
            container(
                entry(ELF, 80, cubin(names, ("_Z6helperv",))),
                entry(PTX, 80, squeezed, ZSTD, uncompressed=len(text)),
            )
        )
    return library(*parts), total
