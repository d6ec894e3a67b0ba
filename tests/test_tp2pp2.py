"""Seed 003's serving shape, tensor parallel 2 x pipeline parallel 2, before a machine of four
GPUs is lent (issue 27): the proof stack and its rendered serve command, the tiny model whose
layers and heads split over 2 x 2 GPUs, and `doctor` for the stack's pin over two four-GPU
topologies (tests/fixtures/topology/h200-4x-nvlink and pro6000-4x-acs; their README says what
each is). The warm-cache artifact's per-rank keys are tests/test_warm_ranks.py's.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import Result

from builder import REPO_ROOT
from builder.hosts.pins import PinOptions, load_pin, make_pin, write_pin
from builder.image.records import load_record
from builder.manifest.resolve import resolve
from builder.manifest.serve import serve_argv
from builder.render.context import render
from tests import test_topology
from tests.golden import STACKS
from tests.test_hosts import _tested_and_pushed
from tests.test_topology import HOST, NCCL_ACS, _lines

#: doctor's fake host (fake nvidia-smi and lspci on PATH answering with a sample's files).
fake_host = test_topology.fake_host

STACK = "vllm-0.33-sm90-tp2pp2"
SERVE = [
    "vllm",
    "serve",
    "/models/tiny-llama-tp2pp2",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--served-model-name",
    "tiny-llama",
    "--tensor-parallel-size",
    "2",
    "--pipeline-parallel-size",
    "2",
    "--max-model-len",
    "256",
    "--gpu-memory-utilization",
    "0.5",
    "--dtype",
    "bfloat16",
    # The parent's TRT-LLM attention gate off, as on every 0.33 stack (serve_switches.yaml).
    "--attention-config.use_trtllm_attention=false",
]
#: Seed 003's environment and NVLink multicast kept off (the stack's env, as data).
ENV = {
    "NCCL_CUMEM_ENABLE": "0",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


# --- the proof stack ----------------------------------------------------------------------------


def test_the_stack_checks_clean(run_cli: Callable[..., Result]) -> None:
    result = run_cli("check", STACK)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"ok  {STACK}"


def test_its_serve_command_is_the_seeds_parallel_shape() -> None:
    stack = resolve(STACK, STACKS)
    assert serve_argv(stack) == SERVE
    serve = stack.manifest.serve
    assert (serve.tensor_parallel_size, serve.pipeline_parallel_size) == (2, 2)
    assert [p.name for p in stack.sources[:2]] == [f"{STACK}.yaml", "vllm-0.33-sm90.yaml"]
    assert {k: stack.manifest.env[k] for k in ENV} == ENV


def test_the_rendered_image_runs_that_command_with_that_environment() -> None:
    dockerfile = render(resolve(STACK, STACKS)).dockerfile
    cmd = [line for line in dockerfile.splitlines() if line.startswith("CMD ")]
    assert cmd == ["CMD " + json.dumps(SERVE)]
    for name, value in ENV.items():
        assert f'    {name}="{value}"' in dockerfile
    # The parent's image is the same but for the command and the environment.
    parent = render(resolve("vllm-0.33-sm90", STACKS)).dockerfile
    assert "--pipeline-parallel-size" not in parent and "NCCL_NVLS_ENABLE" not in parent


# --- the tiny model -------------------------------------------------------------------------------


def _maker() -> ModuleType:
    path = REPO_ROOT / "bench" / "make_tiny_llama_tp2pp2.py"
    spec = importlib.util.spec_from_file_location("make_tiny_llama_tp2pp2", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tiny_model_splits_over_two_by_two_gpus(tmp_path: Path) -> None:
    """Made as bench/make_tiny_llama_tp2pp2.py makes it (untrained here: the config is what is
    judged; the trained run is bench/results/tp2pp2/make-tiny-llama.txt)."""
    maker = _maker()
    assert maker.main([str(tmp_path / "m"), "--untrained"]) == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["num_attention_heads"] % 2 == 0
    assert config["num_key_value_heads"] % 2 == 0
    assert config["num_hidden_layers"] % 2 == 0
    assert config["num_hidden_layers"] == 4 and config["hidden_size"] == 256
    assert config["hidden_size"] // config["num_attention_heads"] == 64  # the stack's head_dim
    assert resolve(STACK, STACKS).manifest.serve.model.head_dim == 64


def test_a_model_that_does_not_split_is_named_field_by_field() -> None:
    split_problems = _maker().split_problems
    two_layers = {
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
    }
    assert split_problems(two_layers, 2, 2) == []
    assert split_problems(two_layers, 2, 4) == ["num_hidden_layers 2 does not split 4 ways"]
    odd = {**two_layers, "num_attention_heads": 3, "num_key_value_heads": 1}
    assert split_problems(odd, 2, 2) == [
        "num_attention_heads 3 does not split 2 ways",
        "num_key_value_heads 1 does not split 2 ways",
    ]


# --- doctor for the stack's pin over four GPUs ----------------------------------------------------


def _pin_the_stack(stacks_dir: Path, tmp_path: Path, gpu_kind: str, **options: Any) -> None:
    stack = resolve(STACK, stacks_dir)
    content_hash = _tested_and_pushed(tmp_path / "build", stack)
    record = load_record(tmp_path / "build", STACK, content_hash)
    when = datetime(2026, 12, 1, 19, 0, 0, tzinfo=UTC)
    pin = make_pin(
        HOST,
        stack,
        content_hash,
        record,
        None,
        PinOptions(gpu_kind=gpu_kind, allow_unserved=True, **options),
        when,
    )
    assert pin.command == SERVE
    write_pin(tmp_path / "hosts", pin)


def test_doctor_over_four_h200s_on_nvlink_passes_the_pin(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    """NV18 between every pair, a VM without lspci or IOMMU units, as the lent H200 x2 machine
    is: every P2P pair is over NVLink, ACS and the IOMMU are not judged."""
    log = fake_host("h200-4x-nvlink", without=("lspci",))
    _pin_the_stack(stacks_dir, tmp_path, "NVIDIA H200")
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith("all prerequisites present")
    tp = [line for line in result.output.splitlines() if line[6:8] == "tp"]
    assert [line.split(":")[0] for line in tp] == [
        "ok    tp",
        "ok    tp-p2p",
        "ok    tp-acs",
        "ok    tp-iommu",
    ], result.output
    assert (
        "ok    tp: the pin of gpu-node-07 serves on 4 GPUs: GPU 0 (NVIDIA H200, 0000:00:06.0)"
        in result.output
    )
    pairs = ", ".join(f"GPU {a}-{b} (NV18)" for a in range(4) for b in range(a + 1, 4))
    assert f"ok    tp-p2p: P2P read and write OK between {pairs} over NVLink" in result.output
    assert f"ok    tp-acs: not judged: P2P between {pairs} goes over NVLink" in result.output
    assert "nvidia-smi topo -p2p r" in log.read_text()


def test_doctor_over_four_pcie_pro6000s_with_acs_fails_the_pin(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    """PIX (one switch), NODE (another root complex) and SYS (the other socket), ACS redirect on
    every root and downstream port, the IOMMU translating: all six pairs of the 2 x 2 shape are
    sent to the root complex; doctor fails ACS and the IOMMU, naming every bridge and the fix."""
    fake_host("pro6000-4x-acs")
    _pin_the_stack(stacks_dir, tmp_path, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition")
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 1, result.output
    assert [line.split(":")[0] for line in _lines(result, "FAIL")] == [
        "FAIL  gpu",  # the sm90 proof stack on compute 12.0: the pin is of the TP x PP shape
        "FAIL  tp-acs",
        "FAIL  tp-iommu",
    ]
    assert "ok    tp: the pin of gpu-node-07 serves on 4 GPUs" in result.output
    assert (
        "ok    tp-p2p: P2P read and write OK between GPU 0-1 (PIX), GPU 0-2 (NODE), "
        "GPU 0-3 (SYS), GPU 1-2 (NODE), GPU 1-3 (SYS), GPU 2-3 (SYS)" in result.output
    )
    for bridge in ("0000:02:00.0", "0000:02:01.0", "0000:00:01.1", "0000:40:01.1", "0000:c0:01.1"):
        assert f"setpci -s {bridge} ECAP_ACS+0x6.w=0000" in result.output
    assert "0000:01:00.0 ECAP_ACS" not in result.output  # the switch's upstream port: no ACS
    assert "DMA-FQ" in result.output and "`iommu=pt`" in result.output
    assert f"see: {NCCL_ACS}" in result.output


def test_doctor_with_the_p2p_workaround_pinned_warns_with_its_cost(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    fake_host: Callable[..., Path],
) -> None:
    """The same host pinned with NCCL_P2P_DISABLE=1: at TP 2 vLLM's custom all-reduce still
    uses P2P, so both still fail, saying what to add; with --disable-custom-all-reduce too, the
    failures become warnings with their cost (traffic through host memory). (The GPU check
    fails throughout: the pin is of the sm90 proof stack, whose shape is what is judged.)"""
    fake_host("pro6000-4x-acs")
    kind = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    _pin_the_stack(stacks_dir, tmp_path, kind, env=("NCCL_P2P_DISABLE=1",))
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    assert result.exit_code == 1, result.output
    assert "vLLM's custom all-reduce still uses P2P" in result.output
    assert "add `--disable-custom-all-reduce`" in result.output
    pin = load_pin(tmp_path / "hosts", HOST)
    command = [*pin.command, "--disable-custom-all-reduce"]
    write_pin(tmp_path / "hosts", pin.model_copy(update={"command": command}))
    result = run_cli("doctor", "--host", HOST, stacks_dir=stacks_dir)
    # Only the GPU check fails now: the sm90 proof stack's image has no sm_120 code.
    assert [line.split(":")[0] for line in _lines(result, "FAIL")] == ["FAIL  gpu"]
    assert "is compute 12.0" in result.output
    assert [line.split(":")[0] for line in _lines(result, "warn") if line[6:8] == "tp"] == [
        "warn  tp-acs",
        "warn  tp-iommu",
    ]
    assert "through host memory" in result.output


@pytest.mark.parametrize("sample", ["h200-4x-nvlink", "pro6000-4x-acs"])
def test_the_four_gpu_samples_are_what_their_readme_says(sample: str) -> None:
    readme = (REPO_ROOT / "tests/fixtures/topology/README.md").read_text()
    assert f"`{sample}`" in readme
    gpus = (REPO_ROOT / "tests/fixtures/topology" / sample / "gpus.csv").read_text()
    assert len(gpus.splitlines()) == 4
