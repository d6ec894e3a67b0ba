"""What a host has for GPU containers, probed once, in one place: NVIDIA driver and GPUs
(one nvidia-smi query, one record), and how the engine can hand GPUs to a container (a
registered nvidia runtime, the NVIDIA Container Toolkit's hook, CDI specs); and the raw readings
of the GPUs' PCIe topology that `doctor`'s tensor-parallel checks parse and judge
(builder/hosts/topology/).

Every command that asks "is there a GPU here?" (`doctor`, `drift`, `test --require-gpu`, the
smoke, the fleet gate) asks this module, so no two of them can disagree (a CDI-only host once
passed `doctor` and failed `test --require-gpu`). It is the only module that looks at devices;
tests/test_layering.py holds it to that. Probing runs commands, so it happens only when a
command asks, never at import time; the runner is an argument so that tests fake a host, and
an ssh runner probes a remote one.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from builder.engine.address import is_local, is_ssh, ssh_destination
from builder.engine.protocol import Engine, nvidia_runtimes
from builder.errors import EngineError

#: Runs argv, returns (exit status, stdout); raises OSError when the program is missing.
Runner = Callable[[Sequence[str]], tuple[int, str]]
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
SSH_TIMEOUT_S = 30
RUNTIME_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-toolkit", "nvidia-ctk")
#: NVIDIA's apt repository for the toolkit, as its install guide adds it
#: (docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html: curl
#: and gnupg2 first, its prerequisites, since a minimal install has no gpg): neither Debian nor
#: Ubuntu packages nvidia-container-toolkit ("E: Unable to locate package" without it).
TOOLKIT_REPOSITORY = (
    "apt-get update && apt-get install -y --no-install-recommends curl gnupg2; "
    "curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey | gpg --dearmor -o "
    "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg; curl -s -L "
    "https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list | "
    "sed 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg]"
    " https://#g' > /etc/apt/sources.list.d/nvidia-container-toolkit.list; apt-get update"
)
RUNTIME_FIX = (
    "install the NVIDIA Container Toolkit from NVIDIA's apt repository (docs/gpu-host.md, step "
    "1: its key and list, then `apt-get install nvidia-container-toolkit`), then "
    "`nvidia-ctk runtime configure --runtime=docker` and restart dockerd (live-restore on "
    "first keeps running containers)"
)
CDI_FIX = "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml (again after a driver upgrade)"
#: What nvidia-smi prints in a container whose GPUs were taken away (NVIDIA's known issue: a
#: `systemctl daemon-reload` under the systemd cgroup driver).
NVML_LOST = "Failed to initialize NVML"


@dataclass(frozen=True)
class Gpu:
    """One GPU as the one query (GPU_QUERY) lists it: what doctor, the smoke's gate and warm's
    key read, and where the topology checks find it on the PCI tree."""

    index: int
    name: str
    #: Compute capability as nvidia-smi prints it, e.g. "12.0".
    capability: str
    #: domain:bus:device.function, lower case, as lspci -D prints it: 0000:41:00.0 (empty only
    #: for a GPU written by hand, never for one nvidia-smi listed).
    bus_id: str = ""


@dataclass(frozen=True)
class GpuList:
    """What the one GPU query returned: the driver and the GPUs, or why there is no list."""

    driver: str | None
    gpus: tuple[Gpu, ...]
    #: Why nvidia-smi gave no list (not on PATH, failed, printed something else); None: it did.
    error: str | None


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


def probe_for(address: str | None) -> Probe:
    """How the facts of an engine's host are read: here for a local socket; over ssh, with this
    machine's ssh client, for an ssh:// engine; for a tcp:// engine nothing but the engine can
    be asked, and the probe says so rather than read this machine's devices instead."""
    if address is None or is_local(address):
        return Probe()
    if not is_ssh(address):
        return Probe(run=lambda argv: (127, ""), which=lambda name: None, cdi_dirs=())
    destination, port = ssh_destination(address)
    ssh = ["ssh", "-o", "BatchMode=yes", *(["-p", port] if port else []), destination, "--"]

    def run(argv: Sequence[str]) -> tuple[int, str]:
        try:
            result = subprocess.run(
                [*ssh, shlex.join(argv)], capture_output=True, text=True, timeout=SSH_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return 124, f"{argv[0]} on {destination} timed out"
        return result.returncode, result.stdout + result.stderr

    def which(program: str) -> str | None:
        status, out = run(["sh", "-c", f"command -v {shlex.quote(program)}"])
        return (out.strip() or None) if status == 0 else None

    # CDI specs are files on that host; its engine's runtimes and hooks say enough here.
    return Probe(run=run, which=which, cdi_dirs=())


def gather(
    engine: Engine | None, engine_error: str | None, probe: Probe | None = None
) -> HostFacts:
    """Ask nvidia-smi, the engine and the file system what this host has."""
    probe = probe or probe_for(getattr(engine, "address", None))
    listed = list_gpus(probe)
    gpu_error = listed.error or (None if listed.gpus else "nvidia-smi lists no GPU")
    runtime, runtime_error = _engine_runtimes(engine)
    runtime += [f"hook {h}" for h in RUNTIME_HOOKS if probe.which(h)]
    for folder in probe.cdi_dirs:
        if folder.is_dir() and any("nvidia" in p.name for p in folder.iterdir()):
            runtime.append(f"CDI specs in {folder}")
    return HostFacts(
        listed.driver, listed.gpus, gpu_error, tuple(runtime), engine_error, runtime_error
    )


def gpu_missing_reason(facts: HostFacts) -> str | None:
    """Why a GPU container cannot start on this host, or None when it can: the one answer
    the smoke's gate and doctor's findings both give."""
    if not facts.gpus:
        return f"no NVIDIA GPU on this host ({facts.gpu_error or 'nvidia-smi lists no GPU'})"
    if facts.runtime:
        return None
    if facts.runtime_error is not None:
        return f"the Docker engine did not say which runtimes it has ({facts.runtime_error})"
    return (
        "the Docker engine cannot give containers a GPU (no nvidia runtime, no NVIDIA "
        f"Container Toolkit hook, no CDI spec): {RUNTIME_FIX}"
    )


def _engine_runtimes(engine: Engine | None) -> tuple[list[str], str | None]:
    """The engine's NVIDIA runtimes, or why it could not say (not the same as none)."""
    if engine is None:
        return [], None
    try:
        return [f"runtime {name}" for name in nvidia_runtimes(engine)], None
    except EngineError as exc:
        return [], exc.explanation


def _run(argv: Sequence[str]) -> tuple[int, str]:
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} timed out"
    return result.returncode, result.stdout + result.stderr


