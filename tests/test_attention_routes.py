"""The FlashInfer modules a stack's serve settings select (builder/manifest/servepath.py over
knowledge/attention_routes.yaml): the attention route per vLLM version, GPU and KV cache dtype,
the sampler from its variable, module names spelled as FlashInfer spells them, and a located
exit-2 error where a route needs a model fact the manifest lacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result

from builder.errors import StackError
from builder.knowledge.jitmodules import jit_modules_known
from builder.manifest.model import OPTIONAL_MODEL_FACTS, Model, Speculative
from builder.manifest.resolve import jit_module_table, resolve
from builder.manifest.serve import serve_argv
from builder.render.context import render
from builder.vllmcli.serveflags import command_options
from builder.vllmcli.vllm_argv import attention_backend_option
from tests.conftest import STACKS

# FlashInfer's get_batch_prefill_uri (flashinfer/jit/attention/modules.py, 0.6.5 and
# 0.6.11.post2), written out by hand from its f-string: dtypes through filename_safe_dtype_map
# (bfloat16 bf16, float8_e4m3fn e4m3, int32 i32), Python's True/False, "_sm90" for fa3.
FA2_D256_E4M3 = (
    "batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_e4m3_dtype_o_bf16_dtype_idx_i32_"
    "head_dim_qk_256_head_dim_vo_256_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False"
)
FA2_D64_E4M3 = (
    "batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_e4m3_dtype_o_bf16_dtype_idx_i32_"
    "head_dim_qk_64_head_dim_vo_64_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False"
)
FA2_D64_BF16 = (
    "batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_"
    "head_dim_qk_64_head_dim_vo_64_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False"
)
FA3_D64_BF16 = FA2_D64_BF16 + "_sm90"
FA2_D128_F16_E5M2_SWA_CAP = (
    "batch_prefill_with_kv_cache_dtype_q_f16_dtype_kv_e5m2_dtype_o_f16_dtype_idx_i32_"
    "head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_True_use_logits_cap_True_f16qk_False"
)


def _child(write_stack: Callable[..., Path], name: str, parent: str, **sections: Any) -> None:
    write_stack(name, {"extends": parent, **sections})


# --- the stacks ----------------------------------------------------------------------------------


def test_the_017_stack_precompiles_the_fp8_kv_attention_module_for_its_head_dim() -> None:
    stack = resolve("vllm-0.17-flashinfer-cutlass", STACKS)
    assert stack.jit_modules == (
        "fused_moe_120",
        "gemm_sm120",
        "fp4_gemm_cutlass_sm120",
        "fp4_quantization_120",
        FA2_D256_E4M3,
    )
    path = stack.serve_path
    assert path is not None
    assert (path.attention_backend, path.kv_cache_dtype) == ("FLASHINFER", "fp8_e4m3")
    assert not path.flashinfer_sampler  # vLLM 0.17 samples with FlashInfer only when asked
    assert path.modules == (FA2_D256_E4M3,)


def test_the_sm90_stack_derives_exactly_its_former_hand_preset() -> None:
    stack = resolve("vllm-0.22-sm90", STACKS)
    assert stack.jit_modules == ("sampling", FA2_D64_BF16, FA3_D64_BF16)
    assert stack.module_archs()[FA3_D64_BF16] == ["sm_90a"]
    assert stack.module_archs()[FA2_D64_BF16] == ["sm_90a"]  # the stack's own cubin arch


def test_the_fp8_kv_proof_stack_drops_fa3_for_one_e4m3_fa2_module() -> None:
    stack = resolve("vllm-0.22-sm90-fp8kv", STACKS)
    assert stack.jit_modules == ("sampling", FA2_D64_E4M3)
    assert stack.manifest.serve.kv_cache_dtype == "fp8_e4m3"


def test_the_b12x_stacks_fp8_checkpoint_derives_the_fa2_fp8_module() -> None:
    """Nemotron-3-Nano stores its KV cache as FP8: FlashInfer attention, its FA2 module."""
    stack = resolve("vllm-0.22-b12x", STACKS)
    assert stack.serve_path is not None and stack.serve_path.attention_backend == "FLASHINFER"
    assert any("dtype_kv_e4m3" in module for module in stack.jit_modules)


@pytest.mark.parametrize("name", ["vllm-0.22-marlin"])
def test_the_022_sm120_stacks_select_no_flashinfer_module(name: str) -> None:
    """Auto KV cache on sm120 keeps vLLM's FLASH_ATTN; the sampler is off by its variable."""
    stack = resolve(name, STACKS)
    assert stack.serve_path is not None
    assert stack.serve_path.attention_backend == "FLASH_ATTN"
    assert stack.serve_path.modules == ()
    assert stack.jit_modules == ("fp4_gemm_cutlass_sm120",)


