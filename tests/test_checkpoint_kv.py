"""A model folder whose checkpoint stores an fp8 KV cache is read where it is at hand, and a
stack whose derivation does not know it is refused (it would compile FlashInfer attention at
every fresh start on sm12x)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from builder.errors import StackError
from builder.manifest.checkpoint import check_checkpoint, checkpoint_kv_dtype
from builder.manifest.resolve import resolve

MODELOPT = {
    "producer": {"name": "modelopt"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"},
}


def _model(folder: Path, **files: object) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name.replace("_json", ".json")).write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize(
    "files",
    [
        {"hf_quant_config_json": MODELOPT},
        {"config_json": {"quantization_config": {"kv_cache_quant_algo": "FP8"}}},
        {"config_json": {"quantization_config": {"kv_cache_scheme": {"type": "float"}}}},
    ],
)
def test_each_format_is_read(files: dict[str, object], tmp_path: Path) -> None:
    dtype, where = checkpoint_kv_dtype(_model(tmp_path / "m", **files))
    assert dtype == "fp8_e4m3" and where is not None


def test_a_plain_checkpoint_says_nothing_and_an_unknown_value_is_an_error(tmp_path: Path) -> None:
    assert checkpoint_kv_dtype(_model(tmp_path / "plain", config_json={"hidden_size": 8})) == (
        None,
        None,
    )
    odd = _model(
        tmp_path / "odd", hf_quant_config_json={"quantization": {"kv_cache_quant_algo": "INT4"}}
    )
    with pytest.raises(StackError, match="does not know"):
        checkpoint_kv_dtype(odd)


def test_a_stack_that_does_not_know_the_checkpoints_fp8_kv_is_refused(
    tmp_path: Path, stacks_dir: Path, write_stack: Callable[..., Path]
) -> None:
    folder = _model(tmp_path / "nvfp4", hf_quant_config_json=MODELOPT)
    stack = resolve("vllm-0.22-marlin", stacks_dir)
    with pytest.raises(StackError) as caught:
        check_checkpoint(stack, folder)
    assert caught.value.key == "serve.model.checkpoint_kv_cache_dtype"
    assert "fp8_e4m3" in str(caught.value.hint)
    write_stack(
        "knows",
        {
            "extends": "vllm-0.22-marlin",
            "serve": {
                "model": {"checkpoint_kv_cache_dtype": "fp8_e4m3", "head_dim": 128},
                "dtype": "bfloat16",
            },
        },
    )
    assert "fp8_e4m3" in str(check_checkpoint(resolve("knows", stacks_dir), folder))


def test_test_refuses_the_mounted_model_before_any_engine_is_asked(
    tmp_path: Path, stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    """The flagship's model as `hf download` leaves it under HF_HOME on the host."""
    stack = resolve("vllm-0.22-marlin", stacks_dir)
    home = stack.manifest.env.get("HF_HOME")
    if home is None:
        pytest.skip("the stack sets no HF_HOME")
    models = tmp_path / "models"
    repo = "models--" + stack.manifest.serve.model.id.replace("/", "--")
    hub = Path(home.removeprefix("/models/")) / "hub" / repo / "snapshots" / "abc123"
    _model(models / hub, hf_quant_config_json=MODELOPT)
    result = run_cli(
        "test", "vllm-0.22-marlin", "--volume", f"{models}:/models", stacks_dir=stacks_dir
    )
    assert result.exit_code == 2, result.output
    assert "checkpoint_kv_cache_dtype" in result.output and "Traceback" not in result.output
