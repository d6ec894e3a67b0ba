"""The MTP checkpoint writer (tests/support/tinymtp.py): seed 000's model shape in miniature,
its main MoE in ModelOpt's NVFP4 format and its MTP head left out of quantization."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

import pytest

from tests.support import tinymtp

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tinymtp.write(tmp_path_factory.mktemp("tinymtp"))


def _excluded(name: str) -> bool:
    """ModelOpt's rule (vLLM modelopt.py is_layer_excluded, apply_vllm_mapper): `path*` covers
    the module and everything under it."""
    module = name.rsplit(".", 1)[0]
    return any(fnmatch(module, p) or fnmatch(name, p) for p in tinymtp.EXCLUDE)


def test_transformers_config_parser_reads_it_as_vllm_does(checkpoint: Path) -> None:
    """vLLM 0.33 reads the config through transformers' AutoConfig (NemotronHConfig), then the
    pattern properties nemotron_h.py and nemotron_h_mtp.py use, and promotes a nemotron_h
    config with num_nextn_predict_layers > 0 to its MTP draft (config/speculative.py:895-906)."""
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    assert config.model_type == "nemotron_h"
    assert config.hybrid_override_pattern == "M*E"
    assert config.mtp_hybrid_override_pattern == "*E"
    assert config.num_hidden_layers == 3
    assert config.num_nextn_predict_layers == 1
    quant = config.quantization_config
    assert quant["quant_method"] == "modelopt" and quant["quant_algo"] == "NVFP4"
    assert quant["group_size"] == 16
    assert "mtp*" in quant["exclude_modules"]


def test_main_moe_is_nvfp4_and_everything_else_bf16(checkpoint: Path) -> None:
    tensors = safetensors_torch.load_file(checkpoint / "model.safetensors")
    h, inter = tinymtp.SHAPE["hidden_size"], tinymtp.SHAPE["moe_intermediate_size"]
    experts = tinymtp.SHAPE["n_routed_experts"]
    quantized = [n for n in tensors if n.endswith(".weight_scale_2")]
    assert len(quantized) == 2 * experts  # up and down of each routed expert, main model only
    assert all(n.startswith("backbone.layers.2.mixer.experts.") for n in quantized)
    up = "backbone.layers.2.mixer.experts.0.up_proj"
    assert tensors[f"{up}.weight"].dtype == torch.uint8
    assert tuple(tensors[f"{up}.weight"].shape) == (inter, h // 2)
    assert tensors[f"{up}.weight_scale"].dtype == torch.float8_e4m3fn
    assert tuple(tensors[f"{up}.weight_scale"].shape) == (inter, h // 16)
    assert tensors[f"{up}.weight_scale_2"].dtype == torch.float32
    assert tensors[f"{up}.input_scale"].shape == ()
    # The MTP head's MoE: unquantized, as NVIDIA ships it.
    mtp = tensors["mtp.layers.1.mixer.experts.0.up_proj.weight"]
    assert mtp.dtype == torch.bfloat16 and tuple(mtp.shape) == (inter, h)
    for name, tensor in tensors.items():
        if ".experts." in name and name.startswith("backbone."):
            assert not _excluded(name), name
        elif tensor.is_floating_point() and tensor.dim() >= 2:
            assert _excluded(name) or "embeddings" in name, f"{name} is bf16 but not excluded"


def test_nvfp4_round_trip_is_within_e2m1_precision() -> None:
    weight = torch.randn(64, 128) * 0.02
    tensors = tinymtp.quantize_nvfp4(weight)
    back = tinymtp.dequantize_nvfp4(tensors)
    assert back.shape == weight.shape
    # e2m1 keeps ~1 significant bit: the error is bounded by half a step of each block's scale
    error = (back - weight).abs().max().item()
    assert error <= 0.25 * weight.abs().max().item()
    assert torch.corrcoef(torch.stack([back.flatten(), weight.flatten()]))[0, 1] > 0.95


def test_quant_config_file_matches_config_json(checkpoint: Path) -> None:
    import json

    hf_quant = json.loads((checkpoint / "hf_quant_config.json").read_text())
    config = json.loads((checkpoint / "config.json").read_text())
    assert (
        hf_quant["quantization"]["exclude_modules"]
        == config["quantization_config"]["exclude_modules"]
    )
    assert (checkpoint / "model.safetensors").stat().st_size < 8 * 1024 * 1024
