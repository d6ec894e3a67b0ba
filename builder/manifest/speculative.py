"""The draft of a speculative-decoding stack: its settings checked per vLLM version, and the MoE
backend its layers run on.

vLLM's SpeculativeConfig lets a draft have its own MoE backend, attention backend and KV cache
dtype (vllm/config/speculative.py); which keys a version has, and how an unquantized draft's MoE
backend is chosen there, was read from each wheel into knowledge/speculative_config.yaml. A key
the pinned vLLM lacks would stop the server at start: `check` refuses it here instead (exit 2 at
the key, with what the version takes). An MTP head NVIDIA ships unquantized runs its MoE on an
unquantized backend whatever --moe-backend says for the NVFP4 target; which one, and what it
needs of the image (a FlashInfer module to precompile, Triton kernels compiled at first use),
is derived here for `show`, the rules and the JIT module list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version
from pydantic import Field

from builder.knowledge.loader import ManifestKeyError, parse_document, read_knowledge
from builder.knowledge.strict import Strict
from builder.manifest.model import DRAFT_SETTINGS, Manifest, Speculative
from builder.vllmcli.vllm_argv import speculative_config

SPECULATIVE_FILE = "speculative_config.yaml"
#: Draft head quantizations that make the draft's MoE an unquantized layer.
UNQUANTIZED_HEADS = ("bf16", "fp16")


class _DraftMoe(Strict):
    falls_to_auto: list[str]
    falls_to_auto_at: str
    unquantized: list[str]
    unquantized_at: str
    auto: dict[str, str]
    auto_at: str = ""


class _Version(Strict):
    vllm: str
    read: str
    #: Draft setting -> where the wheel defines it (FILE:LINE).
    keys: dict[str, str]
    moe_backends: list[str]
    draft_moe: _DraftMoe


class _Backend(Strict):
    flashinfer_modules: dict[str, list[str]] = Field(default_factory=dict)
    runtime_compiles: list[str] = Field(default_factory=list)


class _SpeculativeFile(Strict):
    versions: list[_Version]
    backends: dict[str, _Backend]


@cache
def _knowledge() -> _SpeculativeFile:
    return parse_document(read_knowledge(SPECULATIVE_FILE), _SpeculativeFile)


def _entry(vllm: str) -> _Version | None:
    return next((v for v in _knowledge().versions if Version(vllm) in SpecifierSet(v.vllm)), None)


@dataclass(frozen=True)
class DraftPath:
    """What the draft's MoE runs on, and why: `show` prints it under derived.draft."""

    method: str
    #: The exact --speculative-config argument the serve command passes.
    config: str
    #: The unquantized draft MoE's backend as vLLM resolves it; None for a quantized draft
    #: head, a model without MoE, or a version whose choice was not read.
    moe_backend: str | None
    moe_backend_from: str
    #: FlashInfer modules the draft's backend loads on the stack's GPUs (added to the stack's
    #: JIT modules only where the manifest names the backend: `auto` is a rule's business).
    flashinfer_modules: tuple[str, ...] = ()
    #: Runtime compile kinds (knowledge/runtime_compiles.yaml) the draft's backend adds.
    runtime_compiles: tuple[str, ...] = ()
    #: Whether serve.speculative.moe_backend named the backend.
    named: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "speculative_config": self.config,
            "moe_backend": self.moe_backend,
            "moe_backend_from": self.moe_backend_from,
            "flashinfer_modules": list(self.flashinfer_modules),
            "runtime_compiles": list(self.runtime_compiles),
        }


def _vllm_pin(manifest: Manifest) -> tuple[str | None, str]:
    python = manifest.python
    pin = {**python.packages, **python.overrides}.get("vllm")
    return (pin.version if pin else None), (
        "overrides" if "vllm" in python.overrides else "packages"
    )


