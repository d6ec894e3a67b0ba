"""One table from the typed serve settings to the options of the serve command.

The serve command (manifest/serve.py) is rendered from this table, and `check` refuses each of its
options in serve.extra_args from the same table (manifest/servepath.py): an option passed twice
reaches the server with whichever comes last, while `check` (its rules, the FlashInfer modules
derived for the serve path) reads only the typed setting. One table means a typed setting that
gains an option is refused in extra_args without anyone remembering to.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ServeEngine = str
#: vLLM's attention backend option, and the attention config whose `backend` key names it too
#: (vllm/engine/arg_utils.py).
BACKEND_OPTION = "--attention-backend"
ATTENTION_CONFIG_OPTIONS = ("--attention-config", "-ac")
#: Options of vLLM's that no typed setting renders but the readers need to tell apart from
#: abbreviations of those that do (`doctor`'s tensor-parallel checks read the last one).
OTHER_VLLM_OPTIONS = (*ATTENTION_CONFIG_OPTIONS, "--disable-custom-all-reduce")
_BOTH = ("vllm", "transformers")


def _canonical(value: Any) -> str:
    """As resolve.canonical_json writes it (the serve command is part of the content hash)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True)
class ServeFlag:
    """A typed serve setting and the option that carries it to the server."""

    #: The key under `serve:` (a dotted path for a nested one).
    field: str
    flag: str
    #: Other spellings of the same option (short forms, negations, shorthands of its keys).
    aliases: tuple[str, ...] = ()
    engines: tuple[ServeEngine, ...] = ("vllm",)
    #: The option's words for a value; none for a value that leaves vLLM's default.
    words: Callable[[str, Any], list[str]] | None = None
    #: What to write instead, when the option shows up in serve.extra_args.
    instead: str = ""

    def render(self, serve: object) -> list[str]:
        """The option's words for the manifest's `serve:` (any object with its fields: this
        room sits below the manifest and does not import its schema)."""
        value = getattr(serve, self.field, None)
        if self.words is not None:
            return self.words(self.flag, value)
        return [] if value is None else [self.flag, str(value)]

    def advice(self) -> str:
        return self.instead or f"use serve.{self.field} (and drop the option from serve.extra_args)"


def _parallel(flag: str, value: Any) -> list[str]:
    return [] if value in (None, 1) else [flag, str(value)]


def _switch(flag: str, value: Any) -> list[str]:
    return [flag] if value else []


def _speculative(flag: str, value: Any) -> list[str]:
    return [] if value is None else [flag, _canonical(value.model_dump())]


#: In the order the serve command passes them, after the engine's `serve MODEL --host 0.0.0.0`.
SERVE_FLAGS: tuple[ServeFlag, ...] = (
    ServeFlag("port", "--port", engines=_BOTH),
    ServeFlag("served_model_name", "--served-model-name"),
    ServeFlag("moe_backend", "--moe-backend"),
    ServeFlag("tensor_parallel_size", "--tensor-parallel-size", ("-tp",), words=_parallel),
    ServeFlag("pipeline_parallel_size", "--pipeline-parallel-size", ("-pp",), words=_parallel),
    ServeFlag("max_model_len", "--max-model-len"),
    ServeFlag("kv_cache_dtype", "--kv-cache-dtype"),
    ServeFlag("gpu_memory_utilization", "--gpu-memory-utilization"),
    ServeFlag("dtype", "--dtype"),
    ServeFlag("enforce_eager", "--enforce-eager", ("--no-enforce-eager",), words=_switch),
    # vLLM 0.33's --spec-method and --spec-tokens are shorthands for keys of this config.
    ServeFlag(
        "speculative",
        "--speculative-config",
        ("-sc", "--spec-method", "--spec-tokens"),
        words=_speculative,
    ),
    ServeFlag("attention_backend", BACKEND_OPTION),
)
#: Options every serve command passes that no setting names, with what to do instead.
FIXED_OPTIONS: dict[ServeEngine, dict[str, str]] = {
    "transformers": {
        "--host": "the serve command listens on 0.0.0.0; choose the address where the port is "
        "published",
    },
}
FIXED_OPTIONS["vllm"] = {
    **FIXED_OPTIONS["transformers"],
    "--model": "use serve.model.id (and drop the option from serve.extra_args)",
}


def command_options(engine: ServeEngine) -> dict[str, str]:
    """Every option the engine's serve command passes itself, with what to write instead."""
    options = dict(FIXED_OPTIONS[engine])
    for flag in SERVE_FLAGS:
        if engine in flag.engines:
            for spelling in (flag.flag, *flag.aliases):
                options[spelling] = flag.advice()
    return options


def vllm_options() -> tuple[str, ...]:
    """Every vLLM option the project reads, to tell what an abbreviation stands for."""
    return (*command_options("vllm"), *OTHER_VLLM_OPTIONS)


__all__ = [
    "ATTENTION_CONFIG_OPTIONS",
    "BACKEND_OPTION",
    "FIXED_OPTIONS",
    "SERVE_FLAGS",
    "ServeFlag",
    "command_options",
    "vllm_options",
]
