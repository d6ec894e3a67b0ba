"""Deciding the tensor-parallel findings of a serve on a host (doctor's tp, tp-p2p, tp-acs,
tp-iommu), from what the serve asks (serve.py) and what the host has (parse.py, read by
probe.py), in the words of knowledge/pcie_p2p.yaml (advice.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from itertools import combinations
from typing import Any

from builder.engine.hostprobe import Gpu, Probe
from builder.hosts.hostcheck import Finding
from builder.hosts.topology.advice import PcieKnowledge, knowledge
from builder.hosts.topology.parse import HostTopology, PciDevice, bridges_between
from builder.hosts.topology.probe import read_topology
from builder.hosts.topology.serve import NO_CUSTOM_ALL_REDUCE, Serve

#: `nvidia-smi topo -m`'s link of a pair joined by a bonded set of # NVLinks (its legend: NV#).
_NVLINK = re.compile(r"^NV\d+$")


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


GpuPair = tuple[Gpu, Gpu]


def _link(host: HostTopology, a: Gpu, b: Gpu) -> str | None:
    links = host.links or {}
    return links.get((a.index, b.index)) or links.get((b.index, a.index))


def _over_nvlink(host: HostTopology, a: Gpu, b: Gpu) -> bool:
    """Whether `topo -m` links the pair by NVLink (NV#): its P2P does not cross PCIe."""
    return bool(_NVLINK.match(_link(host, a, b) or ""))


def _pair_name(host: HostTopology, a: Gpu, b: Gpu) -> str:
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
