"""Host prerequisites of a GPU serving host: engine, NVIDIA driver, GPUs, container runtime.

Shared by `drift` (prerequisites are one kind of drift) and `doctor` (prerequisites alone, each
failure with its fix). The facts come from `engine.hostprobe`, the one probe every GPU question
goes through; this module only judges them against what a stack needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from builder.engine.hostprobe import CDI_DIRS, CDI_FIX, RUNTIME_FIX, TOOLKIT_REPOSITORY, HostFacts
from builder.knowledge.archflags import capabilities

DRIVER_FIX = "install the NVIDIA driver{need} (e.g. `apt-get install nvidia-driver`), then reboot"


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


def requirements_for(targets: Sequence[str], min_driver: str | None) -> Requirements:
    return Requirements(min_driver=min_driver, targets=capabilities(targets))


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


def _at_least(version: str, minimum: str) -> bool:
    try:
        return Version(version) >= Version(minimum)
    except InvalidVersion:
        return False


def _join(facts: HostFacts) -> str:
    return ", ".join(facts.runtime)


def setup_findings(
    facts: HostFacts,
    toolkit_candidate: bool | None,
    cdi_specs: Sequence[str] | None,
    lost: Sequence[str],
) -> list[Finding]:
    """What the toolkit's set-up left, judged where it matters: NVIDIA's apt repository where
    the toolkit is missing, the CDI specs (podman, and the daemon-reload remedy, need them) on a
    host with GPUs (cdi_specs None: not readable there, a remote host), and running GPU
    containers that lost their GPUs (NVML errors)."""
    findings = []
    if not facts.runtime and facts.runtime_error is None and toolkit_candidate is False:
        findings.append(
            Finding(
                "toolkit repository",
                False,
                "apt has no nvidia-container-toolkit to install: NVIDIA's apt repository is not "
                "added (neither Debian nor Ubuntu packages the toolkit)",
                TOOLKIT_REPOSITORY + "; then apt-get install -y nvidia-container-toolkit",
            )
        )
    if facts.gpus and cdi_specs is not None:
        if cdi_specs:
            findings.append(Finding("cdi", True, "CDI specs: " + ", ".join(cdi_specs)))
        else:
            findings.append(
                Finding(
                    "cdi",
                    True,
                    f"no NVIDIA CDI spec ({', '.join(str(d) for d in CDI_DIRS)}): Docker with "
                    "the NVIDIA runtime needs none; podman does for GPUs, and CDI is a remedy "
                    "for GPU containers losing their GPUs on a `systemctl daemon-reload` "
                    "(docs/gpu-host.md)",
                    CDI_FIX,
                )
            )
    if lost:
        findings.append(
            Finding(
                "gpu containers",
                False,
                f"running GPU container(s) lost their GPUs (nvidia-smi: NVML errors): "
                f"{', '.join(lost)}; the likely cause is a `systemctl daemon-reload` under the "
                "systemd cgroup driver (NVIDIA's known issue)",
                "start each again (`docker rm -f NAME`, then `sm120-stacks deploy HOST --apply` "
                "or its unit); to keep it from happening: `nvidia-ctk system "
                "create-dev-char-symlinks --create-all` (and NVIDIA's udev rule), or CDI: "
                + CDI_FIX,
            )
        )
    return findings