def check_speculative(manifest: Manifest) -> None:
    """Refuse a draft setting the pinned vLLM lacks, or a MoE backend it does not know: the
    server would stop at start parsing --speculative-config. Errors name the key, its line and
    what the version takes."""
    spec = manifest.serve.speculative
    if spec is None or manifest.serve.engine != "vllm":
        return
    named = [key for key in DRAFT_SETTINGS if getattr(spec, key) is not None]
    if not named:
        return
    vllm, _ = _vllm_pin(manifest)
    entry = _entry(vllm) if vllm is not None else None
    if entry is None:
        covered = ", ".join(v.vllm for v in _knowledge().versions)
        raise ManifestKeyError(
            ("serve", "speculative", named[0]),
            f"serve.speculative.{named[0]}: no entry of knowledge/{SPECULATIVE_FILE} covers "
            f"vllm {vllm or '(unpinned)'}, so whether its SpeculativeConfig has this key is "
            "not known",
            f"read that version's vllm/config/speculative.py and add an entry (covered: "
            f"{covered}), or set only method and num_speculative_tokens",
        )
    for key in named:
        if key not in entry.keys:
            raise ManifestKeyError(
                ("serve", "speculative", key),
                f"serve.speculative.{key}: vLLM {vllm}'s SpeculativeConfig has no {key} "
                f"(knowledge/{SPECULATIVE_FILE}, read in {entry.read}); the server would refuse "
                "the --speculative-config at start",
                "this version takes method, num_speculative_tokens"
                + "".join(f", {k}" for k in entry.keys),
            )
    backend = spec.moe_backend
    if backend is not None and backend not in entry.moe_backends:
        raise ManifestKeyError(
            ("serve", "speculative", "moe_backend"),
            f"serve.speculative.moe_backend {backend!r}: vLLM {vllm} knows no such MoE backend "
            "(config/kernel.py MoEBackend)",
            f"one of {', '.join(entry.moe_backends)}",
        )


def speculative_config_arg(spec: Speculative) -> str:
    """The --speculative-config argument: the set keys as JSON, keys sorted (the serve command
    is part of the content hash, so its spelling is fixed); as serveflags renders it."""
    return json.dumps(
        spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )


def derive_draft(manifest: Manifest) -> DraftPath | None:
    """Which MoE backend the draft's layers run on, read from knowledge/speculative_config.yaml;
    None without speculative decoding. Only an unquantized draft head of a MoE model is
    resolved: a quantized head follows the target's backend."""
    serve = manifest.serve
    spec = serve.speculative
    if spec is None or serve.engine != "vllm":
        return None
    config = speculative_config_arg(spec)
    model = serve.model
    if not model.moe or model.draft_head_quantization not in UNQUANTIZED_HEADS:
        return DraftPath(spec.method, config, None, "not an unquantized MoE draft head")
    vllm, _ = _vllm_pin(manifest)
    entry = _entry(vllm) if vllm is not None else None
    target = serve.moe_backend or "auto"
    if spec.moe_backend is not None:
        chosen, why, named = spec.moe_backend, "serve.speculative.moe_backend", True
    else:
        chosen, why, named = target, f"inherited from --moe-backend {target}", False
    if entry is None:
        return DraftPath(spec.method, config, None, f"{why}; vllm {vllm} not read", named=named)
    moe = entry.draft_moe
    if chosen in moe.falls_to_auto:
        why += f", which an unquantized layer falls through to auto from ({moe.falls_to_auto_at})"
        chosen = "auto"
    if chosen == "auto":
        picks = {moe.auto[gpu] for gpu in manifest.gpus if gpu in moe.auto}
        if len(picks) != 1:
            return DraftPath(spec.method, config, "auto", f"{why}; auto's pick not read here")
        chosen = picks.pop()
        why += f"; auto picks {chosen} on {', '.join(manifest.gpus)} ({moe.auto_at})"
    elif chosen not in moe.unquantized:
        return DraftPath(
            spec.method,
            config,
            chosen,
            f"{why}: refused for an unquantized layer ({moe.unquantized_at})",
            named=named,
        )
    needs = _knowledge().backends.get(chosen)
    modules: list[str] = []
    if needs is not None:
        for gpu in manifest.gpus:
            modules += [m for m in needs.flashinfer_modules.get(gpu, []) if m not in modules]
    return DraftPath(
        spec.method,
        config,
        chosen,
        why,
        tuple(modules),
        tuple(needs.runtime_compiles) if needs else (),
        named,
    )


def speculative_of_argv(args: list[str]) -> Speculative | None:
    """A serve argv's --speculative-config (hand-written, or rendered by serveflags) read back
    into the manifest's terms, as vLLM's parser reads it (vllm_argv.speculative_config); None
    where the argv asks for none. A key the manifest has no setting for is a ValueError."""
    found = speculative_config(args)
    if found is None:
        return None
    return Speculative.model_validate(found.config)


__all__ = [
    "SPECULATIVE_FILE",
    "DraftPath",
    "check_speculative",
    "derive_draft",
    "speculative_config_arg",
    "speculative_of_argv",
]
