"""What a model folder says about its KV cache, read where a folder is at hand.

From vLLM 0.22 on, `--kv-cache-dtype auto` (the default) serves the KV cache in the
checkpoint's own dtype, and on sm12x an fp8 KV cache means FlashInfer attention: modules the
image must have precompiled, derived only when the manifest says so
(serve.model.checkpoint_kv_cache_dtype). A checkpoint that says fp8 under a manifest that does
not would compile at serve time while every check passed, so it is refused with what to write.
The file formats are data (knowledge/checkpoint_kv.yaml).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field

from builder.errors import StackError
from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.model_shapes import checkpoint_experts
from builder.knowledge.strict import Strict
from builder.manifest.resolve import ResolvedStack, rule_facts
from builder.manifest.rules import evaluate


class _Source(Strict):
    file: str
    key: list[str] = Field(min_length=1)


class _Formats(Strict):
    sources: list[_Source]
    values: dict[str, str | None]


@cache
def _formats() -> _Formats:
    return parse_document(read_knowledge("checkpoint_kv.yaml"), _Formats)


def checkpoint_kv_dtype(model_dir: Path) -> tuple[str | None, str | None]:
    """(the KV cache dtype the checkpoint asks for or None, where it said so)."""
    formats = _formats()
    for source in formats.sources:
        path = model_dir / source.file
        if not path.is_file():
            continue
        try:
            value: Any = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise StackError(f"cannot read {path} as JSON: {exc}", file=path) from None
        for part in source.key:
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            continue
        where = f"{path.name} {'.'.join(source.key)}: {value}"
        text = str(value).lower()
        if text not in formats.values:
            raise StackError(
                f"{where}: a KV cache quantization this tool does not know",
                file=path,
                hint="add it to knowledge/checkpoint_kv.yaml (what vLLM serves it as)",
            )
        return formats.values[text], where
    return None, None


def check_checkpoint_rules(stack: ResolvedStack, model_dir: Path) -> str | None:
    """The rules again with the folder's own expert count (config.json) instead of
    knowledge/models.yaml's: a checkpoint the table does not know, or one that differs from it,
    is judged on what it is. Refused with the rule's words; the count in words otherwise."""
    experts, where = checkpoint_experts(model_dir)
    if experts is None:
        return None
    facts = rule_facts(stack) | {"model.routed_experts": experts}
    fired = [v for v in evaluate(facts) if "model.routed_experts" in v.rule.when]
    if fired:
        raise StackError(
            f"the checkpoint at {model_dir} ({where}): known-bad combination: "
            f"{fired[0].describe()}",
            key=fired[0].rule.key,
        )
    return f"checkpoint {where}"


def check_checkpoint(stack: ResolvedStack, model_dir: Path) -> str | None:
    """Refuse a model folder whose KV cache dtype the stack's derivation does not know, or whose
    expert count a rule refuses; the finding in words when it agrees (None: nothing to say)."""
    experts_said = check_checkpoint_rules(stack, model_dir)
    asked, where = checkpoint_kv_dtype(model_dir)
    serve = stack.manifest.serve
    declared = serve.model.checkpoint_kv_cache_dtype
    if asked is None:
        return experts_said
    explicit = serve.kv_cache_dtype not in (None, "auto")
    if declared is None and not explicit:
        raise StackError(
            f"the checkpoint at {model_dir} stores its KV cache as {asked} ({where}); with "
            "kv_cache_dtype auto, vLLM serves it so (FlashInfer attention on sm12x), but the "
            f"stack {stack.name} derives its modules for the model's own dtype: they would "
            "compile at every fresh start",
            key="serve.model.checkpoint_kv_cache_dtype",
            hint=f"write serve.model.checkpoint_kv_cache_dtype: {asked} (and head_dim) in the "
            "manifest, so the modules are precompiled; or serve.kv_cache_dtype: bfloat16",
        )
    return (
        f"checkpoint KV cache {asked} ({where}); the stack says {declared or serve.kv_cache_dtype}"
    )


__all__ = ["check_checkpoint", "check_checkpoint_rules", "checkpoint_kv_dtype"]
