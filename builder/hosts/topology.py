"""Tensor parallelism over PCIe: what a serve on several GPUs needs from its host.

A serve whose tensor_parallel_size x pipeline_parallel_size is above 1 all-reduces between its
GPUs. Over PCIe that traffic goes peer to peer (P2P) when CUDA reports peer access; PCI Access
Control Services (ACS) redirect on the bridges between the GPUs sends it up to the root complex,
slower, and where the IOMMU translates it there it hangs. A pair whose `nvidia-smi topo -m` link
is NV# does P2P over NVLink, not PCIe: ACS and the IOMMU are not judged for it.

Read on the host through a hostcheck Probe (this machine, or over ssh for a pin's ssh:// engine;
argv lists only, never a shell string): `nvidia-smi --query-gpu` (bus IDs), `nvidia-smi topo -m`
(links), `nvidia-smi topo -p2p r` and `w` (P2P capability), `lspci -D -vvv` (ACS on the bridges),
the kernel command line, the IOMMU units and each GPU's IOMMU group type. Parsed into typed
results, then decided into hostcheck Findings; every sentence, fix and source URL they carry is
data in knowledge/pcie_p2p.yaml.
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from itertools import combinations, takewhile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from builder.errors import StackError
from builder.hosts.hostcheck import Finding
from builder.image.hostprobe import Probe
from builder.spec.knowledge import locate, parse_document, read_knowledge
from builder.spec.strict import Strict
from builder.spec.vllm_argv import has_flag, last_value
from builder.spec.yamlsafe import YamlDocument

KNOWLEDGE_FILE = "pcie_p2p.yaml"
#: vLLM's spellings of the parallel sizes (argparse: the last one given wins; `--flag=N` too).
TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")
NO_CUSTOM_ALL_REDUCE = "--disable-custom-all-reduce"
P2P_DISABLE = "NCCL_P2P_DISABLE"
#: vLLM's custom all-reduce runs over P2P only at 2 PCIe GPUs: it turns itself off for more
#: than two GPUs without NVLink (custom_all_reduce.py, "more than two PCIe-only GPUs").
CUSTOM_ALL_REDUCE_PCIE_SIZE = 2
GPU_QUERY = ("nvidia-smi", "--query-gpu=index,pci.bus_id,name", "--format=csv,noheader")
LINKS = ("nvidia-smi", "topo", "-m")
P2P_READ = ("nvidia-smi", "topo", "-p2p", "r")
P2P_WRITE = ("nvidia-smi", "topo", "-p2p", "w")
LSPCI = ("lspci", "-D", "-vvv")
GROUP_TYPES_TRANSLATED = ("DMA", "DMA-FQ")
GROUP_TYPE_IDENTITY = "identity"

Pair = tuple[int, int]
IommuMode = Literal["translated", "passthrough", "off", "unknown"]

#: `nvidia-smi topo -m`'s link of a pair joined by a bonded set of # NVLinks (its legend: NV#).
_NVLINK = re.compile(r"^NV\d+$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MATRIX_DEVICE = re.compile(r"^(GPU|NIC|NVME|NVMe)\d+$")
_GPU = re.compile(r"^GPU(\d+)$")
_PCI_HEADER = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<slot>[0-9a-fA-F]{2})"
    r"\.(?P<fn>[0-7])\s+(?P<what>.*)$"
)
_PCI_BUS = re.compile(
    r"^\s+Bus: primary=([0-9a-fA-F]{2}), secondary=([0-9a-fA-F]{2}), "
    r"subordinate=([0-9a-fA-F]{2})"
)
_ACS_CONTROL = re.compile(r"^\s+ACSCtl:\s*(?P<flags>.*)$")
_ACCESS_DENIED = "<access denied>"
_PROG_IF = re.compile(r"\s*\(prog-if .*\)\s*$")


# --- what the serve asks for -------------------------------------------------------------------


@dataclass(frozen=True)
class Serve:
    """What a serve asks of its host's GPUs: its parallel sizes, the GPUs the container gets,
    and whether it works around P2P (NCCL_P2P_DISABLE=1, --disable-custom-all-reduce)."""

    #: Who asks, for messages: "the pin of gpu-node-07", "stack vllm-0.22-marlin".
    what: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    #: GPU indices the container gets; None: all of the host's.
    gpus: tuple[int, ...] | None = None
    nccl_p2p_disabled: bool = False
    custom_all_reduce_disabled: bool = False

    @property
    def world(self) -> int:
        """GPUs the serve runs on."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def custom_all_reduce_uses_p2p(self) -> bool:
        return (
            self.tensor_parallel == CUSTOM_ALL_REDUCE_PCIE_SIZE
            and not self.custom_all_reduce_disabled
        )

    @property
    def works_around_p2p(self) -> bool:
        """NCCL kept off P2P, and vLLM's custom all-reduce too where it would use it."""
        return self.nccl_p2p_disabled and not self.custom_all_reduce_uses_p2p


