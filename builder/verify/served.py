"""A smoke report, read as a served verdict: on which GPU kind the image served, with what.

A smoke against the image's own serve command is what "served" means: the GPU's product name,
how many, its driver, the model, the serve arguments, the compiles the log showed by kind and
the speeds go into the verdict, so that a host of the same GPU kind can be pinned to the image
on its strength (`pin`), and anyone reading the registry sees what it served on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from builder.engine.hostprobe import HostFacts
from builder.image.records import CPU, ServedVerdict
from builder.manifest.resolve import ResolvedStack
from builder.manifest.serve import serve_argv


def served_verdict(
    stack: ResolvedStack,
    smoke: dict[str, Any],
    facts: HostFacts | None,
    source: Literal["test", "smoke --url"],
    gpu_kind: str | None = None,
) -> ServedVerdict:
    """smoke: a smoke report's JSON; facts: the serving host's GPUs (None for a CPU stack);
    gpu_kind: the kind as the caller names it, where the host's GPUs could not be read."""
    serve = stack.manifest.serve
    gpus = facts.gpus if facts is not None else ()
    if not stack.manifest.smoke.needs_gpu:
        kind, count = CPU, 0
    elif gpus:
        kind, count = gpus[0].name, len(gpus)
    elif gpu_kind:
        kind, count = gpu_kind, 1
    else:
        raise ValueError("a GPU smoke's verdict needs the GPU kind it served on")
    compiles = {
        str(item["kind"]): int(item.get("compiles") or 0)
        for item in (smoke.get("runtime_compiles") or {}).get("kinds", [])
    }
    driver = smoke.get("driver_cache")
    if driver is not None:
        compiles["cuda_driver"] = int(driver.get("files") or 0)  # files its PTX JIT wrote
    return ServedVerdict(
        gpu_kind=kind,
        gpu_count=count,
        capability=gpus[0].capability if gpus else None,
        sm_count=None,
        driver=facts.driver if facts is not None and gpus else None,
        cuda=stack.manifest.cuda,
        model_id=serve.model.id,
        model_revision=None,  # the manifest names no revision; the model id is all it pins
        serve_args=serve_argv(stack),
        compiles=compiles,
        ttft_s=smoke.get("ttft_s"),
        single_stream_tok_s=smoke.get("single_stream_tok_s"),
        batched_tok_s=smoke.get("batched_tok_s"),
        passed=bool(smoke.get("passed")),
        source=source,
        at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


__all__ = ["served_verdict"]
