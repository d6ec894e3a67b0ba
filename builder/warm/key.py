"""A warm-cache artifact's key: everything a server's runtime caches are valid for.

Every layer below falls back to compiling silently when its own key differs, so this key is
deliberately wider than any one of them: the image digest (vLLM, torch, Triton, FlashInfer and
their code hashes), the GPU product and its SM count (Triton, CuTe-DSL and the autotuner
specialise on them), the driver (the CUDA driver's PTX cache is valid for one driver), the model
and its revision, the serve command and environment, the parallel shape (one cache folder per
rank), and the mount path (Triton's and vLLM's keys hold absolute paths). A restore happens only
on an exact match; anything else is named field by field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from builder.engine.hostprobe import HostFacts
from builder.knowledge.gpu_products import sm_count
from builder.knowledge.strict import Strict
from builder.knowledge.text import SafeText
from builder.vllmcli.vllm_argv import last_value

Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]


class WarmKey(Strict):
    schema_version: Literal[1] = 1
    #: The image manifest's digest (sha256:...), whichever registry serves it.
    image: Digest
    #: The product name of each GPU the container gets, in device order; [] for none.
    gpus: list[SafeText]
    #: Streaming multiprocessors of that product (knowledge/gpu_products.yaml); None: unknown.
    sm_count: int | None
    capability: SafeText | None
    driver: SafeText | None
    model: SafeText
    #: A Hugging Face snapshot's commit, or a digest of the model folder's file names and sizes.
    model_revision: SafeText
    #: sha256 over the serve command and environment, canonical JSON; serve_covers lists them.
    serve_hash: Digest
    serve_covers: list[SafeText]
    tensor_parallel: int = Field(ge=1)
    pipeline_parallel: int = Field(ge=1)
    #: Where the cache volume is mounted in the container (absolute paths in the caches).
    mount: SafeText

    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(canonical(self.model_dump())).hexdigest()

    def differences(self, other: WarmKey) -> list[str]:
        """Each field in which other (an artifact's key) differs from this one (the host's), in
        words: `driver: 580.95.05 here, 575.57.08 in the artifact`."""
        mine, theirs = self.model_dump(), other.model_dump()
        return [
            f"{name}: {_text(mine[name])} here, {_text(theirs[name])} in the artifact"
            for name in mine
            if mine[name] != theirs[name]
        ]


def serve_identity(command: Sequence[str], env: dict[str, str]) -> tuple[str, list[str]]:
    """The serve command and environment's hash, and what it covers."""
    data = {"command": list(command), "env": dict(sorted(env.items()))}
    covers = ["command", *(f"env {name}" for name in sorted(env))]
    return "sha256:" + hashlib.sha256(canonical(data)).hexdigest(), covers


def parallel_shape(command: Sequence[str]) -> tuple[int, int]:
    """Tensor- and pipeline-parallel sizes the serve command asks for (1 when unset)."""
    sizes = []
    for option, alias in (("--tensor-parallel-size", "-tp"), ("--pipeline-parallel-size", "-pp")):
        found = last_value(command, option, (alias,))
        sizes.append(int(found.value) if found and found.value.isdigit() else 1)
    return sizes[0], sizes[1]


def model_of(command: Sequence[str]) -> str:
    """The model a serve command serves: `ENGINE serve MODEL ...`, else its --model."""
    if len(command) > 2 and command[1] == "serve" and not command[2].startswith("-"):
        return command[2]
    found = last_value(command, "--model")
    return found.value if found else "unknown"


def gpu_identity(
    facts: HostFacts, indices: list[int] | None
) -> tuple[list[str], str | None, int | None]:
    """(product names, capability, SM count) of the GPUs a container gets: all of the host's
    for None, these indices otherwise ([] for none)."""
    chosen = [g for g in facts.gpus if indices is None or g.index in indices]
    names = [g.name for g in chosen]
    capability = chosen[0].capability if chosen else None
    return names, capability, sm_count(names[0]) if names else None


def canonical(data: object) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _text(value: object) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)