@dataclass(frozen=True)
class ArgvOrigin:
    """Where the words of a serve argv were written, for errors that name the file, key and line:
    from argv[first] on, the list at `key` (a pin's `command`; a stack's serve.extra_args, after
    the words the tool derives from the manifest) of the first of docs (child first) that
    spells it out."""

    key: tuple[str, ...] = ("command",)
    first: int = 0
    docs: tuple[YamlDocument, ...] = ()

    def error(self, index: int, message: str, hint: str) -> StackError:
        """An error about argv[index]: `key.N` with N its index in that list."""
        if index < self.first:  # a word derived from a checked manifest field: no list index
            return StackError(message, key=".".join(self.key), hint=hint)
        key_path = (*self.key, index - self.first)
        file, line = None, None
        if self.docs:
            doc, line = locate(key_path, list(self.docs))
            file = doc.path
        key = ".".join(map(str, key_path))
        return StackError(message, file=file, key=key, line=line, hint=hint)


def serve_of(
    what: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    gpus: Sequence[int] | None,
    origin: ArgvOrigin | None = None,
) -> Serve:
    """The Serve of a serve command (a pin's `command`, a stack's serve argv) and its env.

    A parallel size that is not a positive whole number is bad input: a StackError naming where
    origin says the word was written (default: key command.N, no file).
    """
    origin = origin or ArgvOrigin()
    return Serve(
        what=what,
        tensor_parallel=_parallel_size(argv, TP_FLAGS, origin),
        pipeline_parallel=_parallel_size(argv, PP_FLAGS, origin),
        gpus=None if gpus is None else tuple(gpus),
        nccl_p2p_disabled=env.get(P2P_DISABLE, "").strip() == "1",
        custom_all_reduce_disabled=has_flag(argv, NO_CUSTOM_ALL_REDUCE),
    )


def _parallel_size(argv: Sequence[str], flags: tuple[str, ...], origin: ArgvOrigin) -> int:
    """The size vLLM's parser keeps (spec/vllm_argv: the last given, any spelling it takes)."""
    flag = flags[0]
    try:
        found = last_value(argv, flag, flags[1:])
    except ValueError:
        found = None  # a dangling option: vLLM refuses it at start; 1 is what would run
    if found is None:
        return 1
    value = found.value
    # str.isdigit() is true for "²" and other digits int() refuses: ASCII digits only.
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise origin.error(
            found.index,
            f"{found.spelled} {value!r} is not a number of GPUs",
            hint=f"the serve command needs {flag} N with N >= 1",
        )
    return int(value)


# --- what the host has -------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSlot:
    index: int
    #: domain:bus:device.function, lower case, as lspci -D prints it: 0000:41:00.0.
    bus_id: str
    name: str


@dataclass(frozen=True)
class PciDevice:
    """One function of `lspci -D -vvv`: its address, and for a bridge what ACS does there."""

    address: str
    description: str
    #: A bridge's (secondary, subordinate) bus numbers; None for an endpoint.
    buses: tuple[int, int] | None = None
    #: ACSCtl flags that are on (+); None: no ACS control register was shown.
    acs: frozenset[str] | None = None
    #: Its capabilities were not shown (lspci run by a user other than root).
    denied: bool = False

    @property
    def domain(self) -> str:
        return self.address.split(":")[0]

    def below(self, address: str) -> bool:
        """Whether the device at address sits on a bus behind this bridge."""
        domain, bus = _domain_bus(address)
        return (
            self.buses is not None
            and domain == self.domain
            and self.buses[0] <= bus <= self.buses[1]
            and address != self.address
        )


@dataclass(frozen=True)
class Iommu:
    mode: IommuMode
    #: How that was told: the GPUs' group types, the kernel command line, the units present.
    how: str


