"""Tensor parallelism over PCIe (builder.hosts.topology) and `doctor`'s findings about it.

Host samples are in tests/fixtures/topology/ (their README says where each format comes from).
The unit tests read them through a fake runner that answers the exact argv the module sends; the
CLI tests put fake `nvidia-smi`, `lspci` (and `ssh`) executables on PATH, build a sysfs tree of
the sample's IOMMU groups, and run `doctor` as a user would, with no Docker engine involved.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result

from builder.cli import doctor as cli_doctor
from builder.cli.app import Settings
from builder.engine.hostprobe import GPU_QUERY, Probe, list_gpus, normal_bus_id, parse_gpu_query
from builder.engine.protocol import EngineHost
from builder.errors import StackError
from builder.hosts import remote, topology
from builder.hosts.hostcheck import Finding
from builder.hosts.pins import write_pin
from builder.hosts.topology import (
    HostTopology,
    Iommu,
    Serve,
    ancestors,
    bridges_between,
    checked_knowledge,
    decide,
    iommu_mode,
    kernel_iommu,
    knowledge,
    parse_lspci,
    parse_matrix,
    read_topology,
    serve_of,
)
from builder.knowledge.loader import KNOWLEDGE_DIR
from builder.knowledge.yamlsafe import load_yaml
from tests.test_hosts import _pin

FIXTURES = Path(__file__).parent / "fixtures" / "topology"
NCCL_ACS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs"
VLLM_33041 = "https://github.com/vllm-project/vllm/issues/33041"
HOST = "gpu-node-07"


def _text(host: str, name: str) -> str:
    return (FIXTURES / host / name).read_text()


def _iommu_sample(host: str) -> dict[str, Any]:
    data = yaml.safe_load(_text(host, "iommu.yaml"))
    assert isinstance(data, dict)
    return data


def _fixture_probe(
    host: str,
    missing: Sequence[str] = (),
    lspci: str = "lspci.txt",
    p2p: str | None = None,
    calls: list[list[str]] | None = None,
) -> Probe:
    """A Probe whose runner answers the argv topology sends with the sample's files."""
    sample = _iommu_sample(host)
    answers = {
        GPU_QUERY: "gpus.csv",
        ("nvidia-smi", "topo", "-m"): "topo-m.txt",
        ("nvidia-smi", "topo", "-p2p", "r"): p2p or "p2p-r.txt",
        ("nvidia-smi", "topo", "-p2p", "w"): p2p or "p2p-w.txt",
        ("lspci", "-D", "-vvv"): lspci,
    }

    def run(argv: Sequence[str]) -> tuple[int, str]:
        if calls is not None:
            calls.append(list(argv))
        if argv[0] in missing:
            raise OSError(2, "No such file or directory", argv[0])
        if tuple(argv) in answers:
            return 0, _text(host, answers[tuple(argv)])
        if list(argv) == ["cat", "/proc/cmdline"]:
            return 0, _text(host, "cmdline")
        if argv[0] == "cat" and argv[1].endswith("/iommu_group/type"):
            bus_id = argv[1].split("/")[-3]
            kind = sample["groups"].get(bus_id)
            return (0, kind + "\n") if kind else (1, f"cat: {argv[1]}: No such file or directory")
        if list(argv) == ["ls", "-1", "/sys/class/iommu"]:
            return 0, "".join(f"{unit}\n" for unit in sample["units"])
        raise AssertionError(f"unexpected command {argv}")

    return Probe(
        run=run,
        which=lambda name: None if name in missing else f"/usr/bin/{name}",
        cdi_dirs=(),
    )


def _host(host: str, **probe: Any) -> HostTopology:
    return read_topology(_fixture_probe(host, **probe))


def _by_name(findings: list[Finding]) -> dict[str, Finding]:
    return {f.name: f for f in findings}


def _failed(findings: list[Finding]) -> set[str]:
    return {f.name for f in findings if not f.ok}


def _warned(findings: list[Finding]) -> set[str]:
    return {f.name for f in findings if f.ok and f.warn}


TP2 = Serve("the pin of gpu-node-07", tensor_parallel=2)


# --- parsing -----------------------------------------------------------------------------------


def test_gpu_bus_ids_are_read_as_lspci_prints_them() -> None:
    driver, gpus = parse_gpu_query(_text("pro6000-4x-switch", "gpus.csv"))
    assert driver == "580.95.05"
    assert [(g.index, g.bus_id) for g in gpus] == [
        (0, "0000:18:00.0"),
        (1, "0000:19:00.0"),
        (2, "0000:1a:00.0"),
        (3, "0000:1b:00.0"),
    ]
    assert gpus[0].name == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert normal_bus_id("00000001:C1:00.0") == "0001:c1:00.0"
    assert normal_bus_id("41:00.0") == "0000:41:00.0"
    assert gpus[0].capability == "12.0"
    with pytest.raises(ValueError, match="unexpected nvidia-smi output"):
        parse_gpu_query("No devices were found\n")


def test_one_gpu_query_answers_the_facts_and_the_topology_alike() -> None:
    """doctor's GPU and driver findings and its tensor-parallel checks read one record from
    one nvidia-smi call: the same GPUs, with the bus IDs the PCI tree is walked by."""
    calls: list[list[str]] = []
    probe = _fixture_probe("pro6000-2x-acs", calls=calls)
    listed = list_gpus(probe)
    assert (listed.driver, listed.error) == ("580.95.05", None)
    assert [(g.index, g.bus_id, g.capability) for g in listed.gpus] == [
        (0, "0000:01:00.0", "12.0"),
        (1, "0000:c1:00.0", "12.0"),
    ]
    assert read_topology(probe).gpus == listed.gpus
    assert [argv for argv in calls if "--query-gpu" in argv[1]] == [list(GPU_QUERY)] * 2
    # A name with a comma in it is kept whole (the name is the query's last column).
    _, (odd,) = parse_gpu_query("0, 00000000:01:00.0, 580.95.05, 12.0, GPU, rev 2\n")
    assert odd.name == "GPU, rev 2"


