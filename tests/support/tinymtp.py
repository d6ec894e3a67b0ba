"""A random-weight NemotronH checkpoint with an MTP layer, its MoE in NVFP4 as ModelOpt writes it:
seed 000's model (Nemotron-3-Puzzle-75B-A9B-NVFP4) in miniature, a few MB.

Shaped as NVIDIA ships the real one: a Mamba-2 / attention / MoE hybrid (hybrid_override_pattern
"M*E"), one MTP layer (mtp_hybrid_override_pattern "*E": attention then MoE, num_nextn_predict_
layers 1), the routed experts of the main model quantized to NVFP4 in ModelOpt's checkpoint
format (packed e2m1 `weight` uint8 [N, K/2], per-16 `weight_scale` float8_e4m3fn [N, K/16], per-
tensor `weight_scale_2` and `input_scale` float32), everything else bf16 and named in
`exclude_modules` (the MTP head `mtp*` among them). Names and shapes are those vLLM 0.33.0's
loaders read (model_executor/models/nemotron_h.py, nemotron_h_mtp.py, layers/quantization/
modelopt.py). The weights are random: a server's answers are judged for shape only.

    python -m tests.support.tinymtp DEST     # writes DEST/tiny-nemotronh-mtp-nvfp4

torch, safetensors and transformers are imported lazily: collecting the tests must not need them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.support.tinymodel import VLLM_QA, _special_names, _tokenizer, _world_readable

NAME = "tiny-nemotronh-mtp-nvfp4"
SEED = 44
#: E2M1's magnitudes, by their 3-bit code (bit 3 is the sign).
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MAX, FP8_MAX, GROUP = 6.0, 448.0, 16
SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "hybrid_override_pattern": "M*E",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "mamba_num_heads": 8,
    "mamba_head_dim": 64,
    "n_groups": 1,
    "ssm_state_size": 128,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 128,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "n_shared_experts": 1,
    "moe_shared_expert_intermediate_size": 256,
    "num_nextn_predict_layers": 1,
    "mtp_hybrid_override_pattern": "*E",
}
#: Every module outside the main model's routed experts stays bf16, as ModelOpt lists it.
EXCLUDE = [
    "lm_head",
    "backbone.layers.0.mixer*",  # Mamba-2
    "backbone.layers.1.mixer*",  # attention
    "backbone.layers.2.mixer.gate*",
    "backbone.layers.2.mixer.shared_experts*",
    "mtp*",  # the MTP head, as NVIDIA ships it
]


def config(vocab_size: int, ids: dict[str, int]) -> dict[str, Any]:
    """config.json: NemotronH as transformers' NemotronHConfig reads it (the legacy pattern
    strings, which vLLM reads back through its properties), with the ModelOpt block."""
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "vocab_size": vocab_size,
        **SHAPE,
        "num_hidden_layers": len(SHAPE["hybrid_override_pattern"]),
        "mlp_hidden_act": "relu2",
        "mamba_hidden_act": "silu",
        "use_conv_bias": True,
        "mamba_proj_bias": False,
        "use_bias": False,
        "mlp_bias": False,
        "attention_bias": False,
        "routed_scaling_factor": 1.0,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "residual_in_fp32": False,
        "rescale_prenorm_residual": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        "quantization_config": quant_config()["quantization"] | {"quant_method": "modelopt"},
    }


def quant_config() -> dict[str, Any]:
    """hf_quant_config.json as ModelOpt writes it (vLLM reads this, or config.json's block)."""
    return {
        "producer": {"name": "modelopt", "version": "0.39.0"},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": None,
            "group_size": GROUP,
            "exclude_modules": list(EXCLUDE),
        },
    }