@dataclass(frozen=True)
class HostTopology:
    """What the host says, each part with why it could not be read (None: it was)."""

    gpus: tuple[GpuSlot, ...] = ()
    gpus_error: str | None = None
    links: Mapping[Pair, str] | None = None
    links_error: str | None = None
    p2p_read: Mapping[Pair, str] | None = None
    p2p_write: Mapping[Pair, str] | None = None
    p2p_error: str | None = None
    pci: Mapping[str, PciDevice] | None = None
    pci_error: str | None = None
    iommu: Iommu = field(default_factory=lambda: Iommu("unknown", "not read"))


def read_topology(probe: Probe) -> HostTopology:
    """Ask the host through probe; a missing program or an unreadable file is recorded, never
    raised."""
    listed, gpus_error = _output(probe, GPU_QUERY)
    if listed is None:
        return HostTopology(gpus_error=gpus_error)
    try:
        gpus = parse_gpus(listed)
    except ValueError as exc:
        return HostTopology(gpus_error=str(exc))
    links, links_error = _matrix(probe, LINKS)
    read, read_error = _matrix(probe, P2P_READ)
    write, write_error = _matrix(probe, P2P_WRITE)
    lspci, pci_error = _output(probe, LSPCI)
    return HostTopology(
        gpus=gpus,
        links=links,
        links_error=links_error,
        p2p_read=read,
        p2p_write=write,
        p2p_error=read_error or write_error,
        pci=None if lspci is None else parse_lspci(lspci),
        pci_error=pci_error,
        iommu=_iommu(probe, [gpu.bus_id for gpu in gpus]),
    )


def _output(probe: Probe, argv: Sequence[str]) -> tuple[str | None, str | None]:
    """A program's output, or why there is none (not installed, failed to start, failed)."""
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


def _matrix(probe: Probe, argv: Sequence[str]) -> tuple[dict[Pair, str] | None, str | None]:
    out, why = _output(probe, argv)
    if out is None:
        return None, why
    try:
        return parse_matrix(out), None
    except ValueError as exc:
        return None, f"`{shlex.join(argv)}`: {exc}"


def _read_file(probe: Probe, path: Path) -> str | None:
    try:
        status, out = probe.run(["cat", str(path)])
    except OSError:
        return None
    return out if status == 0 else None


def _iommu(probe: Probe, bus_ids: Sequence[str]) -> Iommu:
    types: dict[str, str | None] = {}
    for bus_id in bus_ids:
        text = _read_file(probe, probe.sysfs / "bus/pci/devices" / bus_id / "iommu_group/type")
        types[bus_id] = None if text is None else text.strip()
    try:
        status, out = probe.run(["ls", "-1", str(probe.sysfs / "class/iommu")])
        units = out.split() if status == 0 else None
    except OSError:
        units = None
    return iommu_mode(types, units, _read_file(probe, probe.cmdline))


# --- parsing -----------------------------------------------------------------------------------


def parse_gpus(text: str) -> tuple[GpuSlot, ...]:
    """`nvidia-smi --query-gpu=index,pci.bus_id,name --format=csv,noheader` lines."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [part.strip() for part in line.split(",", 2)]
        if len(parts) != 3 or not parts[0].isdigit() or ":" not in parts[1]:
            raise ValueError(f"unexpected nvidia-smi output: {line[:120]!r}")
        gpus.append(GpuSlot(int(parts[0]), normal_bus_id(parts[1]), parts[2]))
    return tuple(gpus)


def normal_bus_id(bus_id: str) -> str:
    """nvidia-smi's 00000000:41:00.0 as lspci -D prints it: 0000:41:00.0."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        raise ValueError(f"unexpected PCI bus ID: {bus_id!r}")
    return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"


def parse_matrix(text: str) -> dict[Pair, str]:
    """The GPU x GPU cells of an `nvidia-smi topo -m` or `topo -p2p` matrix: (row GPU, column
    GPU) -> its code (PIX, NODE, SYS, NV4 ...; OK, CNS, GNS, TNS, NS ...; X on the diagonal).
    NIC/NVMe rows and columns, the affinity columns and the legend are skipped."""
    columns: list[str] = []
    cells: dict[Pair, str] = {}
    for line in text.splitlines():
        words = _ANSI.sub("", line).split()
        if not words:
            continue
        if not columns:
            if _MATRIX_DEVICE.match(words[0]) and (
                len(words) == 1 or _MATRIX_DEVICE.match(words[1]) or words[1] == "CPU"
            ):
                columns = list(takewhile(_MATRIX_DEVICE.match, words))
            continue
        if words[0].startswith("Legend"):
            break
        row = _GPU.match(words[0])
        if row is None:
            continue
        for column, value in zip(columns, words[1 : 1 + len(columns)], strict=False):
            match = _GPU.match(column)
            if match is not None:
                cells[(int(row.group(1)), int(match.group(1)))] = value
    if not columns:
        raise ValueError("no GPU matrix in its output")
    return cells