def test_link_matrix_of_four_gpus_skips_nics_affinity_and_legend() -> None:
    links = parse_matrix(_text("pro6000-4x-switch", "topo-m.txt"))  # underlined header, NICs
    assert len(links) == 16
    assert {links[(a, b)] for a in range(4) for b in range(4) if a != b} == {"PIX"}
    assert links[(2, 2)] == "X"
    assert parse_matrix(_text("pro6000-2x-acs", "topo-m.txt"))[(1, 0)] == "NODE"
    assert parse_matrix(_text("pro6000-1x", "topo-m.txt")) == {(0, 0): "X"}


def test_p2p_matrices_plain_underlined_and_space_aligned() -> None:
    assert parse_matrix(_text("pro6000-2x-ok", "p2p-r.txt"))[(0, 1)] == "OK"
    assert parse_matrix(_text("rtx5090-2x", "p2p-w.txt"))[(1, 0)] == "GNS"
    # As a report pasted it (spaces, not tabs): 2x GeForce on a consumer board.
    pasted = "          GPU0 GPU1\n     GPU0        X       NS\n     GPU1        NS      X\n"
    assert parse_matrix(pasted) == {(0, 0): "X", (0, 1): "NS", (1, 0): "NS", (1, 1): "X"}
    with pytest.raises(ValueError, match="no GPU matrix"):
        parse_matrix("Failed to initialize NVML: Driver/library version mismatch\n")


def test_lspci_bridges_with_bus_ranges_and_acs_control_flags() -> None:
    devices = parse_lspci(_text("pro6000-2x-acs", "lspci.txt"))
    port = devices["0000:00:01.1"]
    assert (
        port.description
        == "PCI bridge: Advanced Micro Devices, Inc. [AMD] Genoa/Bergamo GPP Bridge"
    )
    assert port.buses == (1, 1)
    assert port.acs == {"SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"}  # ACSCtl, not ACSCap
    gpu = devices["0000:c1:00.0"]
    assert gpu.buses is None and gpu.acs is None and not gpu.denied
    assert "RTX PRO 6000 Blackwell Workstation Edition" in gpu.description
    switch_port = parse_lspci(_text("pro6000-4x-switch", "lspci.txt"))["0000:17:02.0"]
    assert switch_port.acs == {"SrcValid", "UpstreamFwd"}  # redirect cleared by the kernel


def test_lspci_run_by_a_user_shows_no_capabilities() -> None:
    devices = parse_lspci(_text("pro6000-2x-ok", "lspci-user.txt"))
    assert devices["0000:40:01.1"].denied and devices["0000:40:01.1"].acs is None
    assert devices["0000:40:01.1"].buses == (0x41, 0x41)


def test_the_bridges_between_gpus_under_one_switch_are_its_downstream_ports() -> None:
    devices = parse_lspci(_text("pro6000-4x-switch", "lspci.txt"))
    assert [d.address for d in ancestors(devices, "0000:18:00.0")] == [
        "0000:17:00.0",
        "0000:16:00.0",
        "0000:15:01.0",
    ]
    between = [d.address for d in bridges_between(devices, "0000:18:00.0", "0000:1b:00.0")]
    assert between == ["0000:17:00.0", "0000:17:03.0"]  # not the root port (ReqRedir+) above


def test_the_bridges_between_gpus_on_two_root_complexes_are_their_root_ports() -> None:
    devices = parse_lspci(_text("pro6000-2x-acs", "lspci.txt"))
    between = [d.address for d in bridges_between(devices, "0000:01:00.0", "0000:c1:00.0")]
    assert between == ["0000:00:01.1", "0000:c0:01.1"]
    five = parse_lspci(_text("rtx5090-2x", "lspci.txt"))  # one behind the chipset's switch
    assert [d.address for d in bridges_between(five, "0000:01:00.0", "0000:0e:00.0")] == [
        "0000:00:01.1",
        "0000:03:0c.0",
        "0000:02:00.0",
        "0000:00:02.2",
    ]


@pytest.mark.parametrize(
    ("cmdline", "mode"),
    [
        ("BOOT_IMAGE=/vmlinuz ro quiet splash", None),
        ("ro intel_iommu=on", "translated"),
        ("ro amd_iommu=on", "translated"),
        ("ro intel_iommu=on,igfx_off", "translated"),
        ("ro intel_iommu=on iommu=pt", "passthrough"),
        ("ro iommu=pt intel_iommu=on", "passthrough"),
        ("ro iommu.passthrough=1", "passthrough"),
        ("ro iommu=pt iommu=nopt", "translated"),
        ("ro iommu.passthrough=0 amd_iommu=on", "translated"),
        ("ro amd_iommu=off", "off"),
        ("ro intel_iommu=off iommu=pt", "off"),
    ],
)
def test_the_kernel_command_line_says_how_the_iommu_runs(cmdline: str, mode: str | None) -> None:
    assert kernel_iommu(cmdline)[0] == mode


def test_iommu_group_types_win_over_the_command_line() -> None:
    identity = {"0000:01:00.0": "identity", "0000:41:00.0": "identity"}
    assert iommu_mode(identity, ["ivhd0"], "intel_iommu=on").mode == "passthrough"
    mixed = {"0000:01:00.0": "identity", "0000:41:00.0": "DMA-FQ"}
    found = iommu_mode(mixed, ["ivhd0"], "iommu=pt")
    assert found.mode == "translated" and "0000:41:00.0: DMA-FQ" in found.how
    assert iommu_mode({"0000:01:00.0": "DMA"}, None, None).mode == "translated"