def quantize_nvfp4(weight: Any) -> dict[str, Any]:
    """One linear's [N, K] weight in ModelOpt's NVFP4 tensors: e2m1 codes packed two to a byte
    (even column in the low nibble), an FP8 scale per 16 columns, one FP32 scale over them."""
    import torch

    w = weight.float()
    rows, cols = w.shape
    scale_2 = w.abs().max().clamp(min=1e-8) / (FP4_MAX * FP8_MAX)
    blocks = w.view(rows, cols // GROUP, GROUP)
    block_scale = (blocks.abs().amax(-1) / FP4_MAX / scale_2).to(torch.float8_e4m3fn)
    scaled = blocks / (block_scale.float().clamp(min=2**-9) * scale_2).unsqueeze(-1)
    magnitudes = torch.tensor(E2M1)
    codes = (scaled.abs().unsqueeze(-1) - magnitudes).abs().argmin(-1)
    codes = (codes | ((scaled < 0).long() << 3)).view(rows, cols).to(torch.uint8)
    return {
        "weight": codes[:, 0::2] | (codes[:, 1::2] << 4),
        "weight_scale": block_scale,
        "weight_scale_2": scale_2.reshape(()),
        "input_scale": torch.tensor(1.0 / (FP4_MAX * FP8_MAX), dtype=torch.float32),
    }


def dequantize_nvfp4(tensors: dict[str, Any]) -> Any:
    """The bf16-free inverse, for checking: what a kernel computes from the four tensors."""
    import torch

    packed = tensors["weight"]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    values = torch.tensor(E2M1)[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    rows, cols = values.shape
    scale = tensors["weight_scale"].float().repeat_interleave(GROUP, dim=1)
    return values * scale * tensors["weight_scale_2"]


def _weights(vocab: int) -> dict[str, Any]:
    """Every tensor of the checkpoint, named as NVIDIA names them."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    h, bf16 = SHAPE["hidden_size"], torch.bfloat16

    def rand(*shape: int, std: float = 0.02) -> Any:
        return (torch.randn(*shape, generator=g) * std).to(bf16)

    def ones(n: int) -> Any:
        return torch.ones(n, dtype=bf16)

    nh, hd = SHAPE["mamba_num_heads"], SHAPE["mamba_head_dim"]
    d_inner, states = nh * hd, SHAPE["n_groups"] * SHAPE["ssm_state_size"]
    conv_dim = d_inner + 2 * states
    q, kv = (
        SHAPE["num_attention_heads"] * SHAPE["head_dim"],
        SHAPE["num_key_value_heads"] * SHAPE["head_dim"],
    )
    experts, inter = SHAPE["n_routed_experts"], SHAPE["moe_intermediate_size"]
    shared = SHAPE["moe_shared_expert_intermediate_size"]
    t: dict[str, Any] = {
        "backbone.embeddings.weight": rand(vocab, h),
        "backbone.norm_f.weight": ones(h),
        "lm_head.weight": rand(vocab, h),
    }
    m = "backbone.layers.0"
    t |= {
        f"{m}.norm.weight": ones(h),
        f"{m}.mixer.in_proj.weight": rand(2 * d_inner + 2 * states + nh, h),
        f"{m}.mixer.conv1d.weight": rand(conv_dim, 1, SHAPE["conv_kernel"], std=0.2),
        f"{m}.mixer.conv1d.bias": torch.zeros(conv_dim, dtype=bf16),
        f"{m}.mixer.A_log": torch.log(torch.linspace(1.0, 16.0, nh)).float(),
        f"{m}.mixer.D": torch.ones(nh, dtype=torch.float32),
        f"{m}.mixer.dt_bias": torch.zeros(nh, dtype=torch.float32),
        f"{m}.mixer.norm.weight": ones(d_inner),
        f"{m}.mixer.out_proj.weight": rand(h, d_inner),
    }

    def attention(prefix: str) -> dict[str, Any]:
        return {
            f"{prefix}.norm.weight": ones(h),
            f"{prefix}.mixer.q_proj.weight": rand(q, h),
            f"{prefix}.mixer.k_proj.weight": rand(kv, h),
            f"{prefix}.mixer.v_proj.weight": rand(kv, h),
            f"{prefix}.mixer.o_proj.weight": rand(h, q),
        }

    def moe(prefix: str, quantized: bool) -> dict[str, Any]:
        out = {
            f"{prefix}.norm.weight": ones(h),
            f"{prefix}.mixer.gate.weight": rand(experts, h),
            f"{prefix}.mixer.gate.e_score_correction_bias": torch.zeros(
                experts, dtype=torch.float32
            ),
            f"{prefix}.mixer.shared_experts.up_proj.weight": rand(shared, h),
            f"{prefix}.mixer.shared_experts.down_proj.weight": rand(h, shared),
        }
        for e in range(experts):
            for name, shape in (("up_proj", (inter, h)), ("down_proj", (h, inter))):
                key = f"{prefix}.mixer.experts.{e}.{name}"
                w = rand(*shape)
                if quantized:
                    out |= {f"{key}.{k}": v for k, v in quantize_nvfp4(w).items()}
                else:
                    out[f"{key}.weight"] = w
        return out

    t |= attention("backbone.layers.1")
    t |= moe("backbone.layers.2", quantized=True)
    # The MTP layer: fusion projections on its first sub-layer, the final norm on its last.
    t |= {
        "mtp.layers.0.enorm.weight": ones(h),
        "mtp.layers.0.hnorm.weight": ones(h),
        "mtp.layers.0.eh_proj.weight": rand(h, 2 * h),
    }
    t |= attention("mtp.layers.0")
    t |= moe("mtp.layers.1", quantized=False)
    t["mtp.layers.1.final_layernorm.weight"] = ones(h)
    return t


def write(dest: Path) -> Path:
    """Write the checkpoint directory dest/NAME and return it."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    out = dest / NAME
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer([text for pair in VLLM_QA for text in pair])
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in _special_names().items()}
    tokenizer.save_pretrained(out)
    save_file(_weights(len(tokenizer)), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config(len(tokenizer), ids), indent=2) + "\n")
    (out / "hf_quant_config.json").write_text(json.dumps(quant_config(), indent=2) + "\n")
    GenerationConfig(
        do_sample=False, bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    ).save_pretrained(out)
    _world_readable(out)
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))