def parse_lspci(text: str) -> dict[str, PciDevice]:
    """Every function of `lspci -D -vvv` by address; bridges with their bus range and ACS
    control flags (run by root: capabilities of others read `<access denied>`)."""
    devices: dict[str, PciDevice] = {}
    current: PciDevice | None = None
    for line in text.splitlines():
        header = _PCI_HEADER.match(line)
        if header is not None:
            if current is not None:
                devices[current.address] = current
            domain = (header.group("domain") or "0000").lower()[-4:].rjust(4, "0")
            address = (
                f"{domain}:{header.group('bus')}:{header.group('slot')}.{header.group('fn')}"
            ).lower()
            current = PciDevice(address, _PROG_IF.sub("", header.group("what")).strip())
            continue
        if current is None:
            continue
        bus = _PCI_BUS.match(line)
        if bus is not None:
            current = replace(current, buses=(int(bus.group(2), 16), int(bus.group(3), 16)))
        elif _ACCESS_DENIED in line and "Capabilities" in line:
            current = replace(current, denied=True)
        else:
            acs = _ACS_CONTROL.match(line)
            if acs is not None:
                flags = acs.group("flags").split()
                current = replace(current, acs=frozenset(f[:-1] for f in flags if f.endswith("+")))
    if current is not None:
        devices[current.address] = current
    return devices


def ancestors(devices: Mapping[str, PciDevice], address: str) -> list[PciDevice]:
    """The bridges above the device at address, nearest first."""
    above = [device for device in devices.values() if device.below(address)]
    return sorted(above, key=lambda d: (d.buses or (0, 0))[1] - (d.buses or (0, 0))[0])


def bridges_between(devices: Mapping[str, PciDevice], a: str, b: str) -> list[PciDevice]:
    """The bridges P2P between a and b enters: those above one of them and not the other (the
    switch downstream ports of a pair under one switch; every port up to the root ports of a
    pair under different root ports)."""
    above_a, above_b = ancestors(devices, a), ancestors(devices, b)
    return [d for d in above_a if d not in above_b] + [d for d in above_b if d not in above_a]


def kernel_iommu(cmdline: str) -> tuple[IommuMode | None, str]:
    """What the kernel command line says of the IOMMU, and the words that say it: off
    (iommu=off, intel_iommu=off, amd_iommu=off), else passthrough or translated as the last of
    iommu=pt|nopt / iommu.passthrough=1|0 says, else translated when intel_iommu=on or
    amd_iommu=on turn it on; None when it says nothing."""
    off = enabled = False
    passthrough: bool | None = None
    said: list[str] = []
    for word in cmdline.split():
        key, _, value = word.partition("=")
        options = value.split(",")
        if key in ("iommu", "intel_iommu", "amd_iommu") and "off" in options:
            off = True
        elif key == "iommu" and value in ("pt", "nopt"):
            passthrough = value == "pt"
        elif key == "iommu.passthrough" and value in ("0", "1"):
            passthrough = value == "1"
        elif key in ("intel_iommu", "amd_iommu") and "on" in options:
            enabled = True
        else:
            continue
        said.append(word)
    words = " ".join(said)
    if off:
        return "off", words
    if passthrough is not None:
        return ("passthrough" if passthrough else "translated"), words
    return ("translated" if enabled else None), words


def iommu_mode(
    group_types: Mapping[str, str | None], units: Sequence[str] | None, cmdline: str | None
) -> Iommu:
    """How the IOMMU treats the GPUs' DMA: each GPU's IOMMU group type when the kernel shows it
    (5.11+); else no IOMMU unit in /sys/class/iommu is off; else the kernel command line."""
    known = {bus_id: kind for bus_id, kind in group_types.items() if kind}
    if known:
        shown = ", ".join(f"{bus_id}: {kind}" for bus_id, kind in sorted(known.items()))
        how = f"IOMMU group type {shown}"
        if any(kind in GROUP_TYPES_TRANSLATED for kind in known.values()):
            return Iommu("translated", how)
        if all(kind == GROUP_TYPE_IDENTITY for kind in known.values()):
            return Iommu("passthrough", how)
        return Iommu("unknown", how)
    if units is not None and not units:
        return Iommu("off", "no IOMMU unit in /sys/class/iommu")
    kernel, said = kernel_iommu(cmdline or "")
    how = f"kernel command line: {said or 'no iommu option'}"
    if units:
        how = f"IOMMU units {', '.join(units)}; {how}"
        if kernel == "off":  # units present: it is on whatever the words say
            kernel = None
    if kernel is None:
        return Iommu("unknown", f"no IOMMU group type readable; {how}")
    return Iommu(kernel, how)