def test_without_group_types_units_and_command_line_decide() -> None:
    """Kernels before 5.11 show no group type: the units in /sys/class/iommu and the words."""
    none = {"0000:01:00.0": None}
    old = iommu_mode(none, ["dmar0", "dmar1"], "ro intel_iommu=on")
    assert old.mode == "translated" and "dmar0" in old.how and "intel_iommu=on" in old.how
    assert iommu_mode(none, [], "ro intel_iommu=on").mode == "off"  # no unit: it is off
    assert iommu_mode(none, ["ivhd0"], "ro quiet").mode == "unknown"
    assert iommu_mode(none, ["ivhd0"], "ro amd_iommu=off").mode == "unknown"  # units say on
    assert iommu_mode(none, None, "ro iommu=pt").mode == "passthrough"
    assert iommu_mode(none, None, None).mode == "unknown"


# --- the serve ---------------------------------------------------------------------------------


def test_the_serve_of_a_command_and_its_environment() -> None:
    argv = ["vllm", "serve", "m", "--tensor-parallel-size", "2", "-pp=2", "-tp", "4"]
    serve = serve_of("stack s", argv, {"NCCL_P2P_DISABLE": "1"}, [0, 1, 2, 3])
    assert (serve.tensor_parallel, serve.pipeline_parallel, serve.world) == (4, 2, 8)
    assert serve.nccl_p2p_disabled and not serve.custom_all_reduce_disabled
    assert serve.gpus == (0, 1, 2, 3)
    plain = serve_of("stack s", ["vllm", "serve", "m", "--disable-custom-all-reduce"], {}, None)
    assert plain.world == 1 and plain.custom_all_reduce_disabled and plain.gpus is None
    with pytest.raises(StackError) as caught:
        serve_of("stack s", ["vllm", "serve", "m", "--tensor-parallel-size", "two"], {}, None)
    assert caught.value.key == "command.4" and "'two' is not a number of GPUs" in str(caught.value)


@pytest.mark.parametrize("value", ["²", "٣", "0", "-1", "2.0", ""])
def test_a_parallel_size_int_refuses_or_that_is_not_a_positive_number_is_bad_input(
    value: str,
) -> None:
    """ "²".isdigit() is true but int("²") raises ValueError: ASCII digits only, as a StackError
    naming the word's index (the value of `--flag N`, the word of `--flag=N`)."""
    for argv, index in (
        (["vllm", "serve", "m", "-tp", value], 4),
        (["vllm", "serve", "m", f"--pipeline-parallel-size={value}"], 3),
    ):
        with pytest.raises(StackError) as caught:
            serve_of("stack s", argv, {}, None)
        assert caught.value.key == f"command.{index}"
        assert f"{value!r} is not a number of GPUs" in caught.value.message


# --- deciding ----------------------------------------------------------------------------------


def test_two_pro6000_with_p2p_acs_off_and_iommu_passthrough_pass() -> None:
    findings = decide(TP2, _host("pro6000-2x-ok"))
    assert [f.name for f in findings] == ["tp", "tp-p2p", "tp-acs", "tp-iommu"]
    assert all(f.ok and not f.warn for f in findings), findings
    found = _by_name(findings)
    assert "P2P read and write OK between GPU 0-1 (NODE)" in found["tp-p2p"].detail
    assert "0000:00:01.1, 0000:40:01.1" in found["tp-acs"].detail
    assert "identity" in found["tp-iommu"].detail


@pytest.mark.parametrize(("tp", "pp"), [(4, 1), (2, 2)])
def test_four_pro6000_behind_one_switch_pass_at_tp4_and_tp2_pp2(tp: int, pp: int) -> None:
    serve = Serve("stack s", tensor_parallel=tp, pipeline_parallel=pp)
    findings = decide(serve, _host("pro6000-4x-switch"))
    assert all(f.ok and not f.warn for f in findings), findings
    found = _by_name(findings)
    assert found["tp-p2p"].detail.count("(PIX)") == 6
    assert "0000:15:01.0" not in found["tp-acs"].detail  # the ReqRedir+ root port above all


def test_acs_redirect_and_a_translating_iommu_fail_naming_bridges_and_fixes() -> None:
    """The vllm#33041 host: P2P reported OK, ReqRedir+ CmpltRedir+ on both root ports, IOMMU
    translating."""
    findings = decide(TP2, _host("pro6000-2x-acs"))
    assert _failed(findings) == {"tp-acs", "tp-iommu"}
    acs, iommu = _by_name(findings)["tp-acs"], _by_name(findings)["tp-iommu"]
    assert "0000:00:01.1 PCI bridge: Advanced Micro Devices" in acs.detail
    assert "[ACSCtl: CmpltRedir+ ReqRedir+]" in acs.detail and "0000:c0:01.1" in acs.detail
    assert "0000:c0:03.1" not in acs.detail  # the NVMe's root port is not between the GPUs
    assert "setpci -s 0000:00:01.1 ECAP_ACS+0x6.w=0000; setpci -s 0000:c0:01.1" in acs.fix
    assert "pci=disable_acs_redir=0000:00:01.1;0000:c0:01.1" in acs.fix
    assert "disable ACS in the BIOS" in acs.fix and "NCCL_P2P_DISABLE=1" in acs.fix
    assert NCCL_ACS in acs.evidence and VLLM_33041 in acs.evidence
    assert "DMA-FQ" in iommu.detail and "`iommu=pt`" in iommu.fix
    assert "amd_iommu=off" in iommu.fix and VLLM_33041 in iommu.evidence


def test_a_translating_iommu_fails_although_acs_redirect_was_cleared() -> None:
    """SrcValid+ alone (pci=disable_acs_redir leaves it) does not redirect; the IOMMU does."""
    findings = decide(TP2, _host("pro6000-2x-iommu"))
    assert _failed(findings) == {"tp-iommu"}
    assert "no ACS redirect" in _by_name(findings)["tp-acs"].detail
    assert "GPU 0-1 (PHB)" in _by_name(findings)["tp-iommu"].detail