# --- the GPUs: one query, one parser, for the facts above and the topology checks -------------

#: Every GPU field any command reads, in one call; the name last, so a comma in it is kept.
GPU_QUERY = (
    "nvidia-smi",
    "--query-gpu=index,pci.bus_id,driver_version,compute_cap,name",
    "--format=csv,noheader,nounits",
)


def list_gpus(probe: Probe) -> GpuList:
    """The probed host's GPUs, or why they could not be listed (recorded, never raised): the
    one answer gather's facts and the topology checks (builder/hosts/topology/) both read."""
    out, why = output(probe, GPU_QUERY)
    if out is None:
        return GpuList(None, (), why)
    try:
        driver, gpus = parse_gpu_query(out)
    except ValueError as exc:
        return GpuList(None, (), str(exc))
    return GpuList(driver, gpus, None)


def parse_gpu_query(text: str) -> tuple[str | None, tuple[Gpu, ...]]:
    """GPU_QUERY's lines as (driver, GPUs); ValueError for a line that is not one (nvidia-smi
    prints "No devices were found" and the like on stdout)."""
    driver: str | None = None
    gpus: list[Gpu] = []
    for line in text.strip().splitlines():
        parts = [part.strip() for part in line.split(",", 4)]
        if len(parts) != 5 or not parts[0].isdigit() or ":" not in parts[1]:
            raise ValueError(f"unexpected nvidia-smi output: {line[:120]!r}")
        driver = parts[2]
        gpus.append(Gpu(int(parts[0]), parts[4], parts[3], normal_bus_id(parts[1])))
    return driver, tuple(gpus)


