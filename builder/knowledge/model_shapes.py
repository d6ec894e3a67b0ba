"""The shapes of the stacks' models that rules key on (knowledge/models.yaml), where no model
folder is at hand: `check` runs on build machines that never download a checkpoint, and a rule
such as b12x's 512-expert crash must still fire there. At `test` the folder's config.json wins.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from builder.errors import StackError
from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict

MODELS_FILE = "models.yaml"


class ModelShape(Strict):
    routed_experts: int
    experts_per_token: int
    source: str


class _ModelsFile(Strict):
    expert_keys: list[str]
    models: dict[str, ModelShape]


@cache
def _models() -> _ModelsFile:
    return parse_document(read_knowledge(MODELS_FILE), _ModelsFile)


def known_shape(model_id: str) -> ModelShape | None:
    """The table's entry for a model id (None: not a model the table knows)."""
    return _models().models.get(model_id)


def checkpoint_experts(model_dir: Path) -> tuple[int | None, str | None]:
    """(routed experts per MoE layer from the folder's config.json, where it said so); (None,
    None) where the folder has no config.json or it names none of the expert keys."""
    path = model_dir / "config.json"
    if not path.is_file():
        return None, None
    try:
        config: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StackError(f"cannot read {path} as JSON: {exc}", file=path) from None
    for key in _models().expert_keys:
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value, f"config.json {key}: {value}"
    return None, None


__all__ = ["ModelShape", "checkpoint_experts", "known_shape"]