def _domain_bus(address: str) -> tuple[str, int]:
    parts = address.split(":")
    return parts[0], int(parts[1], 16)


# --- field knowledge ---------------------------------------------------------------------------


class Source(Strict):
    url: str = Field(pattern=r"^https://\S+$")
    #: What the source establishes, paraphrased.
    says: str


class Status(Strict):
    """One code of the `nvidia-smi topo -p2p` legend."""

    meaning: str
    consequence: str = ""
    fix: str = ""
    evidence: list[str] = Field(default_factory=list)


class Advice(Strict):
    detail: str
    fix: str = ""
    evidence: list[str] = Field(default_factory=list)


class Workaround(Strict):
    how: str
    cost: str
    evidence: list[str] = Field(default_factory=list)


class PcieKnowledge(Strict):
    #: The `topo -p2p` legend, OK first, then from the most to the least severe: a pair whose
    #: read and write matrices differ is reported under the more severe of its two codes.
    p2p_status: dict[str, Status]
    acs_redirect_flags: list[str]
    setpci: str
    workaround: Workaround
    advice: dict[str, Advice]
    sources: dict[str, Source]

    def urls(self, keys: Sequence[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.sources[key].url for key in keys))

    def severity(self, code: str) -> int:
        """How severe a `topo -p2p` code is, 0 the most: its place in p2p_status; a code the
        file does not know ranks as U (Unknown), whose wording it gets."""
        order = list(self.p2p_status)
        return order.index(code if code in order else "U")

    def worst(self, codes: set[str]) -> str | None:
        """The most severe of codes other than OK (None: all OK)."""
        refused = codes - {"OK"}
        return min(refused, key=lambda c: (self.severity(c), c)) if refused else None

    def finding(
        self, name: str, key: str, ok: bool = True, warn: bool = False, **fields: Any
    ) -> Finding:
        """The finding advice `key` words, its templates filled with fields."""
        advice = self.advice[key]
        fix = advice.fix.format(**fields) if advice.fix and (not ok or warn) else ""
        return Finding(
            name,
            ok,
            advice.detail.format(**fields),
            fix,
            warn=warn,
            evidence=self.urls(advice.evidence),
        )


#: The fields each advice's templates may use (checked when the file is read).
ADVICE_FIELDS: dict[str, frozenset[str]] = {
    key: frozenset(fields)
    for key, fields in {
        "not_applicable": {"why"},
        "no_serve": set(),
        "gpus": {"what", "needed", "gpus"},
        "gpus_missing": {"what", "needed", "tp", "pp", "have"},
        "gpus_unread": {"why"},
        "p2p_ok": {"pairs"},
        "p2p_not_ok": {"pairs", "status", "meaning", "consequence", "fix"},
        "p2p_unread": {"why"},
        "over_nvlink": {"pairs"},
        "over_pcie": {"pairs"},
        "acs_ok": {"bridges"},
        "acs_none": {"pairs"},
        "acs_redirect": {"pairs", "bridges", "setpci", "kernel_list", "workaround", "how"},
        "acs_redirect_passthrough": {"pairs", "bridges", "setpci", "kernel_list", "how"},
        "acs_unread": {"why"},
        "acs_denied": {"bridges"},
        "acs_not_needed": set(),
        "acs_nvlink": {"pairs"},
        "iommu_ok": {"how"},
        "iommu_translated": {"how", "pairs", "workaround"},
        "iommu_unknown": {"how"},
        "iommu_not_needed": set(),
        "iommu_nvlink": {"pairs", "how"},
        "workaround_in_effect": {"finding", "custom_ar", "cost"},
        "workaround_incomplete": {"finding", "fix"},
        "workaround_unneeded": set(),
    }.items()
}


@cache
def knowledge() -> PcieKnowledge:
    """knowledge/pcie_p2p.yaml, checked (read once per process)."""
    return checked_knowledge(read_knowledge(KNOWLEDGE_FILE))