def normal_bus_id(bus_id: str) -> str:
    """A bus ID as nvidia-smi prints it (00000000:41:00.0) as lspci -D does: 0000:41:00.0."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        raise ValueError(f"unexpected PCI bus ID: {bus_id!r}")
    return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"


# --- the GPUs' PCIe topology, as the host prints it (parsed in builder/hosts/topology/) --------

#: The GPU x GPU link matrix (PIX, NODE, SYS, NV# ...).
TOPO_LINKS = ("nvidia-smi", "topo", "-m")
#: Peer-to-peer read and write capability matrices (OK, CNS, GNS, TNS, NS ...).
TOPO_P2P_READ = ("nvidia-smi", "topo", "-p2p", "r")
TOPO_P2P_WRITE = ("nvidia-smi", "topo", "-p2p", "w")
#: Every PCI function with its capabilities (ACS control on the bridges; root sees them all).
LSPCI = ("lspci", "-D", "-vvv")


def output(probe: Probe, argv: Sequence[str]) -> tuple[str | None, str | None]:
    """A program's output on the probed host, or why there is none (not installed, failed to
    start, failed): recorded for the finding, never raised."""
    program = argv[0]
    if probe.which(program) is None:
        return None, f"{program} is not on PATH"
    try:
        status, out = probe.run(argv)
    except OSError as exc:
        return None, f"{program} failed to start ({exc})"
    if status != 0:
        return None, f"`{shlex.join(argv)}` exited {status}: {' '.join(out.split())[:200]}"
    return out, None


def iommu_group_types(probe: Probe, bus_ids: Sequence[str]) -> dict[str, str | None]:
    """Each PCI device's IOMMU group type (DMA, DMA-FQ, identity; kernel 5.11+), None where
    the host does not show it."""
    types: dict[str, str | None] = {}
    for bus_id in bus_ids:
        text = _read_text(probe, probe.sysfs / "bus/pci/devices" / bus_id / "iommu_group/type")
        types[bus_id] = None if text is None else text.strip()
    return types


def iommu_units(probe: Probe) -> list[str] | None:
    """The IOMMU units in /sys/class/iommu (empty: none, the IOMMU is off), None if unreadable."""
    try:
        status, out = probe.run(["ls", "-1", str(probe.sysfs / "class/iommu")])
    except OSError:
        return None
    return out.split() if status == 0 else None


def kernel_cmdline(probe: Probe) -> str | None:
    """The probed host's kernel command line (its iommu= options), None if unreadable."""
    return _read_text(probe, probe.cmdline)


def _read_text(probe: Probe, path: Path) -> str | None:
    try:
        status, out = probe.run(["cat", str(path)])
    except OSError:
        return None
    return out if status == 0 else None


# --- what the toolkit's set-up leaves (doctor's set-up findings) ----------------------------------


def toolkit_candidate(probe: Probe) -> bool | None:
    """Whether apt can install nvidia-container-toolkit here (NVIDIA's repository added), None
    where apt is not the package manager or could not say."""
    if probe.which("apt-cache") is None:
        return None
    try:
        status, out = probe.run(["apt-cache", "policy", "nvidia-container-toolkit"])
    except OSError:
        return None
    if status != 0:
        return None
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            return "(none)" not in line
    return False  # apt knows no such package: the repository is not there


def cdi_specs(probe: Probe) -> list[Path]:
    """The NVIDIA CDI spec files in the CDI folders (what podman, and the remedy for the
    daemon-reload issue, need)."""
    return [
        spec
        for folder in probe.cdi_dirs
        if folder.is_dir()
        for spec in sorted(folder.iterdir())
        if "nvidia" in spec.name
    ]


def gpu_containers_without_gpus(engine: Engine) -> list[str]:
    """The running containers given GPUs (a device request, the nvidia runtime, a CDI device)
    whose nvidia-smi fails with NVML errors: they lost their devices and must be started again.
    A container without nvidia-smi, or whose exec fails otherwise, is not judged."""
    lost = []
    for container in engine.containers():
        attrs = container.attrs
        if (attrs.get("State") or {}).get("Status") != "running" or not _given_gpus(attrs):
            continue
        try:
            status, out = container.exec(["nvidia-smi", "-L"])
        except EngineError:
            continue
        if status != 0 and NVML_LOST in out:
            lost.append(container.name)
    return lost


def _given_gpus(attrs: dict[str, object]) -> bool:
    host = attrs.get("HostConfig") or {}
    if not isinstance(host, dict):
        return False
    requests = host.get("DeviceRequests") or []
    devices = host.get("Devices") or []
    return (
        bool(requests)
        or "nvidia" in str(host.get("Runtime") or "")
        or any("nvidia.com/gpu" in str(device) for device in devices)
    )