@pytest.mark.parametrize(("p2p", "code"), [(None, "GNS"), ("p2p-ns.txt", "NS")])
def test_two_rtx5090_have_no_p2p_a_warning_not_a_failure(
    tmp_path: Path, p2p: str | None, code: str
) -> None:
    host = "rtx5090-2x"
    if p2p is not None:  # the same host with the legend's other code for "no P2P"
        folder = tmp_path / host
        shutil.copytree(FIXTURES / host, folder)
        (folder / p2p).write_text(_text(host, "p2p-r.txt").replace("GNS", code))
        host = str(folder)
    findings = decide(TP2, _host(host, p2p=p2p))
    assert not _failed(findings) and _warned(findings) == {"tp-p2p"}
    p2p_finding = _by_name(findings)["tp-p2p"]
    assert f"no P2P between GPU 0-1 (PHB): {code}" in p2p_finding.detail
    assert "vLLM turns its custom all-reduce off by itself" in p2p_finding.detail
    assert "--disable-custom-all-reduce" in p2p_finding.fix
    assert "not needed" in _by_name(findings)["tp-acs"].detail  # no P2P: ACS does not matter
    assert "not needed" in _by_name(findings)["tp-iommu"].detail


def test_pairs_with_and_without_p2p_each_get_their_due() -> None:
    """Four GPUs on two sockets: P2P inside a socket, TNS across. The TNS pairs are a warning;
    ACS is still checked on the pairs that use P2P."""
    host = _host("pro6000-4x-switch")
    across = {(a, b): "TNS" for a in range(4) for b in range(4) if (a < 2) != (b < 2)}
    p2p = {**dict(host.p2p_read or {}), **across}
    findings = decide(Serve("s", tensor_parallel=4), replace(host, p2p_read=p2p))
    assert not _failed(findings) and _warned(findings) == {"tp-p2p"}
    detail = _by_name(findings)["tp-p2p"].detail
    assert "TNS (Topology not supported)" in detail and "GPU 0-2 (PIX)" in detail
    assert "GPU 0-1" not in detail
    assert _by_name(findings)["tp-acs"].detail.startswith("no ACS redirect")


def test_the_p2p_workaround_turns_failures_into_warnings_with_their_cost() -> None:
    host = _host("pro6000-2x-acs")
    full = replace(TP2, nccl_p2p_disabled=True, custom_all_reduce_disabled=True)
    findings = decide(full, host)
    assert not _failed(findings) and _warned(findings) == {"tp-acs", "tp-iommu"}
    acs = _by_name(findings)["tp-acs"]
    assert "works around it (NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce)" in acs.detail
    assert "through host memory" in acs.detail and acs.fix  # the real fix is still named
    half = replace(TP2, nccl_p2p_disabled=True)  # custom all-reduce still uses P2P at TP 2
    findings = decide(half, host)
    assert _failed(findings) == {"tp-acs", "tp-iommu"}
    assert "vLLM's custom all-reduce still uses P2P" in _by_name(findings)["tp-acs"].detail
    assert "add `--disable-custom-all-reduce`" in _by_name(findings)["tp-acs"].fix
    # Above two PCIe GPUs vLLM's custom all-reduce is off by itself: NCCL's variable suffices.
    assert Serve("s", tensor_parallel=4, nccl_p2p_disabled=True).works_around_p2p
    assert not Serve("s", tensor_parallel=2, nccl_p2p_disabled=True).works_around_p2p


def test_the_workaround_where_p2p_works_is_a_warning() -> None:
    findings = decide(replace(TP2, nccl_p2p_disabled=True), _host("pro6000-2x-ok"))
    assert _warned(findings) == {"tp-p2p"} and not _failed(findings)
    assert "although P2P works here" in _by_name(findings)["tp-p2p"].detail


def test_a_serve_on_more_gpus_than_the_host_or_the_pin_gives_fails() -> None:
    findings = decide(TP2, _host("pro6000-1x"))
    assert _failed(findings) == {"tp"} and len(findings) == 1
    assert "needs 2 GPUs (tensor parallel 2 x pipeline parallel 1); this host has 1" in (
        findings[0].detail
    )
    pinned = replace(TP2, gpus=(3,))
    findings = decide(pinned, _host("pro6000-4x-switch"))
    assert "the pin gives it 1 of this host's 4" in findings[0].detail


def test_the_pins_gpus_are_the_ones_checked() -> None:
    pinned = replace(TP2, gpus=(2, 3))
    findings = decide(pinned, _host("pro6000-4x-switch"))
    assert "GPU 2 (NVIDIA RTX PRO 6000" in findings[0].detail
    assert "GPU 0 (" not in findings[0].detail
    assert "GPU 2-3 (PIX)" in _by_name(findings)["tp-p2p"].detail
    assert _by_name(findings)["tp-acs"].detail.endswith("(0000:17:02.0, 0000:17:03.0)")


def test_one_gpu_does_not_apply_and_reads_nothing() -> None:
    calls: list[list[str]] = []
    findings = topology.check(Serve("stack s"), _fixture_probe("pro6000-2x-ok", calls=calls))
    assert [(f.name, f.ok, f.warn) for f in findings] == [("tp", True, False)]
    assert findings[0].detail.startswith("does not apply: stack s serves on one GPU")
    assert calls == []


def test_missing_nvidia_smi_or_lspci_is_said_not_raised() -> None:
    findings = topology.check(TP2, _fixture_probe("pro6000-2x-ok", missing=("nvidia-smi",)))
    assert [(f.name, f.ok, f.warn) for f in findings] == [("tp", True, True)]
    assert "the GPUs could not be listed (nvidia-smi is not on PATH)" in findings[0].detail
    findings = topology.check(TP2, _fixture_probe("pro6000-2x-ok", missing=("lspci",)))
    acs = _by_name(findings)["tp-acs"]
    assert acs.ok and acs.warn and "lspci is not on PATH" in acs.detail
    assert "apt-get install pciutils" in acs.fix
    assert _by_name(findings)["tp-iommu"].ok  # still checked


