"""Device code of a release's wheel against the stack's GPUs and against the stack's release.

Every compiled library (*.so) in the wheel is unpacked alone into a scratch folder, read with
cuobjdump and deleted. For each library and kernel family a finding says what the stack's GPU
loses or gains: machine code that runs on it, PTX the driver would compile at first use (into
CUDA_CACHE_PATH, knowledge/device_code.yaml), or nothing.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from builder.upstream.cuobjdump import DeviceCode, read_device_code, runs_on
from builder.upstream.families import OTHER, family_of


@dataclass(frozen=True)
class LibraryRow:
    """One library of the new wheel (or one the new wheel dropped) for one GPU."""

    library: str
    gpu: str
    sass: list[str]
    ptx: list[str]
    on_gpu: str  # machine code | PTX, driver JIT | none
    before: str  # the same, for the stack's release; "-" when it had no such library


@dataclass(frozen=True)
class DeviceFinding:
    library: str
    family: str
    gpu: str
    lost: int  # functions with machine code for the GPU before, none now (negative: gained)
    text: str
    where: str


def scan_wheel(tool: Path, wheel: Path, scratch_parent: Path) -> dict[str, DeviceCode]:
    """Library path in the wheel -> its device code (libraries without any left out)."""
    out: dict[str, DeviceCode] = {}
    scratch_parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".audit-", dir=scratch_parent))
    try:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                if not (info.filename.endswith(".so") or ".so." in info.filename):
                    continue
                path = Path(archive.extract(info, scratch))
                code = read_device_code(tool, path, f"{wheel.name}!{info.filename}")
                path.unlink()
                if code is not None:
                    out[info.filename] = code
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def _on_gpu(code: DeviceCode | None, major: int, minor: int) -> str:
    if code is None:
        return "-"
    if any(runs_on(arch, major, minor) and names for arch, names in code.sass.items()):
        return "machine code"
    jit = [arch for arch in code.ptx if runs_on(arch, major, minor)]
    return f"PTX {', '.join(sorted(jit))}: driver JIT" if jit else "none"


def _families(code: DeviceCode, major: int, minor: int) -> dict[str, tuple[int, list[str]]]:
    """family -> (functions with machine code for the GPU, the archs they are for)."""
    out: dict[str, tuple[int, list[str]]] = {}
    for arch, names in code.sass.items():
        if not runs_on(arch, major, minor):
            continue
        for name in names:
            count, archs = out.get(family_of(name), (0, []))
            out[family_of(name)] = (count + 1, sorted({*archs, arch}))
    return out


def device_findings(
    wheel_name: str,
    new: dict[str, DeviceCode],
    old: dict[str, DeviceCode] | None,
    gpus: dict[str, list[int]],
) -> tuple[list[LibraryRow], list[DeviceFinding]]:
    """A row per library and GPU, and a finding per family that lost (or gained) machine code
    for a GPU against the old release, or per library that has none for it at all."""
    rows: list[LibraryRow] = []
    findings: list[DeviceFinding] = []
    libraries = sorted({*new, *(old or {})})
    for gpu, (major, minor) in gpus.items():
        for library in libraries:
            code, before = new.get(library), (old or {}).get(library)
            where = f"{wheel_name}!{library}"
            rows.append(
                LibraryRow(
                    library,
                    gpu,
                    sorted(a for a, n in code.sass.items() if n) if code else [],
                    sorted(code.ptx) if code else [],
                    _on_gpu(code, major, minor) if code else "(library removed)",
                    _on_gpu(before, major, minor) if old is not None else "-",
                )
            )
            if code is None:
                text = f"library removed (it had {_on_gpu(before, major, minor)} for {gpu})"
                findings.append(DeviceFinding(library, "*", gpu, 0, text, where))
                continue
            now = _families(code, major, minor)
            then = _families(before, major, minor) if before else {}
            jit = [a for a in sorted(code.ptx) if runs_on(a, major, minor)]
            remains = (
                f"PTX {', '.join(jit)} remains: driver JIT at first use"
                if jit
                else f"no PTX for {gpu} either: its kernels cannot run there"
            )
            kind = " MoE" if "moe" in library.lower() else ""
            for family in sorted({*now, *then} - {OTHER}):
                had, archs = then.get(family, (0, []))
                has, _ = now.get(family, (0, []))
                if had and not has:
                    text = (
                        f"lost {'/'.join(archs)} machine code: {had} functions of "
                        f"{family}{kind}; {remains}"
                    )
                    findings.append(DeviceFinding(library, family, gpu, had, text, where))
                elif has and not had and before is not None:
                    text = f"gained machine code for {gpu}: {has} functions of {family}{kind}"
                    findings.append(DeviceFinding(library, family, gpu, -has, text, where))
            if not now and (before is None or not then):
                text = f"no machine code for {gpu} (as in the stack's release); {remains}"
                if before is None and old is not None:
                    text = f"new library without machine code for {gpu}; {remains}"
                findings.append(DeviceFinding(library, "*", gpu, 0, text, where))
    return rows, findings
