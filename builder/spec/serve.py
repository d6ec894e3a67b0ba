"""The serve command a stack's image runs, derived once from the manifest.

The Dockerfile's CMD, a host's pin and the smoke server all start the same argv: one definition.
"""

from __future__ import annotations

from typing import Any

from builder.spec.resolve import ResolvedStack, canonical_json


def serve_argv(stack: ResolvedStack) -> list[str]:
    """The serve command as an argv list (exec form: no shell ever parses it)."""
    serve = stack.manifest.serve
    if serve.engine == "transformers":
        argv = [
            "transformers",
            "serve",
            serve.model.id,
            "--host",
            "0.0.0.0",
            "--port",
            str(serve.port),
        ]
        return argv + list(serve.extra_args)
    argv = ["vllm", "serve", serve.model.id, "--host", "0.0.0.0", "--port", str(serve.port)]
    options: list[tuple[str, Any]] = [
        ("--served-model-name", serve.served_model_name),
        ("--moe-backend", serve.moe_backend),
        ("--tensor-parallel-size", serve.tensor_parallel_size),
        ("--pipeline-parallel-size", serve.pipeline_parallel_size),
        ("--max-model-len", serve.max_model_len),
        ("--kv-cache-dtype", serve.kv_cache_dtype),
        ("--gpu-memory-utilization", serve.gpu_memory_utilization),
        ("--dtype", serve.dtype),
    ]
    for flag, value in options:
        if value is not None and not (flag.endswith("parallel-size") and value == 1):
            argv += [flag, str(value)]
    if serve.enforce_eager:
        argv.append("--enforce-eager")
    if serve.speculative is not None:
        argv += ["--speculative-config", canonical_json(serve.speculative.model_dump())]
    return argv + list(serve.extra_args)