@pytest.mark.parametrize("name", ["vllm-0.33-marlin", "vllm-0.33-spark"])
def test_the_033_stacks_keep_their_module_list(name: str) -> None:
    stack = resolve(name, STACKS)
    assert stack.jit_modules == ("sampling", "fp4_gemm_cutlass_sm120")
    assert stack.serve_path is not None
    assert stack.serve_path.attention_backend == "FLASH_ATTN"


def test_a_stack_without_vllm_derives_nothing() -> None:
    assert resolve("ci-mini", STACKS).serve_path is None


def test_show_prints_the_serve_path(run_cli: Callable[..., Result]) -> None:
    result = run_cli("show", "vllm-0.22-sm90-fp8kv")
    assert result.exit_code == 0, result.output
    derived = json.loads(result.output)["derived"]
    assert derived["jit_modules"] == ["sampling", FA2_D64_E4M3]
    assert derived["serve_path"]["flashinfer_modules"] == ["sampling", FA2_D64_E4M3]
    assert derived["serve_path"]["attention_backend_from"] == "serve.attention_backend FLASHINFER"


def test_the_serve_path_stays_out_of_the_image_identity() -> None:
    stack = resolve("vllm-0.22-sm90", STACKS)
    assert "serve_path" not in stack.to_json(editorial=False)["derived"]


# --- module tables -------------------------------------------------------------------------------


def test_derived_modules_are_in_the_images_table_and_nothing_else_changes() -> None:
    listed = jit_module_table()
    for name in ("ci-mini", "vllm-0.33-marlin", "vllm-0.22-sm90"):
        assert jit_module_table(resolve(name, STACKS)) == listed
    table = jit_module_table(resolve("vllm-0.17-flashinfer-cutlass", STACKS))
    assert set(table) - set(listed) == {FA2_D256_E4M3}
    assert table[FA2_D256_E4M3] == {
        "generator": "flashinfer.jit.attention:gen_batch_prefill_module",
        "args": [
            "fa2",
            "torch.bfloat16",
            "torch.float8_e4m3fn",
            "torch.bfloat16",
            "torch.int32",
            256,
            256,
            0,
            False,
            False,
            False,
        ],
    }
    rendered = render(resolve("vllm-0.17-flashinfer-cutlass", STACKS))
    assert FA2_D256_E4M3 in json.loads(rendered.files["tools/jit-modules.json"][0])


def test_family_names_read_back_into_their_arguments() -> None:
    known = jit_modules_known()
    assert FA2_D256_E4M3 in known and FA3_D64_BF16 in known
    assert known[FA3_D64_BF16].fixed_archs == ["sm_90a"]
    assert known[FA2_D256_E4M3].fixed_archs == []
    found = known.parse(FA2_D128_F16_E5M2_SWA_CAP)
    assert found is not None and found.family == "batch_prefill_fa2"
    assert found.module.args == [
        "fa2",
        "torch.float16",
        "torch.float8_e5m2",
        "torch.float16",
        "torch.int32",
        128,
        128,
        0,
        True,
        True,
        False,
    ]
    spelled = known.instance(
        "batch_prefill_fa2",
        {
            "dtype_q": "torch.float16",
            "dtype_kv": "torch.float8_e5m2",
            "dtype_o": "torch.float16",
            "dtype_idx": "torch.int32",
            "head_dim_qk": 128,
            "head_dim_vo": 128,
            "pos_encoding_mode": 0,
            "use_sliding_window": True,
            "use_logits_soft_cap": True,
            "use_fp16_qk_reduction": False,
        },
    )
    assert spelled.name == FA2_D128_F16_E5M2_SWA_CAP


