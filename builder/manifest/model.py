"""The stack manifest schema: one YAML file pins everything an image depends on.

Every string that can reach a Dockerfile line or a shell is constrained here by a pattern, so
rendering never has to guess whether a value is safe; templates still quote what they emit.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)

from builder.knowledge.strict import Strict
from builder.knowledge.text import (
    Digest,
    GpuName,
    Identifier,
    ImageRef,
    KvCacheDtype,
    ModelId,
    ModuleName,
    OverrideTemplate,
    PackageName,
    Prose,
    RelPath,
    SafeText,
    ServeArg,
    Sha256,
    Slug,
    Url,
    WheelPath,
)


def _exact_version(value: str) -> str:
    """Pins are exact: a range would let the image drift from what was tested."""
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(
            f"{value!r} is not an exact version (write e.g. 0.22.1, not a range or a name)"
        ) from None
    return value


def _stringify(value: Any) -> Any:
    """YAML reads `13.0` as a float; a version is always text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


ExactVersion = Annotated[
    str,
    BeforeValidator(_stringify),
    StringConstraints(pattern=r"^[A-Za-z0-9.+!_-]+$"),
    AfterValidator(_exact_version),
]


# --- sections ----------------------------------------------------------------------------------


class BaseImage(Strict):
    image: ImageRef
    digest: Digest | None = None

    @property
    def reference(self) -> str:
        """What FROM uses: the digest wins where known, so a moved tag cannot change the image."""
        return f"{self.image}@{self.digest}" if self.digest else self.image


class Bases(Strict):
    build: BaseImage
    runtime: BaseImage


class PackagePin(Strict):
    version: ExactVersion
    extras: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$")]] = Field(
        default_factory=list
    )


def _pin_shorthand(value: Any) -> Any:
    """`vllm: 0.22.1` is shorthand for `vllm: {version: 0.22.1}`."""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return {"version": str(value)}
    return value


Pin = Annotated[PackagePin, BeforeValidator(_pin_shorthand)]


class PythonSection(Strict):
    version: Annotated[str, BeforeValidator(_stringify), StringConstraints(pattern=r"^3\.\d+$")]
    index_url: Url = "https://pypi.org/simple"
    extra_index_urls: list[Url] = Field(default_factory=list)
    #: Exact pins. The heaviest (torch and its CUDA wheels) install in their own earlier layer.
    packages: dict[PackageName, Pin]
    #: Pins installed last with --no-deps, over what the packages above require (e.g. a newer
    #: flashinfer than vLLM's own pin, as the seeds ran). Use sparingly: nothing resolves them.
    overrides: dict[PackageName, Pin] = Field(default_factory=dict)
    #: Wheel files from this machine (air-gapped sites, a CPU torch for tests), made visible to
    #: pip through a bind mount, never copied into a layer.
    wheels: list[WheelPath] = Field(default_factory=list)
    #: Packages installed in the first, rarely-changing layer.
    heavy: list[PackageName] = Field(default_factory=lambda: ["torch"])


class BuildSettings(Strict):
    max_jobs: int | Literal["auto"] = Field(default=2)
    nvcc_threads: int = Field(default=1, ge=1, le=64)
    #: Debian/Ubuntu packages for the build stages (compilers, patch, headers).
    apt_packages: list[PackageName] = Field(default_factory=list)
    #: Debian/Ubuntu packages the runtime stage needs.
    runtime_apt_packages: list[PackageName] = Field(default_factory=list)
    #: Toolchain variables (CUDA_HOME, CC, CXX, ...) set identically in the JIT-cache stage and
    #: the runtime image: FlashInfer recompiles when the compiler command line differs.
    toolchain_env: dict[Identifier, SafeText] = Field(default_factory=dict)
    #: A template under templates/overrides/ that `{% extends "Dockerfile.j2" %}` and replaces
    #: some of its blocks (toolchain, packages, patches, jit_cache, runtime), as spack's
    #: `container: template:` does: a stack that needs one more step need not fork the rest.
    template: OverrideTemplate | None = None


class Patch(Strict):
    file: RelPath
    package: PackageName
    sha256: Sha256
    upstream: Url | None = None
    #: Leading path components patch(1) strips; paths are relative to site-packages.
    strip: int = Field(default=1, ge=0, le=5)


class NotPrecompiled(Strict):
    what: SafeText
    why: Prose


class JitCache(Strict):
    presets: list[Slug] = Field(default_factory=list)
    modules: list[ModuleName] = Field(default_factory=list)
    not_precompiled: list[NotPrecompiled] = Field(default_factory=list)


