"""What the host has, as typed results parsed from what it prints: the link and P2P matrices
(`nvidia-smi topo -m`, `topo -p2p r|w`), the PCI tree with ACS on its bridges (`lspci -D -vvv`),
and the IOMMU's mode (group types, the units present, the kernel command line); the GPUs and
their bus IDs are the one GPU query's (builder.engine.hostprobe.list_gpus). Pure functions of
text: no host is asked here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import takewhile
from typing import Literal

from builder.engine.hostprobe import Gpu

GROUP_TYPES_TRANSLATED = ("DMA", "DMA-FQ")
GROUP_TYPE_IDENTITY = "identity"

Pair = tuple[int, int]
IommuMode = Literal["translated", "passthrough", "off", "unknown"]

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

    #: The one GPU query's GPUs (builder.engine.hostprobe.list_gpus), bus IDs as lspci's.
    gpus: tuple[Gpu, ...] = ()
    gpus_error: str | None = None
    links: Mapping[Pair, str] | None = None
    links_error: str | None = None
    p2p_read: Mapping[Pair, str] | None = None
    p2p_write: Mapping[Pair, str] | None = None
    p2p_error: str | None = None
    pci: Mapping[str, PciDevice] | None = None
    pci_error: str | None = None
    iommu: Iommu = field(default_factory=lambda: Iommu("unknown", "not read"))


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
