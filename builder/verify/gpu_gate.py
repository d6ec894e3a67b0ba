"""The GPU gate: whether the engine can hand a container a GPU (the host probe), and what a test
or smoke that needs one does without it (fails when --require-gpu, else says why it skips).
"""

from __future__ import annotations

from builder.engine import hostprobe
from builder.engine.hostprobe import Probe
from builder.engine.protocol import Engine
from builder.errors import ToolMissing


def gpu_missing_reason(engine: Engine, probe: Probe | None = None) -> str | None:
    """Why a GPU container cannot start on the engine's host, or None when it can: the host
    probe's answer (`engine.hostprobe`), the same one `doctor` gives."""
    return hostprobe.gpu_missing_reason(hostprobe.gather(engine, None, probe))


def gpu_available(engine: Engine, probe: Probe | None = None) -> bool:
    return gpu_missing_reason(engine, probe) is None


def gpu_gate(engine: Engine, *, require_gpu: bool, probe: Probe | None = None) -> str | None:
    """A skip message when the GPU smoke cannot run here; with require_gpu, an error instead."""
    reason = gpu_missing_reason(engine, probe)
    if reason is not None and require_gpu:
        raise ToolMissing(f"the GPU smoke is required (--require-gpu) but {reason}")
    return None if reason is None else f"GPU smoke skipped: {reason}"