def test_lspci_as_a_user_leaves_acs_unknown_and_says_to_run_as_root() -> None:
    findings = decide(TP2, _host("pro6000-2x-ok", lspci="lspci-user.txt"))
    acs = _by_name(findings)["tp-acs"]
    assert acs.ok and acs.warn and "0000:00:01.1, 0000:40:01.1 could not be read" in acs.detail
    assert "as root" in acs.fix


def test_p2p_that_cannot_be_read_still_checks_acs_and_the_iommu() -> None:
    host = replace(_host("pro6000-2x-acs"), p2p_read=None, p2p_error="`nvidia-smi topo` exited 9")
    findings = decide(TP2, host)
    assert _warned(findings) == {"tp-p2p"} and _failed(findings) == {"tp-acs", "tp-iommu"}


def test_an_unknown_iommu_is_a_warning_saying_how_to_look() -> None:
    host = replace(_host("pro6000-2x-ok"), iommu=Iommu("unknown", "no IOMMU group type readable"))
    iommu = _by_name(decide(TP2, host))["tp-iommu"]
    assert iommu.ok and iommu.warn and "iommu_group/type" in iommu.fix


@pytest.mark.parametrize(
    ("mode", "how"),
    [
        ("passthrough", "IOMMU group type 0000:01:00.0: identity, 0000:c1:00.0: identity"),
        ("off", "no IOMMU unit in /sys/class/iommu"),
    ],
)
def test_acs_redirect_without_iommu_translation_is_a_warning_with_its_cost(
    mode: topology.IommuMode, how: str
) -> None:
    """The sources show hangs only where ACS redirect meets a translating IOMMU; without
    translation the root complex routes P2P back down: slower, not a hang."""
    host = replace(_host("pro6000-2x-acs"), iommu=Iommu(mode, how))
    findings = decide(TP2, host)
    assert not _failed(findings) and _warned(findings) == {"tp-acs"}
    acs = _by_name(findings)["tp-acs"]
    assert "[ACSCtl: CmpltRedir+ ReqRedir+]" in acs.detail and how in acs.detail
    assert "P2P works, slower" in acs.detail and "hang" not in acs.detail
    assert "setpci -s 0000:00:01.1 ECAP_ACS+0x6.w=0000" in acs.fix
    assert "NCCL_P2P_DISABLE" not in acs.fix  # the workaround costs more than the detour
    assert NCCL_ACS in acs.evidence and VLLM_33041 not in acs.evidence


@pytest.mark.parametrize("mode", ["translated", "unknown"])
def test_acs_redirect_with_a_translating_or_unknown_iommu_fails(
    mode: topology.IommuMode,
) -> None:
    host = replace(_host("pro6000-2x-acs"), iommu=Iommu(mode, "how it was told"))
    acs = _by_name(decide(TP2, host))["tp-acs"]
    assert not acs.ok and "hang at their first all-reduce" in acs.detail
    assert "how it was told" in acs.detail and "NCCL_P2P_DISABLE=1" in acs.fix


def test_a_pair_whose_read_and_write_differ_is_reported_by_the_more_severe_code() -> None:
    """sorted(codes)[0] picked alphabetically: DR (a regkey) over GNS (the GPU has no P2P)."""
    host = _host("rtx5090-2x")
    for read, write, shown in (("DR", "GNS", "GNS"), ("CNS", "GNS", "GNS"), ("U", "TNS", "TNS")):
        varied = replace(
            host,
            p2p_read={**dict(host.p2p_read or {}), (0, 1): read},
            p2p_write={**dict(host.p2p_write or {}), (0, 1): write},
        )
        detail = _by_name(decide(TP2, varied))["tp-p2p"].detail
        assert f"no P2P between GPU 0-1 (PHB): {shown} (" in detail, (read, write, detail)
    k = knowledge()
    assert k.worst({"OK"}) is None and k.worst({"OK", "XYZ"}) == "XYZ"
    assert [k.severity(c) for c in ("GNS", "NS", "CNS", "TNS", "DR", "U")] == [1, 2, 3, 4, 5, 6]


def test_no_p2p_says_the_iommu_is_not_needed_in_its_own_words() -> None:
    findings = _by_name(decide(TP2, _host("rtx5090-2x")))
    k = knowledge()
    assert findings["tp-acs"].detail == k.advice["acs_not_needed"].detail
    assert findings["tp-iommu"].detail == k.advice["iommu_not_needed"].detail
    assert "IOMMU" in findings["tp-iommu"].detail


# --- the knowledge file ------------------------------------------------------------------------


