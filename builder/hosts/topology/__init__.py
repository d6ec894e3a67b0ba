"""Tensor parallelism over PCIe: what a serve on several GPUs needs from its host.

A serve whose tensor_parallel_size x pipeline_parallel_size is above 1 all-reduces between its
GPUs. Over PCIe that traffic goes peer to peer (P2P) when CUDA reports peer access; PCI Access
Control Services (ACS) redirect on the bridges between the GPUs sends it up to the root complex,
slower, and where the IOMMU translates it there it hangs. A pair whose `nvidia-smi topo -m` link
is NV# does P2P over NVLink, not PCIe: ACS and the IOMMU are not judged for it.

One job a module: serve.py reads what the serve asks for (its argv and env); the host is read
by builder.engine.hostprobe (the only module that looks at devices: nvidia-smi's GPU list, link
and P2P matrices, lspci, the kernel command line, the IOMMU units and group types) and
probe.py hands that to parse.py's typed results; advice.py holds knowledge/pcie_p2p.yaml (every
sentence, fix and source URL a finding carries); findings.py turns serve and host into hostcheck
Findings. The names callers use are re-exported here.
"""

from builder.hosts.topology.advice import (
    KNOWLEDGE_FILE,
    PcieKnowledge,
    checked_knowledge,
    knowledge,
)
from builder.hosts.topology.findings import check, decide, not_checked
from builder.hosts.topology.parse import (
    HostTopology,
    Iommu,
    IommuMode,
    PciDevice,
    ancestors,
    bridges_between,
    iommu_mode,
    kernel_iommu,
    parse_lspci,
    parse_matrix,
)
from builder.hosts.topology.probe import read_topology
from builder.hosts.topology.serve import ArgvOrigin, Serve, serve_of

__all__ = [
    "KNOWLEDGE_FILE",
    "ArgvOrigin",
    "HostTopology",
    "Iommu",
    "IommuMode",
    "PciDevice",
    "PcieKnowledge",
    "Serve",
    "ancestors",
    "bridges_between",
    "check",
    "checked_knowledge",
    "decide",
    "iommu_mode",
    "kernel_iommu",
    "knowledge",
    "not_checked",
    "parse_lspci",
    "parse_matrix",
    "read_topology",
    "serve_of",
]