class Model(Strict):
    id: ModelId
    quantization: Literal["nvfp4", "mxfp4", "fp8", "bf16", "fp16", "awq", "gptq"] = "bf16"
    moe: bool = False
    #: Quantization of an MTP / draft head shipped with the model (NVIDIA ships some unquantized).
    draft_head_quantization: Literal["nvfp4", "fp8", "bf16", "fp16"] | None = None
    #: Model facts from its config.json, where a rule or a derivation needs them (e.g. the width
    #: of each GPU's slice under tensor parallelism, the head dim of the attention modules to
    #: precompile). Unset ones stay out of the manifest's JSON (and so out of the content hash).
    hidden_size: int | None = Field(default=None, ge=1)
    intermediate_size: int | None = Field(default=None, ge=1)
    moe_intermediate_size: int | None = Field(default=None, ge=1)
    num_experts: int | None = Field(default=None, ge=1)
    #: The attention layers' head dimension (config.json head_dim; text_config.head_dim for a
    #: multimodal model). vLLM's FlashInfer attention modules are specialised by it: a stack
    #: whose serve path reaches them needs it (knowledge/attention_routes.yaml).
    head_dim: int | None = Field(default=None, ge=1)
    #: The attention layers' sliding window (config.json sliding_window) and logits soft cap
    #: (attn_logit_softcapping), where they have one: FlashInfer builds other modules for them
    #: (use_swa_True, use_logits_cap_True). The soft cap is set only when every layer has it.
    sliding_window: int | None = Field(default=None, ge=1)
    #: Which attention layers use the window: all of them (the default), or only some, as in
    #: Gemma 2 and 3, which interleave sliding-window and full-attention layers (config.json
    #: layer_types, or sliding_window_pattern): FlashInfer then builds both modules.
    sliding_window_layers: Literal["all", "some"] | None = None
    logits_soft_cap: float | None = Field(default=None, gt=0)
    #: The KV cache dtype the checkpoint's own quantization config asks for (a ModelOpt
    #: checkpoint's kv_cache_quant_algo FP8 is fp8_e4m3): from vLLM 0.22 on, `--kv-cache-dtype
    #: auto` (or none) serves the KV cache in it, which decides the attention backend on sm12x.
    checkpoint_kv_cache_dtype: Literal["fp8", "fp8_e4m3", "fp8_e5m2"] | None = None

    def model_post_init(self, context: Any) -> None:
        if self.sliding_window_layers is not None and self.sliding_window is None:
            raise ValueError("sliding_window_layers says which layers use sliding_window: set it")

    @model_serializer(mode="wrap")
    def _without_unset_facts(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        for name in OPTIONAL_MODEL_FACTS:
            if isinstance(data, dict) and data.get(name) is None:
                data.pop(name, None)
        return data


#: The model facts (from its config.json and quantization config) that stay out of the
#: manifest's JSON while unset, so adding one to the schema changes no stack's content hash.
OPTIONAL_MODEL_FACTS = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_experts",
    "head_dim",
    "sliding_window",
    "sliding_window_layers",
    "logits_soft_cap",
    "checkpoint_kv_cache_dtype",
)


#: A backend name as vLLM spells its enums' values (checked per vLLM version against
#: knowledge/speculative_config.yaml, where the accepted values are read from the wheel).
BackendName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]+$", max_length=64)]


SpeculativeMethod = Literal["mtp", "eagle", "eagle3", "ngram", "draft_model"]


class Speculative(Strict):
    """vLLM's --speculative-config: the draft's method and the settings vLLM's SpeculativeConfig
    lets a draft have apart from its target's (config/speculative.py). Which keys and values a
    vLLM version takes is knowledge (knowledge/speculative_config.yaml), checked by `check`: a
    key the pinned vLLM lacks is refused there, not by the server at start."""

    method: SpeculativeMethod
    num_speculative_tokens: int = Field(default=1, ge=1, le=16)
    #: The draft's own MoE backend (SpeculativeConfig.moe_backend): without it the draft
    #: inherits --moe-backend, which an unquantized draft of a quantized target may not run.
    moe_backend: BackendName | None = None
    #: The draft's own attention backend (SpeculativeConfig.attention_backend).
    attention_backend: BackendName | None = None
    #: The draft's own KV cache dtype (SpeculativeConfig.kv_cache_dtype).
    kv_cache_dtype: KvCacheDtype | None = None
    #: The draft's tensor-parallel size (SpeculativeConfig.draft_tensor_parallel_size).
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1, le=64)

    @model_validator(mode="before")
    @classmethod
    def _method_named(cls, data: Any) -> Any:
        """vLLM needs the method where no draft model is given (and the manifest gives none):
        say which it takes, not only that the key is missing."""
        if isinstance(data, dict) and "method" not in data:
            raise ValueError(
                "speculative decoding needs a method: one of "
                + ", ".join(get_args(SpeculativeMethod))
            )
        return data

    @model_serializer(mode="wrap")
    def _without_unset_keys(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Unset draft settings stay out of the JSON (the --speculative-config argument, the
        content hash): vLLM then applies its own default, the target's setting."""
        data = handler(self)
        if isinstance(data, dict):
            data = {key: value for key, value in data.items() if value is not None}
        return data


#: The draft settings beyond the method and the token count, in the order the manifest lists
#: them: the keys a vLLM version may lack (knowledge/speculative_config.yaml).
DRAFT_SETTINGS = (
    "moe_backend",
    "attention_backend",
    "kv_cache_dtype",
    "draft_tensor_parallel_size",
)


class Serve(Strict):
    engine: Literal["vllm", "transformers"] = "vllm"
    model: Model
    served_model_name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./:-]+$")] | None = (
        None
    )
    port: int = Field(default=8000, ge=1, le=65535)
    moe_backend: (
        Literal[
            "auto",
            "triton",
            "deep_gemm",
            "cutlass",
            "flashinfer_trtllm",
            "flashinfer_cutlass",
            "flashinfer_cutedsl",
            "flashinfer_b12x",
            "marlin",
            "humming",
            "emulation",
        ]
        | None
    ) = None
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    max_model_len: int | None = Field(default=None, ge=1)
    kv_cache_dtype: KvCacheDtype | None = None
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    dtype: Literal["auto", "bfloat16", "float16"] | None = None
    enforce_eager: bool = False
    speculative: Speculative | None = None
    #: vLLM's --attention-backend (AttentionBackendEnum, which it looks up upper-cased); None or
    #: auto: vLLM picks (knowledge/attention_routes.yaml says what it picks and why).
    attention_backend: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]+$")] | None = None
    extra_args: list[ServeArg] = Field(default_factory=list)
    shm_size: Annotated[str, StringConstraints(pattern=r"^[0-9]+[kmg]?$")] = "16g"