def checked_knowledge(doc: YamlDocument) -> PcieKnowledge:
    """The knowledge doc holds, checked beyond its schema: every advice the code asks for, only
    the template fields the code fills, every evidence key a source, the OK and U statuses."""
    parsed = parse_document(doc, PcieKnowledge)

    def wrong(message: str, *key: str | int) -> StackError:
        return StackError(
            message, file=doc.path, key=".".join(map(str, key)), line=doc.line_of(key)
        )

    for key, allowed in ADVICE_FIELDS.items():
        advice = parsed.advice.get(key)
        if advice is None:
            raise wrong("missing advice", "advice", key)
        for part in ("detail", "fix"):
            used = {name for _, name, _, _ in string.Formatter().parse(getattr(advice, part))}
            unknown = sorted(name for name in used - allowed if name is not None)
            if unknown:
                raise wrong(f"unknown template field {{{unknown[0]}}}", "advice", key, part)
    cited = [("workaround", parsed.workaround.evidence)]
    cited += [(f"advice.{k}", a.evidence) for k, a in parsed.advice.items()]
    cited += [(f"p2p_status.{k}", s.evidence) for k, s in parsed.p2p_status.items()]
    for where, keys in cited:
        for key in keys:
            if key not in parsed.sources:
                raise wrong(f"evidence {key!r} is not a source", *where.split("."), "evidence")
    for status in ("OK", "U"):
        if status not in parsed.p2p_status:
            raise wrong(f"the {status} status is missing", "p2p_status")
    return parsed


# --- deciding ----------------------------------------------------------------------------------


def not_checked(gpus: int, k: PcieKnowledge | None = None) -> list[Finding]:
    """doctor without a pin or a stack, on a host with this many GPUs: no serve to check."""
    k = k or knowledge()
    if gpus < 2:
        why = f"this host has {'no' if gpus == 0 else 'one'} GPU"
        return [k.finding("tp", "not_applicable", why=why)]
    return [k.finding("tp", "no_serve")]


def check(serve: Serve, probe: Probe, k: PcieKnowledge | None = None) -> list[Finding]:
    """The tensor-parallel findings of serve on the host probe reads (read only when the serve
    runs on more than one GPU)."""
    k = k or knowledge()
    if serve.world == 1:
        why = f"{serve.what} serves on one GPU (tensor parallel 1 x pipeline parallel 1)"
        return [k.finding("tp", "not_applicable", why=why)]
    return decide(serve, read_topology(probe), k)


def decide(serve: Serve, host: HostTopology, k: PcieKnowledge | None = None) -> list[Finding]:
    """Findings for serve on host: its GPUs (the first tensor x pipeline parallel of those the
    pin gives it, by index; enough?), P2P between each pair, ACS on the bridges P2P between
    them crosses, the IOMMU; pairs linked by NVLink are left out of the ACS and IOMMU judgement
    (their P2P does not cross PCIe). The pin's workaround, if any, turns a failure into a
    warning with its cost."""
    k = k or knowledge()
    if host.gpus_error is not None:
        return [k.finding("tp", "gpus_unread", ok=True, warn=True, why=host.gpus_error)]
    offered = [gpu for gpu in host.gpus if serve.gpus is None or gpu.index in serve.gpus]
    chosen = offered[: serve.world]
    needed = f"{serve.world}"
    if len(chosen) < serve.world:
        have = (
            f"the pin gives it {len(offered)} of this host's {len(host.gpus)}"
            if serve.gpus is not None
            else f"this host has {len(host.gpus)}"
        )
        return [
            k.finding(
                "tp",
                "gpus_missing",
                ok=False,
                what=serve.what,
                needed=needed,
                tp=serve.tensor_parallel,
                pp=serve.pipeline_parallel,
                have=have,
            )
        ]
    names = ", ".join(f"GPU {gpu.index} ({gpu.name}, {gpu.bus_id})" for gpu in chosen)
    findings = [k.finding("tp", "gpus", what=serve.what, needed=needed, gpus=names)]
    pairs = list(combinations(sorted(chosen, key=lambda gpu: gpu.index), 2))
    p2p, used = _p2p(host, pairs, k)
    pcie = [pair for pair in used if not _over_nvlink(host, *pair)]
    nvlink = [pair for pair in used if _over_nvlink(host, *pair)]
    acs = _acs(serve, host, pcie, nvlink, k)
    iommu = _iommu_finding(serve, host, pcie, nvlink, k)
    clean = all(f.ok and not f.warn for f in (p2p, acs, iommu))
    if serve.nccl_p2p_disabled and clean:
        p2p = k.finding("tp-p2p", "workaround_unneeded", ok=True, warn=True)
    return [*findings, p2p, acs, iommu]


