"""Make the tiny Llama that stacks/vllm-0.33-sm90-tp2pp2.yaml serves on four GPUs (issue 27).

The H200 proofs serve tests/support/tinymodel.py's VLLM_SHAPE model (hidden 256 over 4 heads of
64, 2 layers). Tensor parallel 2 x pipeline parallel 2 needs more of it to split: vLLM gives each
tensor-parallel rank an equal share of the query heads, the KV heads and the MLP's width, and
each pipeline stage an equal run of decoder layers (vllm.distributed.utils.get_pp_indices), so
this variant has 4 layers: two per stage, two heads of each kind per rank. The same questions
are trained in, so the stack's smoke prompts get their answers.

    PYTHONPATH=. .venv/bin/python bench/make_tiny_llama_tp2pp2.py DEST [--untrained]

DEST then holds config.json, the weights and the tokenizer; mount it at
/models/tiny-llama-tp2pp2. After writing, the script reads config.json back and refuses (exit 1)
a model that does not split.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.tinymodel import VLLM_QA, VLLM_SHAPE, make_tiny_model

TENSOR_PARALLEL, PIPELINE_PARALLEL = 2, 2
#: VLLM_SHAPE with 4 decoder layers: 4 query and 4 KV heads, MLP 512 wide, 2 layers a stage.
TP2PP2_SHAPE: dict[str, int] = {**VLLM_SHAPE, "layers": 4}
TRAIN_STEPS = 400


def split_problems(config: dict[str, Any], tensor: int, pipeline: int) -> list[str]:
    """What of a Hugging Face config.json does not divide over tensor x pipeline ranks, in
    words; [] when it splits. Only the divisions vLLM requires of a dense Llama are asked."""
    problems = []
    for field, by in (
        ("num_attention_heads", tensor),
        ("num_key_value_heads", tensor),
        ("intermediate_size", tensor),
        ("num_hidden_layers", pipeline),
    ):
        value = config.get(field)
        if not isinstance(value, int) or value < by or value % by:
            problems.append(f"{field} {value} does not split {by} ways")
    return problems


def make(dest: Path, trained: bool = True) -> Path:
    return make_tiny_model(
        dest, VLLM_QA, TRAIN_STEPS, trained=trained, dtype="bfloat16", **TP2PP2_SHAPE
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument(
        "--untrained", action="store_true", help="random weights (the config alone)"
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    out = make(args.dest, trained=not args.untrained)
    config = json.loads((out / "config.json").read_text())
    problems = split_problems(config, TENSOR_PARALLEL, PIPELINE_PARALLEL)
    for problem in problems:
        print(f"error: {out}/config.json: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"{out}: {config['num_hidden_layers']} layers, {config['num_attention_heads']} heads "
        f"({config['num_key_value_heads']} KV), splits TP {TENSOR_PARALLEL} x PP "
        f"{PIPELINE_PARALLEL}; {time.monotonic() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