@pytest.mark.parametrize(
    "name",
    [
        FA2_D64_BF16.replace("head_dim_qk_64", "head_dim_qk_064"),  # FlashInfer spells 64
        FA2_D64_BF16.replace("dtype_q_bf16", "dtype_q_bfloat16"),
        FA2_D64_BF16 + "_sm100",
        FA2_D64_BF16.replace("f16qk_False", "f16qk_false"),
    ],
)
def test_names_no_family_spells_are_unknown(name: str) -> None:
    assert name not in jit_modules_known()


def test_a_hand_listed_family_module_resolves(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    write_stack(
        "by-hand",
        {"extends": "vllm-0.22-marlin", "jit_cache": {"modules": [FA2_D128_F16_E5M2_SWA_CAP]}},
    )
    assert FA2_D128_F16_E5M2_SWA_CAP in resolve("by-hand", stacks_dir).jit_modules


# --- routes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--attention-backend", "FLASHINFER"], ("FLASHINFER", 0)),
        (["--trust-remote-code", "--attention-backend=flashinfer"], ("FLASHINFER", 1)),
        (["--attention_backend", "FLASH_ATTN"], ("FLASH_ATTN", 0)),
        (["--attention-config.backend", "FLASHINFER"], ("FLASHINFER", 0)),
        (["-ac", '{"backend": "FLASHINFER"}'], ("FLASHINFER", 0)),
        (['--attention-config={"backend": "triton_attn"}'], ("TRITON_ATTN", 0)),
        (["--attention-config", '{"flash_attn_version": 2}'], None),
        (["--trust-remote-code"], None),
        # argparse keeps the last of an option given twice (vLLM only warns about duplicates).
        (
            ["--attention-backend", "FLASH_ATTN", "--attention-backend", "FLASHINFER"],
            ("FLASHINFER", 2),
        ),
        (
            ["-ac", '{"backend": "FLASHINFER"}', "-ac", '{"backend": "TRITON_ATTN"}'],
            ("TRITON_ATTN", 2),
        ),
        # A later config that names no backend replaces the earlier one whole.
        (["-ac", '{"backend": "FLASHINFER"}', "-ac", '{"flash_attn_version": 2}'], None),
        # Dotted keys are merged into one object that vLLM passes after every other argument.
        (
            ["--attention-config.backend", "FLASHINFER", "-ac", '{"backend": "FLASH_ATTN"}'],
            ("FLASHINFER", 0),
        ),
        (["-ac", '{"backend": "FLASHINFER"}', "--attention-config.flash_attn_version", "2"], None),
        (["--attention-config.backend", '"flashinfer"'], ("FLASHINFER", 0)),
        # auto (any case) and None name no backend: vLLM picks, as with no option.
        (["--attention-backend", "auto"], None),
        (["--attention-backend", "None"], None),
        (["-ac", '{"backend": "AUTO"}'], None),
        # Any unambiguous prefix of the option is the option (argparse's allow_abbrev).
        (["--attention-b", "FLASHINFER"], ("FLASHINFER", 0)),
        (["--attention", "FLASHINFER"], None),  # backend or config: ambiguous, vLLM refuses
    ],
)
def test_the_attention_backend_option(args: list[str], expected: Any) -> None:
    found = attention_backend_option(args)
    assert (found and (found.backend, found.index)) == expected