class SmokePrompt(Strict):
    prompt: Prose
    #: A regular expression the answer must match (case-insensitive).
    expect: Annotated[str, StringConstraints(max_length=500)]
    max_tokens: int = Field(default=64, ge=1, le=4096)

    def model_post_init(self, context: Any) -> None:
        try:
            re.compile(self.expect)
        except re.error as exc:
            raise ValueError(f"expect is not a valid regular expression: {exc}") from None


class Floors(Strict):
    single_stream_tok_s: float = Field(default=0.0, ge=0)
    batched_tok_s: float = Field(default=0.0, ge=0)
    max_ttft_s: float | None = Field(default=None, gt=0)


class Soak(Strict):
    """Concurrent streaming chat for a while after the smoke (`builder.verify.soak`). A test
    setting, not part of the image: it stays out of the content hash."""

    #: How long `test` soaks unless told otherwise (`--soak SECONDS`); 0: only when asked.
    seconds: int = Field(default=0, ge=0, le=7 * 24 * 3600)
    #: Streams open at once; None: the smoke's concurrency.
    concurrency: int | None = Field(default=None, ge=1, le=256)
    #: A stall: no token on any open stream for this long while the server is up.
    stall_s: float = Field(default=60.0, gt=0, le=3600)
    #: Failed requests over all requests above which the soak fails (0: any failure fails).
    max_error_rate: float = Field(default=0.0, ge=0, le=1)
    #: Growth of the server's memory (container, or process tree with --url) past its level
    #: after the warm-up; None: not judged.
    max_memory_growth_mb: float | None = Field(default=1024.0, gt=0)


class Smoke(Strict):
    #: vLLM stacks need an NVIDIA GPU; the CPU test stack's server does not.
    needs_gpu: bool = True
    prompts: list[SmokePrompt] = Field(default_factory=list)
    concurrency: int = Field(default=4, ge=1, le=64)
    floors: Floors = Field(default_factory=Floors)
    health_timeout_s: int = Field(default=900, ge=5, le=7200)
    soak: Soak = Field(default_factory=Soak)


class Note(Strict):
    text: Prose
    evidence: list[Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]+$")]] = Field(
        default_factory=list
    )


class Manifest(Strict):
    """One stack. Field knowledge (arch flags, rules, presets) is in knowledge/, not here."""

    description: Prose = ""
    extends: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]*$")] | None = None
    status: Literal["experimental", "working", "known-bad", "ci"] = "experimental"
    platform: Literal["linux/amd64", "linux/arm64"] = "linux/amd64"
    gpus: list[GpuName] = Field(min_length=1)
    cuda: ExactVersion
    #: Driver of the serving hosts, where known; checked against the CUDA minimum.
    host_driver: ExactVersion | None = None
    bases: Bases
    python: PythonSection
    build: BuildSettings = Field(default_factory=BuildSettings)
    patches: list[Patch] = Field(default_factory=list)
    jit_cache: JitCache = Field(default_factory=JitCache)
    env: dict[Identifier, SafeText] = Field(default_factory=dict)
    serve: Serve
    smoke: Smoke = Field(default_factory=Smoke)
    notes: list[Note] = Field(default_factory=list)
