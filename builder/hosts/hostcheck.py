"""Host prerequisites of a GPU serving host: engine, NVIDIA driver, GPUs, container runtime.

Shared by `verify` (prerequisites are one kind of drift) and `doctor` (prerequisites alone, each
failure with its fix). Probing runs commands, so it happens only when a command asks, never at
import time; the probe functions take their runner as an argument so tests can fake a host.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.image.engine import Engine, EngineError, nvidia_runtimes
from builder.spec.archflags import capabilities

#: Runs argv, returns (exit status, stdout); raises OSError when the program is missing.
Runner = Callable[[Sequence[str]], tuple[int, str]]
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
RUNTIME_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-toolkit", "nvidia-ctk")
DRIVER_FIX = "install the NVIDIA driver{need} (e.g. `apt-get install nvidia-driver`), then reboot"
RUNTIME_FIX = (
    "install the NVIDIA Container Toolkit (`apt-get install nvidia-container-toolkit`), then "
    "`nvidia-ctk runtime configure --runtime=docker` and restart dockerd"
)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    #: Compute capability as nvidia-smi prints it, e.g. "12.0".
    capability: str


@dataclass(frozen=True)
class HostFacts:
    driver: str | None
    gpus: tuple[Gpu, ...]
    #: Why no driver/GPU could be read (None when nvidia-smi answered).
    gpu_error: str | None
    #: NVIDIA runtimes/hooks/CDI specs found (empty: containers cannot get GPUs).
    runtime: tuple[str, ...]
    #: Why the engine could not be asked (None when it answered).
    engine_error: str | None
    #: Why the engine did not say which runtimes it has (None when it answered or was not
    #: reachable at all): with no other NVIDIA runtime found, the runtime is unknown, not absent.
    runtime_error: str | None = None


@dataclass(frozen=True)
class Requirements:
    """What a stack needs from its host: derived from the manifest, recorded in each pin."""

    min_driver: str | None
    #: Each GPU target of the stack (sm120, ...) with its compute capability (12.0, ...), paired
    #: by name: a sorted list of capabilities beside the manifest's list of targets mismatched.
    targets: dict[str, str]


@dataclass(frozen=True)
class Finding:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    #: ok, but at a cost or not fully checked: shown as a warning, not counted as missing.
    warn: bool = False
    #: Where the detail and the fix come from (URLs), for findings read from knowledge/.
    evidence: tuple[str, ...] = ()


@dataclass
class Probe:
    """How facts are gathered; defaults run on this machine.

    cmdline and sysfs are paths on the probed host, read through `run` (`cat`, `ls`), so an ssh
    runner reads that host's; tests point them at files of their own.
    """

    run: Runner = field(default=lambda argv: _run(argv))
    which: Callable[[str], str | None] = shutil.which
    cdi_dirs: tuple[Path, ...] = CDI_DIRS
    #: The kernel command line (iommu= options).
    cmdline: Path = Path("/proc/cmdline")
    #: Where sysfs is mounted (a PCI device's IOMMU group, the IOMMU units).
    sysfs: Path = Path("/sys")


def requirements_for(targets: Sequence[str], min_driver: str | None) -> Requirements:
    return Requirements(min_driver=min_driver, targets=capabilities(targets))


def gather(
    engine: Engine | None, engine_error: str | None, probe: Probe | None = None
) -> HostFacts:
    """Ask nvidia-smi, the engine and the file system what this host has."""
    probe = probe or Probe()
    driver, gpus, gpu_error = _nvidia_smi(probe)
    runtime, runtime_error = _engine_runtimes(engine)
    runtime += [f"hook {h}" for h in RUNTIME_HOOKS if probe.which(h)]
    for folder in probe.cdi_dirs:
        if folder.is_dir() and any("nvidia" in p.name for p in folder.iterdir()):
            runtime.append(f"CDI specs in {folder}")
    return HostFacts(driver, tuple(gpus), gpu_error, tuple(runtime), engine_error, runtime_error)


def check(
    facts: HostFacts, needs: Requirements | None, selected: Sequence[int] | None = None
) -> list[Finding]:
    """One finding per prerequisite: engine, driver, GPUs (capability), container runtime.

    selected: GPU indices the pin gives the container (None: all of them).
    """
    findings = [_engine(facts)]
    findings.append(_driver(facts, needs))
    findings.append(_gpus(facts, needs, selected))
    if facts.runtime:
        findings.append(Finding("runtime", True, "NVIDIA container runtime: " + _join(facts)))
    elif facts.runtime_error is not None:
        findings.append(
            Finding(
                "runtime",
                False,
                f"the Docker engine did not say which runtimes it has: {facts.runtime_error}",
                "make `docker info` answer (dockerd running and reachable), then check again",
            )
        )
    else:
        findings.append(
            Finding("runtime", False, "no NVIDIA container runtime for Docker", RUNTIME_FIX)
        )
    return findings


def _engine(facts: HostFacts) -> Finding:
    if facts.engine_error is None:
        return Finding("engine", True, "Docker engine reachable")
    return Finding(
        "engine",
        False,
        f"cannot reach the Docker engine: {facts.engine_error}",
        "start dockerd (or set DOCKER_HOST)",
    )


def _driver(facts: HostFacts, needs: Requirements | None) -> Finding:
    minimum = needs.min_driver if needs else None
    need = f" >= {minimum}" if minimum else ""
    if facts.driver is None:
        return Finding(
            "driver",
            False,
            f"no NVIDIA driver found: {facts.gpu_error}",
            DRIVER_FIX.format(need=need),
        )
    if minimum and not _at_least(facts.driver, minimum):
        return Finding(
            "driver",
            False,
            f"NVIDIA driver {facts.driver} is older than {minimum} (the CUDA version's minimum)",
            DRIVER_FIX.format(need=need),
        )
    return Finding(
        "driver", True, f"NVIDIA driver {facts.driver}" + (f" (needs{need})" * bool(need))
    )


def _gpus(facts: HostFacts, needs: Requirements | None, selected: Sequence[int] | None) -> Finding:
    if not facts.gpus:
        why = facts.gpu_error or "nvidia-smi lists no GPU"
        return Finding(
            "gpu",
            False,
            f"this machine has no NVIDIA GPU ({why})",
            "run on a host with an NVIDIA GPU; a CPU-only stack can be pinned with --gpus none",
        )
    chosen = [g for g in facts.gpus if selected is None or g.index in selected]
    absent = sorted(set(selected or ()) - {g.index for g in facts.gpus})
    if absent:
        return Finding(
            "gpu",
            False,
            f"GPU index {', '.join(map(str, absent))} does not exist here "
            f"(GPUs: {', '.join(str(g.index) for g in facts.gpus)})",
            "pin the GPUs this host has (`sm120-stacks pin HOST STACK --gpus ...`)",
        )
    described = "; ".join(f"{g.index}: {g.name} (compute {g.capability})" for g in chosen)
    if needs and needs.targets:
        wrong = [g for g in chosen if g.capability not in needs.targets.values()]
        if wrong:
            targets = ", ".join(f"{cap} ({target})" for target, cap in needs.targets.items())
            return Finding(
                "gpu",
                False,
                "; ".join(f"GPU {g.index} ({g.name}) is compute {g.capability}" for g in wrong)
                + f"; the stack targets {targets}",
                "run this stack on a GPU it was built for, or pin a stack built for this GPU",
            )
    return Finding("gpu", True, described)


def _nvidia_smi(probe: Probe) -> tuple[str | None, list[Gpu], str | None]:
    query = [
        "nvidia-smi",
        "--query-gpu=index,name,driver_version,compute_cap",
        "--format=csv,noheader,nounits",
    ]
    if probe.which("nvidia-smi") is None:
        return None, [], "nvidia-smi is not on PATH"
    try:
        status, out = probe.run(query)
    except OSError as exc:
        return None, [], f"nvidia-smi failed to start ({exc})"
    if status != 0:
        return None, [], f"nvidia-smi exited {status}: {' '.join(out.split())[:200]}"
    gpus: list[Gpu] = []
    driver: str | None = None
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            return None, [], f"unexpected nvidia-smi output: {line[:120]!r}"
        driver = parts[2]
        gpus.append(Gpu(int(parts[0]), parts[1], parts[3]))
    return driver, gpus, None if gpus else "nvidia-smi lists no GPU"


def _engine_runtimes(engine: Engine | None) -> tuple[list[str], str | None]:
    """The engine's NVIDIA runtimes, or why it could not say (not the same as none)."""
    if engine is None:
        return [], None
    try:
        return [f"runtime {name}" for name in nvidia_runtimes(engine)], None
    except EngineError as exc:
        return [], exc.explanation


def _at_least(version: str, minimum: str) -> bool:
    try:
        return Version(version) >= Version(minimum)
    except InvalidVersion:
        return False


def _join(facts: HostFacts) -> str:
    return ", ".join(facts.runtime)


def _run(argv: Sequence[str]) -> tuple[int, str]:
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} timed out"
    return result.returncode, result.stdout + result.stderr
