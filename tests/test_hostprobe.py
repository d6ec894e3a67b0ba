"""One host probe (builder/engine/hostprobe.py) answers every "is there a GPU here?": doctor's
findings and the smoke's GPU gate read the same facts, so they cannot disagree."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from builder.engine.hostprobe import Probe, gather, gpu_missing_reason
from builder.engine.protocol import EngineHost
from builder.errors import ToolMissing
from builder.hosts.hostcheck import check, requirements_for
from builder.verify import gpu_gate

#: The one GPU query's answer (builder.engine.hostprobe.GPU_QUERY) on an H200.
H200 = "0, 00000000:00:06.0, 580.159.04, 9.0, NVIDIA H200\n"


class _NoRuntimesEngine:
    """An engine that answers `docker info` with no nvidia runtime (CDI needs none)."""

    def host(self) -> EngineHost:
        return EngineHost(None, None, None, None, None, runtimes=("io.containerd.runc.v2", "runc"))


def _host(tmp_path: Path, *, smi: str | None, cdi: bool, hooks: Sequence[str] = ()) -> Probe:
    folder = tmp_path / "cdi"
    folder.mkdir(exist_ok=True)
    if cdi:
        (folder / "nvidia.yaml").write_text("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\n")

    def which(name: str) -> str | None:
        if name == "nvidia-smi":
            return "/usr/bin/nvidia-smi" if smi is not None else None
        return f"/usr/bin/{name}" if name in hooks else None

    return Probe(run=lambda argv: (0, smi or ""), which=which, cdi_dirs=(folder,))


def _doctor_ok(probe: Probe) -> bool:
    facts = gather(_NoRuntimesEngine(), None, probe)  # type: ignore[arg-type]
    needs = requirements_for(["sm90"], None)
    return all(f.ok for f in check(facts, needs) if f.name in ("gpu", "runtime", "driver"))


def test_cdi_only_host_passes_doctor_and_the_smoke_gate_alike(tmp_path: Path) -> None:
    probe = _host(tmp_path, smi=H200, cdi=True)
    facts = gather(_NoRuntimesEngine(), None, probe)  # type: ignore[arg-type]
    assert facts.runtime == (f"CDI specs in {tmp_path / 'cdi'}",)
    assert gpu_missing_reason(facts) is None
    assert _doctor_ok(probe)
    engine = _NoRuntimesEngine()
    assert gpu_gate.gpu_gate(engine, require_gpu=True, probe=probe) is None  # type: ignore[arg-type]


def test_host_without_runtime_fails_both(tmp_path: Path) -> None:
    probe = _host(tmp_path, smi=H200, cdi=False)
    assert not _doctor_ok(probe)
    engine = _NoRuntimesEngine()
    message = gpu_gate.gpu_gate(engine, require_gpu=False, probe=probe)  # type: ignore[arg-type]
    assert message is not None and "cannot give containers a GPU" in message
    with pytest.raises(ToolMissing, match="--require-gpu"):
        gpu_gate.gpu_gate(engine, require_gpu=True, probe=probe)  # type: ignore[arg-type]


def test_hook_only_host_and_gpu_less_host(tmp_path: Path) -> None:
    hooked = _host(tmp_path, smi=H200, cdi=False, hooks=("nvidia-container-runtime-hook",))
    assert _doctor_ok(hooked)
    assert gpu_gate.gpu_gate(_NoRuntimesEngine(), require_gpu=True, probe=hooked) is None  # type: ignore[arg-type]
    (tmp_path / "bare").mkdir()
    bare = _host(tmp_path / "bare", smi=None, cdi=True)
    assert not _doctor_ok(bare)
    reason = gpu_missing_reason(gather(_NoRuntimesEngine(), None, bare))  # type: ignore[arg-type]
    assert reason is not None and reason.startswith("no NVIDIA GPU on this host")
