"""One host probe (builder/engine/hostprobe.py) answers every "is there a GPU here?": doctor's
findings and the smoke's GPU gate read the same facts, so they cannot disagree."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from builder.engine.hostprobe import (
    Probe,
    cdi_specs,
    gather,
    gpu_containers_without_gpus,
    gpu_missing_reason,
    toolkit_candidate,
)
from builder.engine.protocol import EngineHost
from builder.errors import ToolMissing
from builder.hosts.hostcheck import check, requirements_for, setup_findings
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


# --- the toolkit's set-up: its repository, CDI specs, GPU containers that lost their GPUs -------

#: `apt-cache policy nvidia-container-toolkit` on Debian 12 without NVIDIA's repository (it
#: prints nothing, exit 0), with a list that names it but no candidate, and with the repository.
NO_PACKAGE = ""
NO_CANDIDATE = "nvidia-container-toolkit:\n  Installed: (none)\n  Candidate: (none)\n"
FROM_NVIDIA = (
    "nvidia-container-toolkit:\n  Installed: (none)\n  Candidate: 1.17.8-1\n  Version table:\n"
    "     1.17.8-1 500\n        500 https://nvidia.github.io/libnvidia-container/stable/deb"
    "/amd64  Packages\n"
)


def _apt(policy: str, tmp_path: Path, *, cdi: bool = False) -> Probe:
    folder = tmp_path / "cdi"
    folder.mkdir(exist_ok=True)
    if cdi:
        (folder / "nvidia.yaml").write_text("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\n")

    def run(argv: Sequence[str]) -> tuple[int, str]:
        return (0, policy) if argv[0] == "apt-cache" else (0, H200)

    def which(name: str) -> str | None:
        return f"/usr/bin/{name}" if name in ("apt-cache", "nvidia-smi") else None

    return Probe(run=run, which=which, cdi_dirs=(folder,))


@pytest.mark.parametrize(
    ("policy", "candidate"), [(NO_PACKAGE, False), (NO_CANDIDATE, False), (FROM_NVIDIA, True)]
)
def test_a_missing_toolkit_repository_is_named_with_nvidia_s_step(
    tmp_path: Path, policy: str, candidate: bool
) -> None:
    probe = _apt(policy, tmp_path)
    assert toolkit_candidate(probe) is candidate
    facts = gather(_NoRuntimesEngine(), None, probe)  # type: ignore[arg-type]
    named = [f for f in setup_findings(facts, candidate, [], []) if f.name == "toolkit repository"]
    if candidate:
        assert not named, "the repository is there: the runtime finding says what to run"
        return
    (finding,) = named
    assert not finding.ok and "NVIDIA's apt repository is not added" in finding.detail
    assert "nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list" in (
        finding.fix
    )
    assert "apt-get install -y nvidia-container-toolkit" in finding.fix


def test_cdi_specs_are_named_or_their_command_given(tmp_path: Path) -> None:
    without = _apt(FROM_NVIDIA, tmp_path)
    facts = gather(_NoRuntimesEngine(), None, without)  # type: ignore[arg-type]
    (cdi,) = [f for f in setup_findings(facts, True, [], []) if f.name == "cdi"]
    assert (
        cdi.ok and not cdi.warn and "podman" in cdi.detail and "needs none" in cdi.detail
    ), "Docker with the NVIDIA runtime needs no CDI spec: not a warning on every Docker host"
    assert "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in cdi.fix
    specs = [str(p) for p in cdi_specs(_apt(FROM_NVIDIA, tmp_path, cdi=True))]
    assert specs == [str(tmp_path / "cdi" / "nvidia.yaml")]
    (named,) = [f for f in setup_findings(facts, True, specs, []) if f.name == "cdi"]
    assert named.ok and not named.warn and "nvidia.yaml" in named.detail
    assert not [f for f in setup_findings(facts, True, None, []) if f.name == "cdi"], "remote"


class _Running:
    """A container as `docker inspect` shows it, and what nvidia-smi says in it."""

    def __init__(self, name: str, host_config: dict[str, Any], smi: tuple[int, str]) -> None:
        self.name = name
        self.attrs = {"State": {"Status": "running"}, "HostConfig": host_config}
        self._smi = smi

    def exec(self, argv: list[str]) -> tuple[int, str]:
        assert argv == ["nvidia-smi", "-L"]
        return self._smi


class _Containers:
    def __init__(self, *containers: _Running) -> None:
        self._containers = containers

    def containers(self, **_: Any) -> list[_Running]:
        return list(self._containers)


def test_gpu_containers_that_lost_their_gpus_are_named_with_nvidia_s_remedy() -> None:
    gpus = {"DeviceRequests": [{"Driver": "nvidia", "Capabilities": [["gpu"]]}]}
    lost = (255, "Failed to initialize NVML: Unknown Error\n")
    engine = _Containers(
        _Running("lost-one", gpus, lost),
        _Running("fine", gpus, (0, "GPU 0: NVIDIA H200 (UUID: GPU-1)\n")),
        _Running("cdi-lost", {"Devices": [{"PathOnHost": "nvidia.com/gpu=all"}]}, lost),
        _Running("cpu-only", {}, lost),  # given no GPU: not judged
        _Running("no-smi", gpus, (127, "exec: nvidia-smi: not found")),
    )
    names = gpu_containers_without_gpus(engine)  # type: ignore[arg-type]
    assert names == ["lost-one", "cdi-lost"]
    facts = gather(_NoRuntimesEngine(), None, _apt(FROM_NVIDIA, Path("/nonexistent")))  # type: ignore[arg-type]
    (finding,) = [f for f in setup_findings(facts, True, None, names) if f.name == "gpu containers"]
    assert not finding.ok and "lost-one, cdi-lost" in finding.detail
    assert "daemon-reload" in finding.detail
    assert "nvidia-ctk system create-dev-char-symlinks --create-all" in finding.fix