def test_every_p2p_status_of_the_legend_is_known_and_cited() -> None:
    k = knowledge()
    assert set(k.p2p_status) >= {"OK", "CNS", "GNS", "TNS", "NS", "DR", "U"}
    for code, status in k.p2p_status.items():
        assert code == "OK" or (status.consequence and status.fix and status.evidence), code
    assert all(source.url.startswith("https://") for source in k.sources.values())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("{setpci}", "{setpcii}"), "unknown template field {setpcii}"),
        (("[nccl_acs, nccl_2079", "[nccl_acs, nccl_9999"), "evidence 'nccl_9999' is not a source"),
        (("  iommu_unknown:\n", "  iommu_unsure:\n"), "advice.iommu_unknown: missing advice"),
        (
            ("  iommu_not_needed:\n", "  iommu_not_wanted:\n"),
            "advice.iommu_not_needed: missing advice",
        ),
        (("{pairs} over NVLink", "{pair} over NVLink"), "unknown template field {pair}"),
    ],
)
def test_a_broken_knowledge_file_names_file_and_key(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    text = (KNOWLEDGE_DIR / topology.KNOWLEDGE_FILE).read_text()
    assert edit[0] in text
    path = tmp_path / topology.KNOWLEDGE_FILE
    path.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(StackError) as caught:
        checked_knowledge(load_yaml(path))
    assert message in str(caught.value) and caught.value.file == path


# --- doctor, end to end ------------------------------------------------------------------------


class _Engine:
    """An engine with the NVIDIA runtime: doctor's own prerequisites pass, no dockerd used."""

    def host(self) -> EngineHost:
        return EngineHost(None, None, None, None, None, runtimes=("nvidia", "runc"))

    def containers(self, *, label: str | None = None, volume: str | None = None) -> list[Any]:
        """None has used the pin's cache volume: doctor leaves it unopened (not deployed)."""
        return []


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Path]]:
    """fake_host(SAMPLE, without=()): fake nvidia-smi / lspci answering with the sample, on a
    PATH of their own (plus cat, ls, sh); doctor's probe reads the sample's cmdline and a sysfs
    tree of its IOMMU groups. Returns the log of every fake command run."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    monkeypatch.setattr(Settings, "connect_or_why", lambda self: (_Engine(), None))
    monkeypatch.setattr(remote, "try_connect", lambda pin, default=None: (_Engine(), None))

    def make(sample: str, without: Sequence[str] = ()) -> Path:
        folder = FIXTURES / sample
        bin_dir, sysfs, log = tmp_path / "bin", tmp_path / "sys", tmp_path / "calls.log"
        bin_dir.mkdir()
        for tool in ("cat", "ls", "sh"):
            found = shutil.which(tool)
            assert found is not None
            (bin_dir / tool).symlink_to(found)
        iommu = _iommu_sample(sample)
        for bus_id, kind in iommu["groups"].items():
            group = sysfs / "bus/pci/devices" / bus_id / "iommu_group"
            group.mkdir(parents=True)
            (group / "type").write_text(kind + "\n")
        for unit in iommu["units"]:
            (sysfs / "class/iommu" / unit).mkdir(parents=True)
        (sysfs / "class/iommu").mkdir(parents=True, exist_ok=True)
        nvidia_smi = f"""#!/bin/sh
echo "nvidia-smi $*" >> {log}
d={folder}
case "$*" in
  "{" ".join(GPU_QUERY[1:])}") cat "$d/gpus.csv" ;;
  "topo -m") cat "$d/topo-m.txt" ;;
  "topo -p2p r") cat "$d/p2p-r.txt" ;;
  "topo -p2p w") cat "$d/p2p-w.txt" ;;
  *) echo "nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
"""
        lspci = f"""#!/bin/sh
echo "lspci $*" >> {log}
[ "$*" = "-D -vvv" ] || {{ echo "lspci: unexpected arguments: $*" >&2; exit 2; }}
cat {folder}/lspci.txt
"""
        for name, text in (("nvidia-smi", nvidia_smi), ("lspci", lspci)):
            if name not in without:
                _executable(bin_dir / name, text)
        monkeypatch.setenv("PATH", str(bin_dir))
        real_probe = cli_doctor._probe
        monkeypatch.setattr(
            cli_doctor,
            "_probe",
            lambda pinned, default: replace(
                real_probe(pinned, default), cmdline=folder / "cmdline", sysfs=sysfs
            ),
        )
        log.touch()
        return log

    yield make


def _tp_pin(stacks_dir: Path, tmp_path: Path, tp: int = 2, **options: Any) -> None:
    pin = _pin(stacks_dir, tmp_path, host=HOST, **options)
    changes: dict[str, Any] = {"command": [*pin.command, "--tensor-parallel-size", str(tp)]}
    write_pin(tmp_path / "hosts", pin.model_copy(update=changes))


def _lines(result: Result, mark: str) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith(mark)]


def test_doctor_fails_a_tp2_pin_on_a_host_with_acs_and_a_translating_iommu(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    log = fake_host("pro6000-2x-acs")
    _tp_pin(stacks_dir, tmp_path)
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 1, result.output
    assert [line.split(":")[0] for line in _lines(result, "FAIL")] == [
        "FAIL  tp-acs",
        "FAIL  tp-iommu",
    ]
    assert "ok    tp-p2p: P2P read and write OK between GPU 0-1 (NODE)" in result.output
    assert "setpci -s 0000:00:01.1 ECAP_ACS+0x6.w=0000" in result.output
    assert f"see: {NCCL_ACS}" in result.output
    assert "2 prerequisite(s) missing" in result.output
    calls = log.read_text()
    assert "nvidia-smi topo -p2p r" in calls and "nvidia-smi topo -p2p w" in calls
    assert "lspci -D -vvv" in calls


def test_doctor_passes_the_same_pin_on_a_host_set_up_for_p2p(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    fake_host("pro6000-2x-ok")
    _tp_pin(stacks_dir, tmp_path)
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    assert not _lines(result, "FAIL") and not _lines(result, "warn")
    assert "ok    tp: the pin of gpu-node-07 serves on 2 GPUs: GPU 0 (" in result.output
    assert result.output.rstrip().endswith("all prerequisites present")


def test_doctor_with_the_workaround_pinned_warns_with_its_cost(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    fake_host("pro6000-2x-acs")
    pin = _pin(stacks_dir, tmp_path, host=HOST, env=("NCCL_P2P_DISABLE=1",))
    command = [*pin.command, "-tp", "2", "--disable-custom-all-reduce"]
    write_pin(tmp_path / "hosts", pin.model_copy(update={"command": command}))
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in _lines(result, "warn")] == [
        "warn  tp-acs",
        "warn  tp-iommu",
    ]
    assert "all prerequisites present, 2 warning(s)" in result.output


def test_doctor_on_two_rtx5090_warns_and_passes_as_json(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    fake_host("rtx5090-2x")
    _tp_pin(stacks_dir, tmp_path)
    result = run_cli("doctor", "--host", HOST, "--json", stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["tp-p2p"]["ok"] and rows["tp-p2p"]["warn"]
    assert "GNS (GPU not supported)" in rows["tp-p2p"]["detail"]
    assert any("vllm" in url for url in rows["tp-p2p"]["evidence"])
    assert rows["tp-acs"]["ok"] and not rows["tp-acs"]["warn"]


def test_doctor_on_a_one_gpu_host_fails_a_tp2_pin(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    fake_host("pro6000-1x")
    _tp_pin(stacks_dir, tmp_path)
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 1
    assert "FAIL  tp: the pin of gpu-node-07 needs 2 GPUs" in result.output
    assert "this host has 1" in result.output


def test_doctor_for_a_one_gpu_stack_says_it_does_not_apply_and_reads_no_topology(
    run_cli: Callable[..., Result], fake_host: Callable[..., Path]
) -> None:
    log = fake_host("pro6000-2x-acs")
    result = run_cli("doctor", "--stack", "vllm-0.22-marlin")
    assert result.exit_code == 0, result.output
    assert "ok    tp: does not apply: stack vllm-0.22-marlin serves on one GPU" in result.output
    assert "topo" not in log.read_text() and "lspci" not in log.read_text()


def test_doctor_for_a_tp2_stack_checks_this_host(
    stacks_dir: Path,
    write_stack: Callable[..., Path],
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    from tests.conftest import marlin_manifest

    manifest = marlin_manifest()
    serve = manifest["serve"]
    assert isinstance(serve, dict)
    serve["tensor_parallel_size"] = 2
    write_stack("tp2-marlin", manifest)
    fake_host("pro6000-2x-iommu")
    result = run_cli("doctor", "--stack", "tp2-marlin", stacks_dir=stacks_dir)
    assert result.exit_code == 1, result.output
    assert [line.split(":")[0] for line in _lines(result, "FAIL")] == ["FAIL  tp-iommu"]
    assert "stack tp2-marlin serves on 2 GPUs" in result.output


def test_doctor_without_lspci_says_what_is_missing(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    fake_host("pro6000-2x-ok", without=("lspci",))
    _tp_pin(stacks_dir, tmp_path)
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    assert "warn  tp-acs: not checked: lspci is not on PATH" in result.output
    assert "fix: install pciutils" in result.output


def test_doctor_without_nvidia_smi_says_what_is_missing(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    fake_host("pro6000-2x-ok", without=("nvidia-smi",))
    _tp_pin(stacks_dir, tmp_path)
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 1  # the driver and GPU prerequisites are missing
    assert "Traceback" not in result.output
    assert "FAIL  driver: no NVIDIA driver found: nvidia-smi is not on PATH" in result.output
    assert "warn  tp: not checked: the GPUs could not be listed (nvidia-smi is not on PATH)" in (
        result.output
    )


def test_doctor_reads_a_pins_ssh_host_over_ssh(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    """A pin with an ssh:// engine: every command goes through `ssh HOST -- 'quoted argv'`
    (here a fake ssh that runs it locally, logging what it was given)."""
    log = fake_host("pro6000-2x-acs")
    ssh_log = tmp_path / "ssh.log"
    _executable(
        tmp_path / "bin" / "ssh",
        f"""#!/bin/sh
