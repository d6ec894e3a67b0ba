"""Every kind of runtime compile a vLLM server logs is found, named and judged (CPU, no server).

The lines are vLLM 0.22.1's, FlashInfer 0.6.11's, Triton 3.6's and CUTLASS DSL 4.5's own
messages as their loggers print them (the format strings are quoted in
knowledge/runtime_compiles.yaml's evidence), and the lines the H200 runs logged
(tests/fixtures/runtime-compiles/, cut from bench/results/).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.verify.compiles import compile_kinds, find_compiles, find_events
from builder.verify.smoke import CHECK_JIT, SmokeReport, format_table, judge_compiles

FIXTURES = Path(__file__).parent / "fixtures" / "runtime-compiles"

PREFIX = "(EngineCore pid=4242) INFO 11-30 20:41:07 [backends.py:394] "
#: One line per pattern: (kind, event, name, seconds, line). Formats from the packages' source.
RECORDED = [
    (
        "flashinfer",
        "compile",
        "sampling",
        None,
        "[1/4] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -MF "
        "/opt/flashinfer-cache/.cache/flashinfer/0.6.11.post2/90a/cached_ops/sampling/"
        "csrc_renorm.cuda.o.d -gencode=arch=compute_90a,code=sm_90a -c csrc/renorm.cu -o "
        "/opt/flashinfer-cache/.cache/flashinfer/0.6.11.post2/90a/cached_ops/sampling/"
        "csrc_renorm.cuda.o",
    ),
    (
        "flashinfer",
        "compile",
        None,
        None,
        "[1/3] /usr/local/cuda/bin/nvcc -gencode=arch=compute_120f,code=sm_120f -c norm.cu",
    ),
    (
        "triton",
        "compile",
        "_compute_slot_mapping_kernel",
        None,
        "(EngineCore pid=4242) WARNING 11-30 20:41:09 [jit_monitor.py:104] Triton kernel JIT "
        "compilation during inference: _compute_slot_mapping_kernel. This causes a latency "
        "spike; consider extending warmup to cover this shape/config.",
    ),
    (
        "triton",
        "autotune",
        "_fwd_kernel",
        None,
        "Triton autotuning for function _fwd_kernel,",
    ),
    (
        "torch_compile",
        "compile",
        "(1, 8192)",
        12.34,
        PREFIX + "Compiling a graph for compile range (1, 8192) takes 12.34 s",
    ),
    (
        "torch_compile",
        "compile",
        None,
        31.5,
        PREFIX + "Compiling a graph for dynamic shape takes 31.50 s",
    ),
    (
        "torch_compile",
        "load",
        "(1, 8192)",
        0.812,
        PREFIX + "Directly load the compiled graph(s) for compile range (1, 8192) from the "
        "cache, took 0.812 s",
    ),
    (
        "torch_compile",
        "load",
        "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/abc/rank_0_0/model",
        None,
        PREFIX + "Directly load AOT compilation from path "
        "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/abc/rank_0_0/model",
    ),
    (
        "torch_compile",
        "compile",
        "/root/.cache/vllm/x",
        None,
        PREFIX + "Compiling model again due to a load failure from /root/.cache/vllm/x, "
        "reason: EOFError",
    ),
    ("torch_compile", "trace", None, 4.21, PREFIX + "Dynamo bytecode transform time: 4.21 s"),
    ("torch_compile", "total", None, 17.02, PREFIX + "torch.compile took 17.02 s in total"),
    ("torch_compile", "total", None, 9.5, PREFIX + "torch.compile takes 9.50 s in total"),
    (
        "cute_dsl",
        "compile",
        "b12x_moe_sm120a_cute_dsl/static_k4096_n1024_t8_r128_0123456789abcdef",
        None,
        "(EngineCore pid=4242) 2026-11-30 20:41:07,001 - INFO - cute_dsl_core.py:177 - "
        "flashinfer.jit: Compiling CuTe-DSL kernel "
        "b12x_moe_sm120a_cute_dsl/static_k4096_n1024_t8_r128_0123456789abcdef",
    ),
    (
        "cute_dsl",
        "load",
        "b12x_moe_sm120a_cute_dsl/dynamic_e128_k4096_n1024_t8_fedcba9876543210",
        None,
        "2026-11-30 20:41:07,001 - DEBUG - cute_dsl_core.py:153 - flashinfer.jit: Loaded cached "
        "CuTe-DSL kernel from /var/cache/sm120-stacks/flashinfer/.cache/flashinfer/0.7.2.post1/"
        "120f/cached_ops/b12x_moe_sm120a_cute_dsl/dynamic_e128_k4096_n1024_t8_fedcba9876543210.o",
    ),
    (
        "cute_dsl",
        "compile",
        "b12x_moe_kernel",
        None,
        "2026-11-30 20:41:07,001 - CUTE_DSL - INFO - [jit_runner] - JIT cache miss "
        "function=[b12x_moe_kernel] module_hash=[9f8e]",
    ),
    (
        "cute_dsl",
        "load",
        "b12x_moe_kernel",
        None,
        "2026-11-30 20:41:07,001 - CUTE_DSL - INFO - [jit_runner] - JIT cache hit IN-FILE "
        "function=[b12x_moe_kernel] module_hash=[9f8e]",
    ),
]

QUIET = [
    "ninja: no work to do.",
    # FlashInfer 0.7.2.post1's lines around a CuTe-DSL compile that are no compile themselves
    "2026-11-30 20:41:09,001 - INFO - cute_dsl_core.py:266 - flashinfer.jit: Persisted CuTe-DSL "
    "kernel to /opt/x/cached_ops/b12x_moe_sm120a_cute_dsl/static_k1_n1_t1_r1_0123456789abcdef.o",
    "2026-11-30 20:41:09,001 - INFO - cute_dsl_core.py:174 - flashinfer.jit: Invalidating stale "
    "CuTe-DSL module b12x_moe_sm120a_cute_dsl",
    "(EngineCore pid=1) INFO [monitor.py:82] Initial profiling/warmup run took 0.41 s",
    "(EngineCore pid=1) INFO [jit_monitor.py:54] Kernel JIT monitor activated — Triton JIT "
    "compilations during inference will be logged as warnings.",
    "INFO [kernel_warmup.py:97] Warming up FlashInfer attention.",
    "[2/4] c++ -c binding.cc -o binding.o",
]


@pytest.mark.parametrize(("kind", "event", "name", "seconds", "line"), RECORDED)
def test_each_recorded_line_is_named_by_kind_and_name(
    kind: str, event: str, name: str | None, seconds: float | None, line: str
) -> None:
    (found,) = find_events(line)
    assert (found.kind, found.event, found.name, found.seconds) == (kind, event, name, seconds)


def test_lines_that_are_no_compile_are_not_counted() -> None:
    assert find_events("\n".join(QUIET)) == []


def test_every_kind_in_the_knowledge_file_has_a_recorded_line() -> None:
    assert {kind for kind, *_ in RECORDED} == set(compile_kinds())


def test_only_the_kinds_an_image_precompiles_fail_the_smoke() -> None:
    log = "\n".join(line for *_, line in RECORDED)
    findings = find_compiles(log)
    assert [k.kind for k in findings.failing] == ["flashinfer"]
    by_kind = {k.kind: k for k in findings.kinds}
    assert by_kind["flashinfer"].names == ["sampling"]
    assert by_kind["flashinfer"].compiles == 2
    assert by_kind["triton"].names == ["_compute_slot_mapping_kernel", "_fwd_kernel"]
    assert by_kind["torch_compile"].compiles == 3
    assert by_kind["torch_compile"].loads == 2
    assert by_kind["torch_compile"].total_seconds == pytest.approx(26.52)
    assert by_kind["cute_dsl"].compiles == 2
    assert by_kind["cute_dsl"].names == [
        "b12x_moe_sm120a_cute_dsl/static_k4096_n1024_t8_r128_0123456789abcdef",
        "b12x_moe_kernel",
    ]
    assert by_kind["cute_dsl"].loaded == [
        "b12x_moe_sm120a_cute_dsl/dynamic_e128_k4096_n1024_t8_fedcba9876543210",
        "b12x_moe_kernel",
    ]


def test_the_smoke_check_names_the_compiles_and_the_table_lists_every_kind() -> None:
    report = SmokeReport(stack="s", image="i", gpu=True, started_at="now")
    judge_compiles(report, "\n".join(line for *_, line in RECORDED))
    (check,) = report.checks
    assert check.name == CHECK_JIT and not check.passed
    assert check.detail.startswith("flashinfer: 2 compile line(s): sampling")
    assert "triton: 2 compile line(s): _compute_slot_mapping_kernel" in check.detail
    table = format_table(report)
    for kind in compile_kinds():
        assert kind in table
    assert "FAIL    flashinfer" in table


def test_a_log_with_loads_only_passes_and_says_so() -> None:
    report = SmokeReport(stack="s", image="i", gpu=True, started_at="now")
    judge_compiles(
        report,
        PREFIX + "Directly load the compiled graph(s) for compile range (1, 8192) from the "
        "cache, took 0.812 s",
    )
    (check,) = report.checks
    assert check.passed
    assert check.detail == "none (torch_compile: 1 cache load(s))"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.log")))
def test_the_h200_logs_are_judged_as_recorded(name: str) -> None:
    """Each fixture log's first line says what the smoke must find in it."""
    text = (FIXTURES / name).read_text()
    expected = dict(
        item.split("=", 1) for item in text.splitlines()[0].removeprefix("# expect: ").split()
    )
    by_kind = {k.kind: k for k in find_compiles(text).kinds}
    for kind, count in expected.items():
        got = by_kind[kind].compiles if kind in by_kind else 0
        assert got == int(count), f"{name}: {kind} compiles {got}, expected {count}"


def test_the_h200_control_run_names_each_flashinfer_module_it_built() -> None:
    """Without the image's cache, vLLM 0.22.1 built the three modules the stack precompiles."""
    from builder.spec.resolve import resolve
    from tests.conftest import STACKS

    text = (FIXTURES / "h200-graphs-nofi-warm.log").read_text()
    (flashinfer,) = [k for k in find_compiles(text).kinds if k.kind == "flashinfer"]
    assert sorted(flashinfer.names) == sorted(resolve("vllm-0.22-sm90", STACKS).jit_modules)
    assert flashinfer.failing