GpuPair = tuple[GpuSlot, GpuSlot]


def _link(host: HostTopology, a: GpuSlot, b: GpuSlot) -> str | None:
    links = host.links or {}
    return links.get((a.index, b.index)) or links.get((b.index, a.index))


def _over_nvlink(host: HostTopology, a: GpuSlot, b: GpuSlot) -> bool:
    """Whether `topo -m` links the pair by NVLink (NV#): its P2P does not cross PCIe."""
    return bool(_NVLINK.match(_link(host, a, b) or ""))


def _pair_name(host: HostTopology, a: GpuSlot, b: GpuSlot) -> str:
    link = _link(host, a, b)
    return f"GPU {a.index}-{b.index}" + (f" ({link})" if link else "")


def _pair_names(host: HostTopology, pairs: Sequence[GpuPair]) -> str:
    return ", ".join(_pair_name(host, a, b) for a, b in pairs)


def _pairs_by_link(host: HostTopology, pairs: Sequence[GpuPair], k: PcieKnowledge) -> str:
    """The pairs named, those over NVLink said to be (a host without NVLink: names alone)."""
    nvlink = [pair for pair in pairs if _over_nvlink(host, *pair)]
    if not nvlink:
        return _pair_names(host, pairs)
    pcie = [pair for pair in pairs if pair not in nvlink]
    parts = [k.advice["over_nvlink"].detail.format(pairs=_pair_names(host, nvlink))]
    if pcie:
        parts.append(k.advice["over_pcie"].detail.format(pairs=_pair_names(host, pcie)))
    return "; ".join(parts)


def _p2p(
    host: HostTopology,
    pairs: list[GpuPair],
    k: PcieKnowledge,
) -> tuple[Finding, list[GpuPair]]:
    """The P2P finding, and the pairs whose traffic may go peer to peer (OK, or unknown)."""
    if host.p2p_read is None or host.p2p_write is None:
        why = host.p2p_error or "no P2P matrix"
        return k.finding("tp-p2p", "p2p_unread", ok=True, warn=True, why=why), pairs
    refused: dict[str, list[GpuPair]] = {}
    used = []
    for a, b in pairs:
        codes = {matrix.get((a.index, b.index), "U") for matrix in (host.p2p_read, host.p2p_write)}
        worst = k.worst(codes)
        if worst is not None:
            refused.setdefault(worst, []).append((a, b))
        else:
            used.append((a, b))
    if refused:
        advice = k.advice["p2p_not_ok"]
        details, fixes, evidence = [], [], list(advice.evidence)
        for code in sorted(refused, key=lambda c: (k.severity(c), c)):
            status = k.p2p_status.get(code) or k.p2p_status["U"]
            fields = {
                "pairs": _pairs_by_link(host, refused[code], k),
                "status": code,
                "meaning": status.meaning,
                "consequence": status.consequence,
                "fix": status.fix,
            }
            details.append(advice.detail.format(**fields))
            fixes.append(advice.fix.format(**fields))
            evidence += status.evidence
        finding = Finding(
            "tp-p2p",
            True,
            "; ".join(details),
            "; ".join(dict.fromkeys(fixes)),
            warn=True,
            evidence=k.urls(evidence),
        )
        return finding, used
    finding = k.finding("tp-p2p", "p2p_ok", pairs=_pairs_by_link(host, pairs, k))
    if any(_over_nvlink(host, *pair) for pair in pairs):
        cited = [*k.advice["p2p_ok"].evidence, *k.advice["over_nvlink"].evidence]
        finding = replace(finding, evidence=k.urls(cited))
    return finding, used