def test_fp8_kv_on_sm120_in_022_routes_to_flashinfer(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _child(
        write_stack,
        "fp8kv",
        "vllm-0.22-marlin",
        serve={"kv_cache_dtype": "fp8", "dtype": "bfloat16", "model": {"head_dim": 128}},
    )
    stack = resolve("fp8kv", stacks_dir)
    fa2 = FA2_D64_E4M3.replace("_64_", "_128_")
    assert stack.jit_modules == ("fp4_gemm_cutlass_sm120", fa2)


def test_an_explicit_flash_attn_backend_selects_no_attention_module(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _child(
        write_stack,
        "fa",
        "vllm-0.22-sm90-fp8kv",
        serve={"attention_backend": "FLASH_ATTN"},
    )
    assert resolve("fa", stacks_dir).jit_modules == ("sampling",)


def test_auto_kv_follows_the_checkpoint_from_022_on(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    model = {"head_dim": 128, "checkpoint_kv_cache_dtype": "fp8_e4m3"}
    _child(write_stack, "ckpt", "vllm-0.22-marlin", serve={"dtype": "bfloat16", "model": model})
    path = resolve("ckpt", stacks_dir).serve_path
    assert path is not None
    assert (path.kv_cache_dtype, path.attention_backend) == ("fp8_e4m3", "FLASHINFER")
    # An explicit bfloat16 cache wins over the checkpoint's wish.
    _child(write_stack, "ckpt-bf16", "ckpt", serve={"kv_cache_dtype": "bfloat16"})
    assert resolve("ckpt-bf16", stacks_dir).serve_path.attention_backend == "FLASH_ATTN"  # type: ignore[union-attr]


def test_sliding_window_and_soft_cap_facts_spell_their_variant(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    model = {"head_dim": 128, "sliding_window": 4096, "logits_soft_cap": 50.0}
    _child(write_stack, "gemma-ish", "vllm-0.22-sm90-fp8kv", serve={"model": model})
    name = FA2_D64_E4M3.replace("_64_", "_128_").replace(
        "swa_False_use_logits_cap_False", "swa_True_use_logits_cap_True"
    )
    assert resolve("gemma-ish", stacks_dir).jit_modules == ("sampling", name)


@pytest.mark.parametrize(
    "value, modules",
    [("1", ("fp4_gemm_cutlass_sm120", "sampling")), ("0", ("fp4_gemm_cutlass_sm120",))],
)
def test_the_sampler_follows_its_variable(
    value: str, modules: tuple[str, ...], write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _child(write_stack, "s", "vllm-0.22-marlin", env={"VLLM_USE_FLASHINFER_SAMPLER": value})
    assert resolve("s", stacks_dir).jit_modules == modules


# --- errors --------------------------------------------------------------------------------------


def _line_of(path: Path, text: str) -> int:
    return path.read_text().splitlines().index(text) + 1


def test_a_missing_head_dim_is_a_located_exit_2_that_writes_nothing(
    run_cli: Callable[..., Result], stacks_dir: Path, tmp_path: Path
) -> None:
    path = stacks_dir / "vllm-0.17-flashinfer-cutlass.yaml"
    path.write_text(path.read_text().replace("    head_dim: 256\n", ""))
    line = _line_of(path, "  model:")
    for command in ("check", "render", "show"):
        result = run_cli(command, "vllm-0.17-flashinfer-cutlass", stacks_dir=stacks_dir)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert f"vllm-0.17-flashinfer-cutlass.yaml:{line}: serve.model.head_dim: " in result.output
        assert "kv_cache_dtype fp8_e4m3 on sm120" in result.output
        assert "hint: take it from the model's config.json" in result.output
    assert not (tmp_path / "build").exists(), "a failed check or render must leave nothing"


def test_a_missing_head_dim_points_at_the_file_that_sets_serve_model(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _child(write_stack, "no-dim", "vllm-0.22-marlin", serve={"kv_cache_dtype": "fp8_e4m3"})
    _child(write_stack, "no-dim-2", "no-dim", serve={"dtype": "bfloat16"})
    with pytest.raises(StackError) as caught:
        resolve("no-dim-2", stacks_dir)
    error = caught.value
    assert error.key == "serve.model.head_dim"
    assert error.file == stacks_dir / "vllm-0.22-marlin.yaml"
    assert error.line == _line_of(stacks_dir / "vllm-0.22-marlin.yaml", "  model:")


def test_a_missing_dtype_is_named(write_stack: Callable[..., Path], stacks_dir: Path) -> None:
    _child(
        write_stack,
        "no-dtype",
        "vllm-0.22-marlin",
        serve={"kv_cache_dtype": "fp8_e4m3", "model": {"head_dim": 128}},
    )
    with pytest.raises(StackError) as caught:
        resolve("no-dtype", stacks_dir)
    assert caught.value.key == "serve.dtype"
    assert "bfloat16" in str(caught.value.hint)


def test_a_033_stack_routed_to_flashinfer_derives_flashinfer_07s_modules(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    """vLLM 0.33 with an fp8 KV cache on sm120 serves FlashInfer attention: FlashInfer 0.7's
    FA2 module, the 0.6 name + `_kv_stride_equal` (proved on an H200, bench/RESULTS.md §10)."""
    _child(
        write_stack,
        "new-fp8",
        "vllm-0.33-marlin",
        serve={"kv_cache_dtype": "fp8_e4m3", "dtype": "bfloat16", "model": {"head_dim": 128}},
    )
    path = resolve("new-fp8", stacks_dir).serve_path
    assert path is not None and path.attention_backend == "FLASHINFER"
    (module,) = [m for m in path.modules if m.startswith("batch_prefill")]
    assert module.endswith("_kv_stride_equal") and "head_dim_qk_128" in module
    assert "dtype_kv_e4m3" in module


def test_a_033_sm90_stack_with_fp8_kv_on_flashinfer_is_refused(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _child(
        write_stack,
        "sm90-fp8",
        "vllm-0.33-sm90",
        serve={"kv_cache_dtype": "fp8_e4m3", "attention_backend": "FLASHINFER"},
    )
    with pytest.raises(StackError) as caught:
        resolve("sm90-fp8", stacks_dir)
    assert caught.value.key == "serve.attention_backend"
    assert "quantizes q to fp8" in caught.value.message


def test_the_033_bf16_flashinfer_route_on_sm90_is_what_the_h200_loaded(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _child(write_stack, "sm90-fi", "vllm-0.33-sm90", serve={"attention_backend": "FLASHINFER"})
    modules = resolve("sm90-fi", stacks_dir).jit_modules
    assert modules[0] == "sampling"
    assert {m.rsplit("_", 3)[-1] for m in modules[1:]} == {"equal", "sm90"}


def test_a_flashinfer_the_family_was_not_read_for_is_refused(
    stacks_dir: Path,
) -> None:
    path = stacks_dir / "vllm-0.17-flashinfer-cutlass.yaml"
    data = yaml.safe_load(path.read_text())
    data["python"]["overrides"]["flashinfer-python"] = "0.7.2.post1"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(StackError) as caught:
        resolve("vllm-0.17-flashinfer-cutlass", stacks_dir)
    assert caught.value.key == "python.overrides.flashinfer-python"
    assert ">=0.6.5,<0.7" in caught.value.message


def test_a_sampler_variable_vllm_cannot_read_is_refused(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _child(write_stack, "s", "vllm-0.22-marlin", env={"VLLM_USE_FLASHINFER_SAMPLER": "yes"})
    with pytest.raises(StackError) as caught:
        resolve("s", stacks_dir)
    assert caught.value.key == "env.VLLM_USE_FLASHINFER_SAMPLER"


# --- serve.extra_args: what vLLM's parser reads ------------------------------------------------


def _extra_args(write_stack: Callable[..., Path], name: str, parent: str, *args: str) -> Path:
    """A child stack whose serve.extra_args are these, one per line after --trust-remote-code."""
    return write_stack(
        name, {"extends": parent, "serve": {"extra_args": ["--trust-remote-code", *args]}}
    )


def test_a_kv_cache_dtype_in_extra_args_is_refused_with_its_line(
    write_stack: Callable[..., Path], stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    """The reviewer's case: vLLM serves FLASHINFER with fp8 KV from extra_args, while the serve
    path read only serve.kv_cache_dtype and derived FLASH_ATTN and no attention module."""
    path = _extra_args(write_stack, "kv-extra", "vllm-0.22-marlin", "--kv-cache-dtype", "fp8")
    result = run_cli("check", "kv-extra", stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    line = _line_of(path, "  - --kv-cache-dtype")
    assert (
        f"kv-extra.yaml:{line}: serve.extra_args[1]: --kv-cache-dtype: "
        "the serve command passes --kv-cache-dtype itself" in result.output
    )
    assert "hint: use serve.kv_cache_dtype" in result.output


@pytest.mark.parametrize(
    "args, use",
    [
        (["--kv-cache-dtype=fp8"], "serve.kv_cache_dtype"),
        (["--kv_cache_dtype", "fp8"], "serve.kv_cache_dtype"),
        (["--kv-cache-dt", "fp8"], "serve.kv_cache_dtype"),  # argparse takes a unique prefix
        (["--dtype", "float16"], "serve.dtype"),
        (["--dtype=half"], "serve.dtype"),
        (["-tp", "2"], "serve.tensor_parallel_size"),
        (["--tensor-parallel-size=2"], "serve.tensor_parallel_size"),
        (["-pp", "2"], "serve.pipeline_parallel_size"),
        (["--max-model-len", "4096"], "serve.max_model_len"),
        (["--gpu-memory-utilization", "0.8"], "serve.gpu_memory_utilization"),
        (["--moe-backend", "triton"], "serve.moe_backend"),
        (["--served-model-name", "x"], "serve.served_model_name"),
        (["--enforce-eager"], "serve.enforce_eager"),
        (["--no-enforce-eager"], "serve.enforce_eager"),
        (["--speculative-config", '{"method": "mtp"}'], "serve.speculative"),
        (["--speculative-config.method", "mtp"], "serve.speculative"),
        (["--port", "9000"], "serve.port"),
        (["--model", "other/model"], "serve.model.id"),
        (["--host", "127.0.0.1"], "listens on 0.0.0.0"),
    ],
)
def test_extra_args_that_set_a_typed_serve_setting_are_refused(
    args: list[str], use: str, write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _extra_args(write_stack, "dup", "vllm-0.22-marlin", *args)
    with pytest.raises(StackError) as caught:
        resolve("dup", stacks_dir)
    assert caught.value.key == "serve.extra_args[1]"
    assert caught.value.file == stacks_dir / "dup.yaml"
    assert use in str(caught.value.hint)


def test_every_option_the_serve_command_passes_is_refused_in_extra_args() -> None:
    """Drift guard: a typed serve setting that serve.py turns into a new option must be refused in
    serve.extra_args too, or the server could run with a value check never read."""
    stack = resolve("vllm-0.22-marlin", STACKS)
    serve = stack.manifest.serve.model_copy(
        update={
            "tensor_parallel_size": 2,
            "pipeline_parallel_size": 2,
            "kv_cache_dtype": "fp8",
            "dtype": "bfloat16",
            "enforce_eager": True,
            "speculative": Speculative(method="mtp"),
            "extra_args": [],
        }
    )
    full = replace(stack, manifest=stack.manifest.model_copy(update={"serve": serve}))
    passed = {arg for arg in serve_argv(full) if arg.startswith("-")}
    assert passed - set(command_options("vllm")) == set()
    ci = resolve("ci-mini", STACKS)
    assert {a for a in serve_argv(ci) if a.startswith("-")} - set(
        command_options("transformers")
    ) == set()


@pytest.mark.parametrize(
    "args",
    [
        ["--attention-backend", "FLASHINFER"],
        ["--attention_backend=FLASH_ATTN"],
        ["--attention-b", "FLASHINFER"],
        ["-ac", '{"backend": "flashinfer"}'],
        ["--attention-config.backend", "FLASHINFER"],
    ],
)
def test_an_attention_backend_in_extra_args_is_refused_for_the_typed_setting(
    args: list[str], write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    """serve.attention_backend names it, typed; any spelling vLLM's parser takes is refused."""
    _extra_args(write_stack, "named", "vllm-0.22-sm90-fp8kv", *args)
    with pytest.raises(StackError) as caught:
        resolve("named", stacks_dir)
    assert caught.value.key == "serve.extra_args[1]"
    assert "serve.attention_backend" in str(caught.value.hint)


def test_an_attention_config_without_a_backend_is_left_alone(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _extra_args(write_stack, "fa-v2", "vllm-0.22-sm90", "-ac", '{"flash_attn_version": 2}')
    assert resolve("fa-v2", stacks_dir).serve_path is not None


def test_the_backend_says_which_setting_named_it(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _child(write_stack, "typed", "vllm-0.22-sm90-fp8kv", serve={"attention_backend": "flashinfer"})
    stack = resolve("typed", stacks_dir)
    assert stack.serve_path is not None
    assert stack.serve_path.backend_from == "serve.attention_backend flashinfer"
    assert stack.jit_modules == ("sampling", FA2_D64_E4M3)
    assert serve_argv(stack)[-2:] == ["--attention-backend", "flashinfer"]


def test_an_auto_backend_leaves_the_choice_to_the_route(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    """`auto` is vLLM's own choice, not a backend named AUTO."""
    write_stack(
        "auto",
        {
            "extends": "vllm-0.22-marlin",
            "serve": {
                "kv_cache_dtype": "fp8",
                "dtype": "bfloat16",
                "model": {"head_dim": 128},
                "attention_backend": "auto",
            },
        },
    )
    path = resolve("auto", stacks_dir).serve_path
    assert path is not None and path.attention_backend == "FLASHINFER"
    assert path.modules == (FA2_D64_E4M3.replace("_64_", "_128_"),)


@pytest.mark.parametrize(
    "args, index, says",
    [
        (["--attention-backend", "--enforce-eager"], 1, "passes --attention-backend itself"),
        (["--attention-config.backend", "--disable-log-stats"], 1, "followed by the option"),
        (["--attention-config.backend"], 1, "followed by nothing"),
        (["-ac", "flashinfer"], 1, "is not a JSON object"),
        (["--attention-config", "[1]"], 1, "is not a JSON object"),
    ],
)
def test_an_attention_backend_vllm_would_refuse_is_exit_2(
    args: list[str],
    index: int,
    says: str,
    write_stack: Callable[..., Path],
    stacks_dir: Path,
    run_cli: Callable[..., Result],
) -> None:
    _extra_args(write_stack, "bad-backend", "vllm-0.22-marlin", *args)
    with pytest.raises(StackError) as caught:
        resolve("bad-backend", stacks_dir)
    assert caught.value.key == f"serve.extra_args[{index}]"
    assert says in caught.value.message
    result = run_cli("check", "bad-backend", stacks_dir=stacks_dir)
    assert result.exit_code == 2 and "Traceback" not in result.output


# --- vLLM versions no route covers ---------------------------------------------------------------


def test_a_vllm_no_route_covers_is_refused_at_its_pin(
    write_stack: Callable[..., Path], stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    """The reviewer's case: vllm 0.23.0 with the FlashInfer sampler on and an fp8 KV cache on
    sm120 passed check with neither the sampler nor an attention module."""
    path = write_stack(
        "vllm-023",
        {
            "extends": "vllm-0.33-marlin",  # FlashInfer 0.7.2.post1: no sampler-freeze rule
            "python": {"packages": {"vllm": "0.23.0"}},
            "env": {"VLLM_USE_FLASHINFER_SAMPLER": "1"},
            "serve": {"kv_cache_dtype": "fp8", "dtype": "bfloat16", "model": {"head_dim": 128}},
        },
    )
    result = run_cli("check", "vllm-023", stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    line = _line_of(path, "    vllm: 0.23.0")
    assert (
        f"vllm-023.yaml:{line}: python.packages.vllm: no route in "
        "knowledge/attention_routes.yaml covers vllm 0.23.0: add one (what its FlashInfer "
        "backend and sampler build) or pin a covered version"
    ) in result.output


def test_a_rule_on_an_uncovered_vllm_speaks_first(
    write_stack: Callable[..., Path], stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    """A compatibility rule on the version says more than "no route": check reports it."""
    write_stack(
        "b12x-021", {"extends": "vllm-0.22-b12x", "python": {"packages": {"vllm": "0.21.0"}}}
    )
    result = run_cli("check", "b12x-021", stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert "vLLM before 0.22 has no flashinfer_b12x MoE backend" in result.output
    assert "no route" not in result.output


def test_a_vllm_override_no_route_covers_is_refused_there(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    write_stack(
        "vllm-dev",
        {"extends": "vllm-0.22-marlin", "python": {"overrides": {"vllm": "0.24.0"}}},
    )
    with pytest.raises(StackError) as caught:
        resolve("vllm-dev", stacks_dir)
    assert caught.value.key == "python.overrides.vllm"
    assert "covers vllm 0.24.0" in caught.value.message


def test_a_route_covers_its_whole_minor_series(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    write_stack(
        "vllm-0223", {"extends": "vllm-0.22-sm90", "python": {"packages": {"vllm": "0.22.3"}}}
    )
    assert (
        resolve("vllm-0223", stacks_dir).jit_modules
        == resolve("vllm-0.22-sm90", STACKS).jit_modules
    )


@pytest.mark.parametrize("name", ["ci-mini", "ci-mini-sm90", "ci-mini-arm64"])
def test_stacks_without_vllm_need_no_route(name: str) -> None:
    if not (STACKS / f"{name}.yaml").is_file():
        pytest.skip(f"{name} is not in stacks/")
    stack = resolve(name, STACKS)
    assert stack.serve_path is None
    assert stack.jit_modules == ("norm",)


# --- model facts ---------------------------------------------------------------------------------


def test_every_optional_model_fact_stays_out_of_the_json_while_unset() -> None:
    """An optional Model fact missing from OPTIONAL_MODEL_FACTS would appear as null in every
    stack's JSON, and change every content hash, the day it is added."""
    optional = {
        name
        for name, field in Model.model_fields.items()
        if field.default is None and name != "draft_head_quantization"
    }
    assert optional == set(OPTIONAL_MODEL_FACTS)
    dumped = Model(id="m").model_dump(mode="json")
    assert not set(OPTIONAL_MODEL_FACTS) & set(dumped)


def test_models_with_some_sliding_window_layers_get_both_variants(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    """Gemma 2/3 interleave sliding-window and full-attention layers: vLLM plans each group with
    its own window, so FlashInfer builds use_swa_True and use_swa_False modules."""
    model = {"head_dim": 128, "sliding_window": 4096, "sliding_window_layers": "some"}
    _child(write_stack, "gemma", "vllm-0.22-sm90-fp8kv", serve={"model": model})
    fa2 = FA2_D64_E4M3.replace("_64_", "_128_")
    swa = fa2.replace("use_swa_False", "use_swa_True")
    assert resolve("gemma", stacks_dir).jit_modules == ("sampling", fa2, swa)
    _child(write_stack, "gemma-bf16", "gemma", serve={"kv_cache_dtype": "bfloat16"})
    bf16 = FA2_D64_BF16.replace("_64_", "_128_")
    bf16_swa = bf16.replace("use_swa_False", "use_swa_True")
    assert resolve("gemma-bf16", stacks_dir).jit_modules == (
        "sampling",
        bf16,
        bf16_swa,
        bf16 + "_sm90",
        bf16_swa + "_sm90",
    )
    _child(write_stack, "mistral", "gemma", serve={"model": {"sliding_window_layers": "all"}})
    assert resolve("mistral", stacks_dir).jit_modules == ("sampling", swa)


def test_sliding_window_layers_without_a_window_is_refused(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _child(
        write_stack, "half", "vllm-0.22-sm90", serve={"model": {"sliding_window_layers": "some"}}
    )
    with pytest.raises(StackError) as caught:
        resolve("half", stacks_dir)
    assert caught.value.key is not None and caught.value.key.startswith("serve.model")
    assert "sliding_window" in caught.value.message