while [ "$1" != "--" ]; do shift; done
shift
echo "$1" >> {ssh_log}
exec sh -c "$1"
""",
    )
    _tp_pin(stacks_dir, tmp_path, engine="ssh://root@gpu-node-07")
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 1, result.output
    assert "FAIL  tp-acs" in result.output and "FAIL  tp-iommu" in result.output
    sent = ssh_log.read_text().splitlines()
    assert "nvidia-smi topo -p2p r" in sent and "lspci -D -vvv" in sent
    assert f"cat {FIXTURES}/pro6000-2x-acs/cmdline" in sent
    assert any(line.startswith("sh -c 'command -v lspci'") for line in sent)
    assert "lspci -D -vvv" in log.read_text()  # the fake host answered through ssh


@pytest.mark.parametrize("value", ["two", "²"])
def test_doctor_with_a_bad_parallel_size_in_the_pin_names_file_key_and_line(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
    value: str,
) -> None:
    """ "²".isdigit() is true, and int("²") raised a ValueError traceback: now both are bad input
    (exit 2) at the pin file's line of that word of `command`."""
    fake_host("pro6000-2x-ok")
    pin = _pin(stacks_dir, tmp_path, host=HOST)
    command = [*pin.command, "--tensor-parallel-size", value]
    write_pin(tmp_path / "hosts", pin.model_copy(update={"command": command}))
    path = tmp_path / "hosts" / f"{HOST}.yaml"
    index = len(command) - 1
    line = load_yaml(path).lines[("command", index)]
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert (
        f"{path}:{line}: command.{index}: --tensor-parallel-size {value!r} is not a number of GPUs"
        in result.output
    )


