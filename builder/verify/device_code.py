"""Libraries in an image without machine code for the stack's GPUs: `test`'s static finding.

A CUDA library built for other GPUs runs on the stack's only where its modules carry PTX the
driver can compile, and the driver compiles it at the first start of every fresh container,
silently (vLLM 0.33's FA2 on sm120: sm_80 code and PTX only, 2,904 kernels). `test` reads the
fatbins of the image's libraries in a throwaway container of the image (verify/fatbin.py, the
standard library only, run as `python -c`), and each library that lacks machine code for a
GPU of the manifest becomes a row of the JIT table: status `driver-jit` (PTX the driver
compiles) or `no-code` (nothing that loads there). Which libraries are read, and why a known
one matters, is knowledge (knowledge/device_code.yaml).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.engine.protocol import Engine
from builder.engine.throwaway import ThrowawayFailed, run_throwaway
from builder.errors import EngineError
from builder.manifest.device_code import device_code_knowledge, gpu_targets
from builder.manifest.resolve import ResolvedStack
from builder.render.context import VENV
from builder.verify import fatbin
from builder.verify.report import CacheRow

ROW_KIND = "driver-jit"
#: Seconds the scan's container may take beyond the scan's own time bound (start, exit).
CONTAINER_SLACK_S = 60


def scan_config(stack: ResolvedStack) -> dict[str, Any]:
    """The argument of fatbin.py's scan: the knowledge's roots and patterns, the stack's GPUs."""
    scan = device_code_knowledge().scan
    return {
        "roots": scan.roots,
        "patterns": scan.patterns,
        "budget_s": scan.budget_s,
        "targets": gpu_targets(stack),
    }


def scan_command(stack: ResolvedStack, python: str = f"{VENV}/bin/python") -> list[str]:
    """argv that scans the image's libraries where its own Python runs."""
    source = Path(fatbin.__file__).read_text()
    return [python, "-c", source, json.dumps(scan_config(stack), sort_keys=True)]


def scan_image(engine: Engine, stack: ResolvedStack, image_ref: str) -> dict[str, Any]:
    """The scan's JSON, read in a throwaway container of the image (no network); a scan that
    could not run is {"error": why}, never a lost test report."""
    budget = device_code_knowledge().scan.budget_s
    try:
        finished = run_throwaway(
            engine, image_ref, scan_command(stack), timeout_s=budget + CONTAINER_SLACK_S
        )
    except EngineError as exc:  # not started, or not finished in time (the engine's timeout)
        return {"error": f"the scan did not run to its end: {exc}"[:500]}
    try:
        return finished.checked().last_json()
    except ThrowawayFailed as exc:
        return {"error": f"the scan gave no result: {exc}"[:500]}


def finding_rows(scan: dict[str, Any]) -> list[CacheRow]:
    """A JIT-table row per library and GPU it lacks machine code for: `driver-jit` where some
    of its modules carry PTX the driver compiles, `no-code` where no module loads there at all;
    one `not-scanned` row where the scan failed or ran out of time."""
    if "error" in scan:
        return [CacheRow("(device code)", [], 0, "not-scanned", scan["error"], ROW_KIND)]
    known = device_code_knowledge().known
    rows = []
    for library in scan.get("libraries", []):
        archs = library["sass"] + library["ptx"]
        for gpu, lack in sorted(library["lacking"].items()):
            name = library["relative"]
            why = known.get(name, "")
            if lack["jit_modules"]:
                detail = _jit_detail(library, gpu, lack, why)
                rows.append(CacheRow(name, archs, lack["ptx_bytes"], ROW_KIND, detail, ROW_KIND))
            elif not lack["sass_modules"]:
                kernels = _count(lack["no_code_kernels"])
                detail = f"{kernels} kernels, no {gpu} code and no PTX it takes: not loadable"
                rows.append(CacheRow(name, archs, 0, "no-code", _then(detail, why), ROW_KIND))
    rows.sort(key=lambda row: (row.status != ROW_KIND, -row.bytes, row.module))  # most PTX first
    if scan.get("unscanned"):
        detail = (
            f"{scan['unscanned']} libraries left unread when the scan's time bound "
            f"(knowledge/device_code.yaml scan.budget_s) ran out after {scan['files']}"
        )
        rows.append(CacheRow("(device code)", [], 0, "not-scanned", detail, ROW_KIND))
    return rows


def _jit_detail(library: dict[str, Any], gpu: str, lack: dict[str, Any], why: str) -> str:
    """The facts first (the table cuts details short): kernels, GPU, what the driver compiles."""
    ptx = ", ".join(lack["ptx_archs"])
    detail = (
        f"{_count(lack['kernels'])} kernels, no {gpu} code: driver JIT of {ptx} PTX at first "
        f"start ({device_code_knowledge().kind}; {lack['ptx_bytes'] / 1e6:.1f} MB of PTX, "
        f"{lack['jit_modules']} of {library['modules']} modules; CUDA_CACHE_PATH keeps it)"
    )
    return _then(detail, why)


def _count(kernels: int | None) -> str:
    return "unknown" if kernels is None else f"{kernels:,}"


def _then(detail: str, why: str) -> str:
    return f"{detail}. {' '.join(why.split())}" if why else detail


def device_code_finding(
    engine: Engine, stack: ResolvedStack, image_ref: str
) -> tuple[dict[str, Any], list[CacheRow]]:
    """The scan (the report's `device_code`) and its JIT-table rows."""
    scan = scan_image(engine, stack, image_ref)
    scan.setdefault("targets", gpu_targets(stack))
    return scan, finding_rows(scan)


__all__ = [
    "device_code_finding",
    "finding_rows",
    "scan_command",
    "scan_config",
    "scan_image",
]
