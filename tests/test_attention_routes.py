"""The FlashInfer modules a stack's serve settings select (builder/spec/servepath.py over
knowledge/attention_routes.yaml): the attention route per vLLM version, GPU and KV cache dtype,
the sampler from its variable, module names spelled as FlashInfer spells them, and a located
exit-2 error where a route needs a model fact the manifest lacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result

from builder.errors import StackError
from builder.render.context import render
from builder.spec.jitmodules import jit_modules_known
from builder.spec.resolve import jit_module_table, resolve
from builder.spec.servepath import attention_backend_option
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


@pytest.mark.parametrize("name", ["vllm-0.22-marlin", "vllm-0.22-b12x"])
def test_the_022_sm120_stacks_select_no_flashinfer_module(name: str) -> None:
    """Auto KV cache on sm120 keeps vLLM's FLASH_ATTN; the sampler is off by its variable."""
    stack = resolve(name, STACKS)
    assert stack.serve_path is not None
    assert stack.serve_path.attention_backend == "FLASH_ATTN"
    assert stack.serve_path.modules == ()
    assert stack.jit_modules == ("fp4_gemm_cutlass_sm120",)


@pytest.mark.parametrize("name", ["vllm-0.33-marlin", "vllm-0.33-b12x", "vllm-0.33-spark"])
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
    assert derived["serve_path"]["attention_backend_from"] == "--attention-backend FLASHINFER"


def test_the_serve_path_stays_out_of_the_image_identity() -> None:
    stack = resolve("vllm-0.22-sm90", STACKS)
    assert "serve_path" not in stack.to_json(editorial=False)["derived"]


# --- module tables -------------------------------------------------------------------------------


def test_derived_modules_are_in_the_images_table_and_nothing_else_changes() -> None:
    listed = jit_module_table()
    for name in ("ci-mini", "vllm-0.33-b12x", "vllm-0.22-sm90"):
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
    ],
)
def test_the_attention_backend_option(args: list[str], expected: Any) -> None:
    assert attention_backend_option(args) == expected


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
        serve={"extra_args": ["--attention-backend", "FLASH_ATTN"]},
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


def test_a_033_stack_routed_to_flashinfer_is_refused(
    write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    _child(
        write_stack,
        "new-fp8",
        "vllm-0.33-marlin",
        serve={"kv_cache_dtype": "fp8_e4m3", "dtype": "bfloat16", "model": {"head_dim": 128}},
    )
    with pytest.raises(StackError) as caught:
        resolve("new-fp8", stacks_dir)
    assert caught.value.key == "serve.kv_cache_dtype"
    assert caught.value.file == stacks_dir / "new-fp8.yaml"
    assert "not derived" in caught.value.message


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
