"""Every kind of runtime compile a vLLM server logs is found, named and judged (CPU, no server).

The lines are vLLM 0.22.1's and 0.33.0's, FlashInfer 0.6.11's and 0.7.2.post1's, Triton 3.6's
and CUTLASS DSL 4.5's own messages as their loggers print them (the format strings are quoted in
knowledge/runtime_compiles.yaml's evidence, with file and line), and the lines the H200 runs
logged (tests/fixtures/runtime-compiles/, cut from bench/results/).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.knowledge.runtime_compiles import compile_kinds
from builder.manifest.runtime_caches import (
    cache_layouts,
)
from builder.verify.compiles import find_compiles, find_events
from builder.verify.kernel_cache import classify, summary_lines
from builder.verify.kernel_listing import list_directory
from builder.verify.kernel_watch import directory_watch
from builder.verify.smoke_judge import judge_compiles
from builder.verify.smoke_report import CHECK_JIT, SmokeReport, format_table

FIXTURES = Path(__file__).parent / "fixtures" / "runtime-compiles"

PREFIX = "(EngineCore pid=4242) INFO 11-30 20:41:07 [backends.py:394] "
#: vLLM 0.33's logger (vllm/logger.py _FORMAT) and FlashInfer 0.7's (jit/core.py
#: FlashInferJITLogger), in a worker whose output vLLM prefixes with its process.
MONITOR = "(EngineCore pid=4242) WARNING 12-01 09:12:33 [jit_monitor.py:140] "
SPIKE = ". This causes a latency spike; consider extending warmup to cover this shape/config."
FI_LOG = "(EngineCore pid=4242) 2026-12-01 09:12:30,517 - INFO - {where} - flashinfer.jit: "
#: FlashInfer 0.7.2.post1's tqdm bar for one op's tuning (autotuner.py:2400-2406) as a log
#: holds it: each render ends with a carriage return, the first at 0%.
TUNING = (
    "[AutoTuner]: Tuning fp4_gemm:   0%|          | 0/12 [00:00<?, ?profile/s]\r"
    "[AutoTuner]: Tuning fp4_gemm:  50%|#####     | 6/12 [00:01<00:01,  4.02profile/s]\r"
    "[AutoTuner]: Tuning fp4_gemm: 100%|##########| 12/12 [00:02<00:00,  4.11profile/s]\r"
    "[AutoTuner]: Tuning fp4_gemm: 100%|##########| 12/12 [00:02<00:00,  4.10profile/s]"
)
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
    (
        "flashinfer",
        "compile",
        "fp4_gemm_cutlass_sm120",
        None,
        FI_LOG.format(where="core.py:594")
        + "Building JIT module fp4_gemm_cutlass_sm120; this can take several minutes on first "
        "use.",
    ),
    (
        "cute_dsl",
        "compile",
        "MoEDirectMicroKernel",
        None,
        MONITOR + "CuTeDSL JIT compilation during inference: MoEDirectMicroKernel" + SPIKE,
    ),
    (
        "tilelang",
        "compile",
        "hc_prenorm_gemm_kernel",
        None,
        MONITOR + "TileLang JIT compilation during inference: hc_prenorm_gemm_kernel" + SPIKE,
    ),
    (
        "tilelang",
        "compile",
        "hc_prenorm_gemm_kernel",
        None,
        # --jit-monitor-verbose adds the cache key and shapes
        MONITOR + "TileLang JIT compilation during inference: hc_prenorm_gemm_kernel "
        "(cache_key=((8, 4096), 'bfloat16'); runtime_shapes={x=(8, 4096)})" + SPIKE,
    ),
    (
        "flashinfer_autotune",
        "autotune",
        "fp4_gemm",
        None,
        "[AutoTuner]: Tuning fp4_gemm:   0%|          | 0/12 [00:00<?, ?profile/s]",
    ),
    (
        "flashinfer_autotune",
        "load",
        "trtllm::fp4_gemm",
        None,
        FI_LOG.format(where="autotuner.py:2064")
        + "[Autotuner]: Config cache hit for trtllm::fp4_gemm (runner=CutlassFp4GemmRunner, "
        "source=managed cache)",
    ),
    (
        "flashinfer_autotune",
        "trace",
        "8192",
        None,
        "(EngineCore pid=4242) INFO 12-01 09:12:30 [kernel_warmup.py:371] Running FlashInfer "
        "autotune with 8192 tokens and token buckets [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, "
        "1024, 2048, 4096, 8192].",
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
    # vLLM 0.33.0 and FlashInfer 0.7.2.post1 lines that are no compile, tune or load
    "(EngineCore pid=1) INFO 12-01 09:12:40 [jit_monitor.py:84] Kernel JIT monitor activated; "
    "monitored JIT compilations during inference will use mode=warn.",
    "(EngineCore pid=1) INFO 12-01 09:12:30 [kernel_warmup.py:485] Using FlashInfer managed "
    "autotune cache (root=flashinfer default). Pass --disable-flashinfer-autotune to skip "
    "autotuning.",
    "(EngineCore pid=1) INFO 12-01 09:12:30 [kernel_warmup.py:270] Skipping FlashInfer autotune "
    "because it is disabled.",
    FI_LOG.format(where="autotuner.py:1048") + "[Autotuner]: Autotuning process starts ...",
    FI_LOG.format(where="autotuner.py:1071") + "[Autotuner]: Autotuning process ends",
    FI_LOG.format(where="autotuner.py:2536")
    + "[Autotuner]: Skipped 3 unsupported tactic(s) for fp4_gemm (enable debug logs to see "
    "details)",
    "[AutoTuner]: Tuning fp4_gemm: 100%|##########| 12/12 [00:02<00:00,  4.11profile/s]",
    "[AutoTuner]: Tuning fp4_gemm:  10%|#         | 1/10 [00:00<00:02,  4.11profile/s]",
    "(EngineCore pid=1) WARNING 12-01 09:12:30 [qwen_gdn_linear_attn.py:307] FlashInfer GDN "
    "prefill is JIT-compiled; first run may take a while. Set --gdn-prefill-backend triton to "
    "skip JIT.",
    "(EngineCore pid=1) INFO 12-01 09:12:30 [b12x_warmup.py:85] Warmed up 4 b12x moe kernel "
    "signature(s).",
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
    assert by_kind["flashinfer"].names == ["sampling", "fp4_gemm_cutlass_sm120"]
    assert by_kind["flashinfer"].compiles == 3
    assert by_kind["triton"].names == ["_compute_slot_mapping_kernel", "_fwd_kernel"]
    assert by_kind["torch_compile"].compiles == 3
    assert by_kind["torch_compile"].loads == 2
    assert by_kind["torch_compile"].total_seconds == pytest.approx(26.52)
    assert by_kind["cute_dsl"].compiles == 3
    assert by_kind["cute_dsl"].names == [
        "b12x_moe_sm120a_cute_dsl/static_k4096_n1024_t8_r128_0123456789abcdef",
        "b12x_moe_kernel",
        "MoEDirectMicroKernel",
    ]
    assert by_kind["tilelang"].compiles == 2
    assert by_kind["tilelang"].names == ["hc_prenorm_gemm_kernel"]
    tune = by_kind["flashinfer_autotune"]
    assert (tune.compiles, tune.names, tune.loaded) == (1, ["fp4_gemm"], ["trtllm::fp4_gemm"])
    assert not tune.failing
    assert by_kind["cute_dsl"].loaded == [
        "b12x_moe_sm120a_cute_dsl/dynamic_e128_k4096_n1024_t8_fedcba9876543210",
        "b12x_moe_kernel",
    ]


def test_the_smoke_check_names_the_compiles_and_the_table_lists_every_kind() -> None:
    report = SmokeReport(stack="s", image="i", gpu=True, started_at="now")
    judge_compiles(report, "\n".join(line for *_, line in RECORDED))
    (check,) = report.checks
    assert check.name == CHECK_JIT and not check.passed
    assert check.detail.startswith(
        "flashinfer: 3 compile line(s): sampling, fp4_gemm_cutlass_sm120"
    )
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


def test_a_vllm_033_start_is_judged_by_kind() -> None:
    """A start of vLLM 0.33 on FlashInfer 0.7 as its log holds it: FlashInfer's INFO "Building
    JIT module" fails the smoke even without FLASHINFER_JIT_VERBOSE (0.6 printed nothing); one
    op's tuning bar is one tune, however often tqdm redraws it; the monitor's CuTeDSL and
    TileLang lines are compiles that pass."""
    log = "\n".join(
        [
            *QUIET,
            FI_LOG.format(where="core.py:594")
            + "Building JIT module sampling; this can take several minutes on first use.",
            TUNING,
            TUNING.replace("fp4_gemm", "cutlass_fused_moe"),
            FI_LOG.format(where="autotuner.py:2064")
            + "[Autotuner]: Config cache hit for fp8_gemm (runner=CublasRunner, source=managed "
            "cache)",
            MONITOR + "CuTeDSL JIT compilation during inference: MoEDirectMicroKernel" + SPIKE,
            MONITOR + "TileLang JIT compilation during inference: mhc_pre_kernel" + SPIKE,
        ]
    )
    findings = find_compiles(log)
    by_kind = {k.kind: k for k in findings.kinds}
    assert [k.kind for k in findings.failing] == ["flashinfer"]
    assert (by_kind["flashinfer"].compiles, by_kind["flashinfer"].names) == (1, ["sampling"])
    tune = by_kind["flashinfer_autotune"]
    assert (tune.compiles, tune.names) == (2, ["fp4_gemm", "cutlass_fused_moe"])
    assert (tune.loads, tune.loaded) == (1, ["fp8_gemm"])
    assert by_kind["cute_dsl"].names == ["MoEDirectMicroKernel"]
    assert by_kind["tilelang"].names == ["mhc_pre_kernel"]
    assert set(by_kind) == {"flashinfer", "flashinfer_autotune", "cute_dsl", "tilelang"}


def test_the_new_kinds_show_without_extra_environment() -> None:
    """The smoke's servers set each kind's visible_with; the 0.33 lines need none."""
    kinds = compile_kinds()
    assert kinds["tilelang"].visible_with == {} and kinds["flashinfer_autotune"].visible_with == {}


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
    from builder.manifest.resolve import resolve
    from tests.conftest import STACKS

    text = (FIXTURES / "h200-graphs-nofi-warm.log").read_text()
    (flashinfer,) = [k for k in find_compiles(text).kinds if k.kind == "flashinfer"]
    assert sorted(flashinfer.names) == sorted(resolve("vllm-0.22-sm90", STACKS).jit_modules)
    assert flashinfer.failing


# --- the autotune cache's layout (knowledge/runtime_caches.yaml flashinfer_autotune) ----------


def _tuned(root: Path, env: str, ops: list[str]) -> Path:
    """A FlashInfer 0.7.2.post1 managed autotune store as autotune_cache.py writes it."""
    folder = root / "v2" / env
    (folder / "entries").mkdir(parents=True)
    manifest = {"flashinfer_version": "0.7.2.post1", "gpu": "NVIDIA RTX PRO 6000 Blackwell"}
    (folder / "manifest.json").write_text(json.dumps({**manifest, "cache_schema": "v2"}))
    for op in ops:
        (folder / "entries" / f"{op}.json").write_text("{}")
    return folder


def test_the_autotune_layout_lists_each_environment_of_the_store(tmp_path: Path) -> None:
    layout = cache_layouts()["flashinfer_autotune"]
    assert layout.applies_to("0.7.2.post1") and layout.workspace.below.endswith("autotune")
    workspace = tmp_path / "flashinfer"  # FLASHINFER_WORKSPACE_BASE
    root = workspace / ".cache" / "flashinfer" / "autotune"
    _tuned(root, "0123456789abcdef", ["a" * 24])
    (root / "v2" / "not-an-env").mkdir()
    before = list_directory(layout, workspace)
    _tuned(root, "fedcba9876543210", ["b" * 24])  # another GPU or version: a new environment
    after = list_directory(layout, workspace)
    assert [Path(m["path"]).name for m in after.modules] == [
        "0123456789abcdef",
        "fedcba9876543210",
    ]
    assert all(m["meta"]["gpu"].startswith("NVIDIA RTX PRO 6000") for m in after.modules)
    result = classify("flashinfer_autotune", layout, before, after, where="directory")
    assert [(row.module, row.status) for row in result.kernels] == [
        ("0123456789abcdef", "hit"),
        ("fedcba9876543210", "miss"),
    ]


def test_a_033_smoke_watches_every_layout_each_as_its_own_kind(tmp_path: Path) -> None:
    """One watch per layout that applies to FlashInfer 0.7.2.post1: the CuTe-DSL kernels and
    the autotune store, each judged against its own kind's log lines. An op tuned into an
    environment kept from an earlier start is a miss there (its entries/ are listed)."""
    import os

    from builder.manifest.resolve import resolve
    from tests.conftest import STACKS

    volume = tmp_path / "flashinfer"  # FLASHINFER_WORKSPACE_BASE of the server
    store = volume / ".cache" / "flashinfer" / "autotune"
    env = _tuned(store, "0123456789abcdef", ["a" * 24])
    old_entry = env / "entries" / f"{'a' * 24}.json"
    os.utime(old_entry, ns=(1, 1))
    ops = volume / ".cache" / "flashinfer" / "0.7.2.post1" / "120f" / "cached_ops"
    kernel_dir = ops / "b12x_moe_sm120a_cute_dsl"
    kernel_dir.mkdir(parents=True)
    watches = directory_watch(resolve("vllm-0.33-b12x", STACKS), volume)
    assert [w.cache_id for w in watches.watches] == ["flashinfer_cute_dsl", "flashinfer_autotune"]
    watches.before()
    kernel = "micro_m1_k4096_n1024_t8_r128_0123456789abcdef"
    (kernel_dir / f"{kernel}.o").write_bytes(b"\x7fELF")
    (env / "entries" / f"{'b' * 24}.json").write_text("{}")  # fp4_gemm tuned now
    watches.after(None)
    log = (
        FI_LOG.format(where="cute_dsl_core.py:177")
        + f"Compiling CuTe-DSL kernel b12x_moe_sm120a_cute_dsl/{kernel}\n"
        + TUNING.split("\r")[0]
        + "\n"
    )
    results = watches.result(find_compiles(log).to_json())
    dsl, tuned = results.cache("flashinfer_cute_dsl"), results.cache("flashinfer_autotune")
    assert (dsl.log_kind, tuned.log_kind) == ("cute_dsl", "flashinfer_autotune")
    assert [(k.name, k.status) for k in dsl.kernels] == [
        (f"b12x_moe_sm120a_cute_dsl/{kernel}", "miss")
    ]
    assert [(k.name, k.status) for k in tuned.kernels] == [
        (f"0123456789abcdef/{'a' * 24}", "hit"),
        (f"0123456789abcdef/{'b' * 24}", "miss"),
    ]
    assert tuned.kernels[1].path == str(env / "entries" / f"{'b' * 24}.json")
    assert tuned.kernels[1].detail.startswith("one tuned op's configuration; tuned during")
    assert dsl.notes == [] and tuned.notes == []
    data = results.to_json()
    assert data["counts"] == {"hit": 1, "miss": 2, "removed": 0, "listed": 0}
    lines = summary_lines(data)
    assert any("(a miss: tuned at serve" in line for line in lines)
    assert any("(a miss: compiled at serve" in line for line in lines)


def test_the_autotune_store_is_found_where_vllm_points_it(tmp_path: Path) -> None:
    """VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR names the store itself: in the server's environment it
    wins over FLASHINFER_WORKSPACE_BASE (the listing runs as `python -c` there)."""
    import os
    import subprocess
    import sys

    from builder.verify.kernel_listing import Listing, listing_command

    layout = cache_layouts()["flashinfer_autotune"]
    pointed = tmp_path / "volume" / "autotune"
    _tuned(pointed, "0123456789abcdef", ["c" * 24])
    env = {
        **os.environ,
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "elsewhere"),
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(pointed),
    }
    argv = listing_command(layout, python=sys.executable)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    listing = Listing.from_json(json.loads(done.stdout))
    assert listing.root == str(pointed)
    assert list(listing.kernels(layout)) == [
        str(pointed / "v2" / "0123456789abcdef" / "entries" / f"{'c' * 24}.json")
    ]
    env.pop("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    fallback = str(tmp_path / "elsewhere" / ".cache" / "flashinfer" / "autotune")
    assert json.loads(done.stdout)["root"] == fallback


def test_every_cache_layout_names_a_known_compile_kind() -> None:
    kinds = compile_kinds()
    for cache_id, layout in cache_layouts().items():
        assert layout.log_kind in kinds, f"{cache_id}: log_kind {layout.log_kind} is no kind"


def test_a_compile_without_a_duration_is_unknown_not_zero() -> None:
    """A compile line that gives no seconds leaves the kind's compile time unknown (None):
    summing it as 0.0 claimed compiles that cost nothing."""
    from builder.verify.compiles import LogEvent, summarize

    kind = next(iter(compile_kinds()))
    untimed = LogEvent(kind, "compile", "mod_a", None, 1, "compiling mod_a")
    assert summarize([untimed])[0].compile_seconds is None
    timed = LogEvent(kind, "compile", "mod_b", 2.5, 2, "compiled mod_b in 2.5 s")
    assert summarize([untimed, timed])[0].compile_seconds == 2.5