def test_doctor_with_a_bad_parallel_size_in_a_stacks_extra_args_names_that_key(
    stacks_dir: Path,
    write_stack: Callable[..., Path],
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    """In a stack the word comes from serve.extra_args (the argv's words before them are derived
    from checked manifest fields): the error names the manifest, that key's index and line. (A
    vLLM stack refuses -tp there when it is resolved; a transformers one passes it on.)"""
    path = write_stack(
        "tp-bad",
        "extends: ci-mini\n"
        "serve:\n"
        "  extra_args:\n"
        "    - --trust-remote-code\n"
        "    - -tp=²\n"
        "python: {wheels: []}\n",  # its local wheel is not beside this copy of stacks/
    )
    fake_host("pro6000-2x-ok")
    result = run_cli("doctor", "--stack", "tp-bad", stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"{path}:5: serve.extra_args.1: -tp '²' is not a number of GPUs" in result.output


@pytest.mark.parametrize(
    ("sample", "says"),
    [
        ("pro6000-2x-ok", "ok    tp: not checked: give --host HOST or --stack STACK"),
        ("pro6000-1x", "ok    tp: does not apply: this host has one GPU"),
    ],
)
def test_plain_doctor_needs_a_pin_or_stack_for_the_tensor_parallel_check(
    run_cli: Callable[..., Result], fake_host: Callable[..., Path], sample: str, says: str
) -> None:
    log = fake_host(sample)
    result = run_cli("doctor")
    assert result.exit_code == 0, result.output
    assert says in result.output
    assert "topo" not in log.read_text()


def test_the_fake_path_holds_no_real_nvidia_tools(fake_host: Callable[..., Path]) -> None:
    """Guards the tests above: they must not pass because this machine has real tools."""
    fake_host("pro6000-2x-ok", without=("nvidia-smi", "lspci"))
    assert shutil.which("nvidia-smi") is None and shutil.which("lspci") is None
    assert len(os.environ["PATH"].split(os.pathsep)) == 1


def test_doctor_on_the_real_two_h200_host_sees_p2p_over_nvlink(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    """Captured on the lent 2x H200 machine (a Firecracker VM: NVLink NV18, no lspci, no IOMMU
    unit). `doctor --stack` for a TP=2 stack printed P2P OK over NV18, a warning that lspci was
    missing and the IOMMU as not translating (bench/results/h200-fp8kv/doctor-tp2.txt); the
    pair is over NVLink, so ACS and the IOMMU are now not judged for it, and lspci's absence is
    no warning."""
    fake_host("h200-2x-nvlink", without=("lspci",))
    _tp_pin(stacks_dir, tmp_path)
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert "Traceback" not in result.output
    assert "ok    tp-p2p: P2P read and write OK between GPU 0-1 (NV18) over NVLink" in (
        result.output
    )
    assert "ok    tp-acs: not judged: P2P between GPU 0-1 (NV18) goes over NVLink" in (
        result.output
    )
    assert (
        "ok    tp-iommu: not judged: P2P between GPU 0-1 (NV18) goes over NVLink, not through "
        "the PCIe root complex where an IOMMU translates DMA (this host: no IOMMU unit in "
        "/sys/class/iommu)" in result.output
    )
    assert not [line for line in _lines(result, "FAIL") if line.startswith("FAIL  tp")]
    assert not [line for line in _lines(result, "warn") if line.startswith("warn  tp")]


# --- NVLink pairs are not PCIe P2P ---------------------------------------------------------------

HGX = "h200-2x-nvlink-hgx"


def test_the_hgx_variant_has_acs_redirect_and_a_translating_iommu() -> None:
    """Guards the NVLink tests below: judged as PCIe, the variant's pair fails both."""
    host = _host(HGX)
    assert host.iommu.mode == "translated" and "DMA-FQ" in host.iommu.how
    assert host.pci is not None
    between = bridges_between(host.pci, "0000:18:00.0", "0000:2a:00.0")
    assert sum(bool(b.acs and {"ReqRedir", "CmpltRedir"} <= b.acs) for b in between) == 4
    over_pcie = replace(host, links={**dict(host.links or {}), (0, 1): "SYS", (1, 0): "SYS"})
    assert _failed(decide(TP2, over_pcie)) == {"tp-acs", "tp-iommu"}


def test_nvlink_pairs_are_left_out_of_the_acs_and_iommu_judgement() -> None:
    """A bare-metal HGX H200 host (the real capture's NV18 pair and P2P matrices, behind
    switches with ACS redirect, IOMMU translating): its P2P is over NVLink, nothing fails."""
    findings = decide(TP2, _host(HGX))
    assert not _failed(findings) and not _warned(findings), findings
    found = _by_name(findings)
    assert found["tp-p2p"].detail == "P2P read and write OK between GPU 0-1 (NV18) over NVLink"
    assert found["tp-acs"].detail.startswith("not judged: P2P between GPU 0-1 (NV18) goes over")
    assert "ReqRedir" not in found["tp-acs"].detail and not found["tp-acs"].fix
    iommu = found["tp-iommu"]
    assert iommu.detail.startswith("not judged: P2P between GPU 0-1 (NV18) goes over NVLink")
    assert "DMA-FQ" in iommu.detail and not iommu.fix  # what the IOMMU does, said, not judged


def test_pairs_over_pcie_beside_nvlink_pairs_are_still_judged() -> None:
    """Four GPUs, NVLink bridges between 0-1 and 2-3, PCIe between the others, IOMMU
    translating: the IOMMU fails for the PCIe pairs alone, the P2P finding says which is which."""
    host = _host("pro6000-4x-switch")
    links = dict(host.links or {})
    for a, b in ((0, 1), (1, 0), (2, 3), (3, 2)):
        links[(a, b)] = "NV4"
    host = replace(host, links=links, iommu=Iommu("translated", "IOMMU group type DMA"))
    findings = decide(Serve("s", tensor_parallel=4), host)
    assert _failed(findings) == {"tp-iommu"}
    found = _by_name(findings)
    assert found["tp-p2p"].detail == (
        "P2P read and write OK between GPU 0-1 (NV4), GPU 2-3 (NV4) over NVLink; "
        "GPU 0-2 (PIX), GPU 0-3 (PIX), GPU 1-2 (PIX), GPU 1-3 (PIX) over PCIe"
    )
    iommu = found["tp-iommu"].detail
    assert "GPU 0-2 (PIX)" in iommu and "GPU 0-1" not in iommu and "GPU 2-3" not in iommu
    assert found["tp-acs"].detail.startswith("no ACS redirect")


def test_doctor_on_an_hgx_host_with_a_translating_iommu_passes_tp_over_nvlink(
    write_stack: Callable[..., Path],
    stacks_dir: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    """It exited 1 with `FAIL tp-iommu … P2P between GPU 0-1 (NV18) is sent to the root complex`
    and `FAIL tp-acs` for ACS redirect on its switches: both about PCIe, which NVLink P2P does
    not cross."""
    write_stack("h200-tp2", "extends: vllm-0.22-sm90-fp8kv\nserve: {tensor_parallel_size: 2}\n")
    log = fake_host(HGX)
    result = run_cli("doctor", "--stack", "h200-tp2", stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    assert not _lines(result, "FAIL") and not _lines(result, "warn")
    assert "ok    tp-p2p: P2P read and write OK between GPU 0-1 (NV18) over NVLink" in (
        result.output
    )
    assert "sent to the root complex" not in result.output
    assert "lspci -D -vvv" in log.read_text()
