"""How many compile jobs fit: the build machine's memory divided by one job's peak.

One sm120 CUTLASS compile job peaks near 11 GB (fused_moe_120); on a 24 GiB machine two fit and
three get the build OOM-killed. `max_jobs: auto` asks this module at build time, per stack, from
the peak of its heaviest module (knowledge/flashinfer_modules.yaml). Nothing here runs at import.
"""

from __future__ import annotations

import os
from pathlib import Path

from builder.engine.protocol import EngineHost
from builder.manifest.resolve import ResolvedStack, jit_modules_known

#: Memory kept free for the engine, BuildKit and the rest of the machine.
RESERVE_GB = 2.0


def available_memory_gb(meminfo: Path = Path("/proc/meminfo")) -> float:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1024 * 1024)
    raise RuntimeError(f"no MemAvailable in {meminfo}")


def jobs_for(peak_gb: float, memory_gb: float, cpus: int) -> int:
    """At least one job; never more than the CPUs or than memory minus the reserve allows."""
    by_memory = int((memory_gb - RESERVE_GB) // peak_gb) if peak_gb > 0 else cpus
    return max(1, min(cpus, by_memory))


def peak_per_job_gb(stack: ResolvedStack) -> float:
    known = jit_modules_known()
    return max((known[name].peak_gb for name in stack.jit_modules), default=0.0)


def auto_max_jobs(stack: ResolvedStack, host: EngineHost) -> int:
    """Sized for the engine's machine, which runs the compiles: on this machine (a local
    socket), its available memory; on another, the memory and CPUs that engine reports (its
    total: what is free there cannot be read from here)."""
    if host.local:
        memory_gb, cpus = available_memory_gb(), host.cpus or os.cpu_count() or 1
    elif host.memory_bytes is None:
        return 1  # nothing known of that machine: the one job any machine can take
    else:
        memory_gb, cpus = host.memory_bytes / 1024**3, host.cpus or 1
    return jobs_for(peak_per_job_gb(stack), memory_gb, cpus)
