"""A library's device code as NVIDIA's cuobjdump reads it: the functions of each machine-code
(SASS) arch, and the arch of each PTX module.

The reader is the maintained one, not ours: cuobjdump from the `nvidia-cuda-cuobjdump` wheel,
installed once with pip --target into build/tools/cuobjdump (never into a venv), or the one
SM120_STACKS_CUOBJDUMP or PATH names. `--dump-resource-usage` names every function per cubin
with the cubin's arch (what the field scan of 2026-12-06 counted Marlin from); `--list-ptx`
names the PTX modules. A library cuobjdump cannot read is a StackError naming it (exit 2).
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import StackError, ToolMissing
from builder.upstream.families import family_of

WHEEL = "nvidia-cuda-cuobjdump==13.4.92"
INSTALLED = Path("nvidia/cu13/bin/cuobjdump")
_ARCH = re.compile(r"^arch = (sm_\d+[af]?)\s*$")
_FUNCTION = re.compile(r"^ Function ([^:\s]+):")
_PTX = re.compile(r"^PTX file\s+\d+: .*\.(sm_\d+[af]?)\.ptx$")
_NO_CODE = "does not contain device code"


@dataclass
class DeviceCode:
    """One library: SASS arch -> its functions (one name per cubin it is in), PTX archs."""

    sass: dict[str, list[str]] = field(default_factory=dict)
    ptx: dict[str, int] = field(default_factory=dict)  # compute_80 -> modules

    def functions(self, arch: str, family: str | None = None) -> int:
        names = self.sass.get(arch, [])
        return len(names) if family is None else sum(family_of(n) == family for n in names)


def find_cuobjdump(tools_dir: Path) -> Path:
    """cuobjdump: SM120_STACKS_CUOBJDUMP, then build/tools' copy, then PATH, else installed from
    the wheel into build/tools (pip --target: this Python's pip, no venv touched)."""
    named = os.environ.get("SM120_STACKS_CUOBJDUMP")
    if named:
        if not os.access(named, os.X_OK):
            raise StackError(f"SM120_STACKS_CUOBJDUMP={named} is not an executable")
        return Path(named)
    local = tools_dir / "cuobjdump" / INSTALLED
    if local.is_file():
        return local
    on_path = shutil.which("cuobjdump")
    if on_path:
        return Path(on_path)
    print(f"installing {WHEEL} into {tools_dir / 'cuobjdump'}", file=sys.stderr)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
         str(tools_dir / "cuobjdump"), WHEEL],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not local.is_file():
        raise ToolMissing(
            f"cuobjdump: pip could not install {WHEEL} into {tools_dir / 'cuobjdump'}: "
            f"{done.stderr.strip()[-300:]}"
        )
    return local


def _run(tool: Path, flag: str, library: Path, label: str) -> list[str] | None:
    done = subprocess.run(
        [str(tool), flag, str(library)], capture_output=True, text=True, check=False
    )
    if _NO_CODE in done.stderr:
        return None
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise StackError(f"{label}: cuobjdump cannot read its device code: {said[0]}")
    return done.stdout.splitlines()


def read_device_code(tool: Path, library: Path, label: str = "") -> DeviceCode | None:
    """The library's device code; None when it carries none (most shared libraries)."""
    label = label or str(library)
    with library.open("rb") as handle:
        if handle.read(4) != b"\x7fELF":
            raise StackError(f"{label}: not an ELF file: its device code cannot be read")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            has_fatbin = data.find(b".nv_fatbin") >= 0
    usage = _run(tool, "--dump-resource-usage", library, label)
    listed = _run(tool, "--list-ptx", library, label)
    if usage is None and listed is None:
        if has_fatbin:
            raise StackError(f"{label}: has a .nv_fatbin section cuobjdump cannot read")
        return None
    return DeviceCode(sass=parse_resource_usage(usage or []), ptx=parse_ptx_list(listed or []))


def parse_resource_usage(lines: Iterable[str]) -> dict[str, list[str]]:
    """arch -> function names, from `cuobjdump --dump-resource-usage`."""
    out: dict[str, list[str]] = {}
    arch = None
    for line in lines:
        if found := _ARCH.match(line):
            arch = found.group(1)
            out.setdefault(arch, [])
        elif (found := _FUNCTION.match(line)) and arch is not None:
            out[arch].append(found.group(1))
    return {arch: names for arch, names in out.items() if names}  # PTX-only modules list none


def parse_ptx_list(lines: Iterable[str]) -> dict[str, int]:
    """compute_XY -> modules, from `cuobjdump --list-ptx` (cuobjdump files them as .sm_XY.ptx)."""
    out: dict[str, int] = {}
    for line in lines:
        if found := _PTX.match(line.strip()):
            name = "compute_" + found.group(1).removeprefix("sm_")
            out[name] = out.get(name, 0) + 1
    return out


def _parts(arch: str) -> tuple[int, int, str]:
    digits = re.sub(r"\D", "", arch)
    suffix = arch[-1] if arch[-1] in "af" else ""
    return int(digits) // 10, int(digits) % 10, suffix


def runs_on(arch: str, major: int, minor: int) -> bool:
    """Whether machine code sm_XY (a: that capability only; f: that family) runs on major.minor,
    or PTX compute_XY can be compiled for it by the driver (any later capability unless a/f)."""
    arch_major, arch_minor, suffix = _parts(arch)
    if suffix == "a":
        return (arch_major, arch_minor) == (major, minor)
    if arch.startswith("sm_") or suffix == "f":
        return arch_major == major and arch_minor <= minor
    return (arch_major, arch_minor) <= (major, minor)
