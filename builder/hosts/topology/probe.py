"""Reading a host's PCIe topology: builder.engine.hostprobe runs the programs and reads the
files (through a Probe: this machine, or over ssh for a pin's ssh:// engine); this module only
puts what it returns through the parsers into one HostTopology.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from builder.engine import hostprobe
from builder.engine.hostprobe import Probe
from builder.hosts.topology.parse import (
    HostTopology,
    Iommu,
    Pair,
    iommu_mode,
    parse_lspci,
    parse_matrix,
)


def read_topology(probe: Probe) -> HostTopology:
    """Ask the host through probe; a missing program or an unreadable file is recorded, never
    raised."""
    listed = hostprobe.list_gpus(probe)
    if listed.error is not None:
        return HostTopology(gpus_error=listed.error)
    gpus = listed.gpus
    links, links_error = _matrix(probe, hostprobe.TOPO_LINKS)
    read, read_error = _matrix(probe, hostprobe.TOPO_P2P_READ)
    write, write_error = _matrix(probe, hostprobe.TOPO_P2P_WRITE)
    lspci, pci_error = hostprobe.output(probe, hostprobe.LSPCI)
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


def _matrix(probe: Probe, argv: Sequence[str]) -> tuple[dict[Pair, str] | None, str | None]:
    out, why = hostprobe.output(probe, argv)
    if out is None:
        return None, why
    try:
        return parse_matrix(out), None
    except ValueError as exc:
        return None, f"`{shlex.join(argv)}`: {exc}"


def _iommu(probe: Probe, bus_ids: Sequence[str]) -> Iommu:
    return iommu_mode(
        hostprobe.iommu_group_types(probe, bus_ids),
        hostprobe.iommu_units(probe),
        hostprobe.kernel_cmdline(probe),
    )