def _acs(
    serve: Serve,
    host: HostTopology,
    used: list[GpuPair],
    nvlink: list[GpuPair],
    k: PcieKnowledge,
) -> Finding:
    """ACS on the bridges between the pairs whose P2P crosses PCIe (used). Redirect sends their
    P2P up to the root complex: a failure where the IOMMU translates it there or may (the hangs
    of vllm#33041, rtx6kpro#15), a warning with its cost where the IOMMU passes DMA through or
    is off (P2P works, slower): see the reasoning in knowledge/pcie_p2p.yaml."""
    if not used:
        if nvlink:
            return k.finding("tp-acs", "acs_nvlink", pairs=_pair_names(host, nvlink))
        return k.finding("tp-acs", "acs_not_needed")
    if host.pci is None:
        why = host.pci_error or "lspci gave no output"
        return k.finding("tp-acs", "acs_unread", ok=True, warn=True, why=why)
    crossed: dict[str, PciDevice] = {}
    for a, b in used:
        for bridge in bridges_between(host.pci, a.bus_id, b.bus_id):
            crossed[bridge.address] = bridge
    if not crossed:
        return k.finding("tp-acs", "acs_none", pairs=_pair_names(host, used))
    flags = set(k.acs_redirect_flags)
    redirecting = [b for b in crossed.values() if b.acs and b.acs & flags]
    if redirecting:
        redirected = [
            (a, b)
            for a, b in used
            if set(bridges_between(host.pci, a.bus_id, b.bus_id)) & set(redirecting)
        ]
        fields: dict[str, Any] = {
            "pairs": _pair_names(host, redirected),
            "bridges": ", ".join(_bridge_name(b, flags) for b in redirecting),
            "setpci": "; ".join(k.setpci.format(bridge=b.address) for b in redirecting),
            "kernel_list": ";".join(b.address for b in redirecting),
            "how": host.iommu.how,
        }
        if host.iommu.mode in ("passthrough", "off"):
            return k.finding("tp-acs", "acs_redirect_passthrough", ok=True, warn=True, **fields)
        finding = k.finding("tp-acs", "acs_redirect", ok=False, workaround=_workaround(k), **fields)
        return _worked_around(serve, finding, k)
    denied = [b for b in crossed.values() if b.denied]
    if denied:
        return k.finding(
            "tp-acs",
            "acs_denied",
            ok=True,
            warn=True,
            bridges=", ".join(b.address for b in denied),
        )
    return k.finding("tp-acs", "acs_ok", bridges=", ".join(sorted(crossed)))


def _iommu_finding(
    serve: Serve,
    host: HostTopology,
    used: list[GpuPair],
    nvlink: list[GpuPair],
    k: PcieKnowledge,
) -> Finding:
    """Checked on every pair whose P2P crosses PCIe (used), whatever its link there: NCCL's
    guide has IO virtualization redirect all PCI point-to-point traffic to the root complex.
    NVLink pairs do not cross it."""
    how = host.iommu.how
    if not used:
        if nvlink:
            return k.finding("tp-iommu", "iommu_nvlink", pairs=_pair_names(host, nvlink), how=how)
        return k.finding("tp-iommu", "iommu_not_needed")
    if host.iommu.mode in ("off", "passthrough"):
        return k.finding("tp-iommu", "iommu_ok", how=how)
    if host.iommu.mode == "unknown":
        return k.finding("tp-iommu", "iommu_unknown", ok=True, warn=True, how=how)
    finding = k.finding(
        "tp-iommu",
        "iommu_translated",
        ok=False,
        how=how,
        pairs=_pair_names(host, used),
        workaround=_workaround(k),
    )
    return _worked_around(serve, finding, k)


def _workaround(k: PcieKnowledge) -> str:
    return f"{k.workaround.how}; {k.workaround.cost}"


def _worked_around(serve: Serve, failed: Finding, k: PcieKnowledge) -> Finding:
    """A failure the pin's NCCL_P2P_DISABLE=1 works around becomes a warning with its cost; set
    without --disable-custom-all-reduce at tensor parallel 2 it stays a failure, saying so."""
    if not serve.nccl_p2p_disabled:
        return failed
    evidence = failed.evidence + k.urls(k.workaround.evidence)
    if serve.works_around_p2p:
        custom_ar = f" and {NO_CUSTOM_ALL_REDUCE}" if serve.custom_all_reduce_disabled else ""
        advice = k.advice["workaround_in_effect"]
        detail = advice.detail.format(
            finding=failed.detail, custom_ar=custom_ar, cost=k.workaround.cost
        )
        return replace(failed, ok=True, warn=True, detail=detail, evidence=evidence)
    advice = k.advice["workaround_incomplete"]
    return replace(
        failed,
        detail=advice.detail.format(finding=failed.detail, fix=failed.fix),
        fix=advice.fix.format(finding=failed.detail, fix=failed.fix),
        evidence=evidence,
    )


def _bridge_name(bridge: PciDevice, flags: set[str]) -> str:
    on = " ".join(f"{flag}+" for flag in sorted((bridge.acs or frozenset()) & flags))
    return f"{bridge.address} {bridge.description} [ACSCtl: {on}]"
