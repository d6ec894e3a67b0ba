"""vLLM's attention routes, as knowledge/attention_routes.yaml writes them: which backend each
vLLM version serves with for a GPU and a KV cache dtype, and which FlashInfer modules that
backend builds. The schema and its checks against the module knowledge it names; the walk
for one stack is manifest/servepath.py's.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, StringConstraints

from builder.errors import StackError
from builder.knowledge.jitmodules import ArgValue, Specifier, jit_modules_known
from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict
from builder.knowledge.text import GpuName, KvCacheDtype

ROUTES_FILE = "attention_routes.yaml"
BackendName = Annotated[str, StringConstraints(pattern=r"^[A-Z0-9_]+$")]
TorchDtype = Annotated[str, StringConstraints(pattern=r"^torch\.[a-z0-9_]+$")]
#: The stack facts a route parameter can name, "{fact}" (see _Facts.values).
FACTS = ("dtype", "kv_dtype", "head_dim", "sliding_window", "logits_soft_cap")


class RouteSelect(Strict):
    gpus: list[GpuName]
    kv_cache_dtypes: list[KvCacheDtype]
    backend: BackendName
    why: str


class FlashInferEntry(Strict):
    gpus: list[GpuName]
    #: The module family built; None with not_derived (that case has no derivation).
    family: str | None = None
    #: Only for these KV cache dtypes (after auto is resolved); all when unset.
    kv_cache_dtypes: list[KvCacheDtype] | None = None
    #: Why the modules of this case are not derived: a stack that reaches it is refused, since
    #: whatever it precompiled would not be what vLLM loads.
    not_derived: str | None = None

    def model_post_init(self, context: Any) -> None:
        if (self.family is None) == (self.not_derived is None):
            raise ValueError("an entry names a family, or says why it has none (not_derived)")


class RouteVersion(Strict):
    vllm: Specifier
    read: str
    auto_kv_from_checkpoint: bool
    flashinfer_sampler_default: bool
    select: list[RouteSelect] = Field(default_factory=list)
    default_backend: BackendName
    flashinfer: list[FlashInferEntry] = Field(default_factory=list)
    #: Why this version's FlashInfer attention modules are not derived: a stack routed there is
    #: refused, since whatever it precompiled would not be what vLLM loads.
    flashinfer_not_derived: str | None = None


class SamplerRoute(Strict):
    env: str
    modules: list[str]


class RoutesFile(Strict):
    model_dtypes: dict[str, TorchDtype]
    kv_cache_dtypes: dict[KvCacheDtype, TorchDtype | Literal["model"]]
    prefill_params: dict[str, ArgValue]
    sampler: SamplerRoute
    versions: list[RouteVersion]


@cache
def attention_routes() -> RoutesFile:
    """The routes, checked against the module knowledge they name (families, sampler modules)."""
    doc = read_knowledge(ROUTES_FILE)
    routes = parse_document(doc, RoutesFile)
    known = jit_modules_known()
    for index, version in enumerate(routes.versions):
        for entry, module in enumerate(version.flashinfer):
            if module.family is not None and module.family not in known.families:
                raise StackError(
                    f"unknown module family {module.family!r}",
                    file=doc.path,
                    key=f"versions.{index}.flashinfer.{entry}.family",
                    line=doc.line_of(("versions", index, "flashinfer", entry, "family")),
                    hint=f"families: {', '.join(sorted(known.families))} "
                    "(knowledge/flashinfer_modules.yaml)",
                )
    for family_name in {m.family for v in routes.versions for m in v.flashinfer if m.family}:
        missing = set(known.families[family_name].params) - set(routes.prefill_params)
        if missing:
            raise StackError(
                f"prefill_params gives no value for {', '.join(sorted(missing))} "
                f"(parameters of family {family_name})",
                file=doc.path,
                key="prefill_params",
                line=doc.line_of(("prefill_params",)),
            )
    unmapped = set(get_args(KvCacheDtype)) - set(routes.kv_cache_dtypes)
    if unmapped:
        raise StackError(
            f"kv_cache_dtypes gives no dtype for {', '.join(sorted(unmapped))}",
            file=doc.path,
            key="kv_cache_dtypes",
            line=doc.line_of(("kv_cache_dtypes",)),
        )
    for key, value in routes.prefill_params.items():
        if fact_name(value) not in (None, *FACTS):
            raise StackError(
                f"{value!r} names no fact of a stack",
                file=doc.path,
                key=f"prefill_params.{key}",
                line=doc.line_of(("prefill_params", key)),
                hint=f"facts: {', '.join('{' + f + '}' for f in FACTS)}",
            )
    for name in routes.sampler.modules:
        if name not in known:
            raise StackError(
                f"unknown FlashInfer JIT module {name!r}",
                file=doc.path,
                key="sampler.modules",
                line=doc.line_of(("sampler", "modules")),
            )
    return routes


def fact_name(value: ArgValue) -> str | None:
    """The fact a route parameter names ("{head_dim}" names head_dim), None for a literal. The
    routes are data, so a parameter that varies per stack is spelled in them as a placeholder,
    as the family names spell theirs; literals ("torch.int32", 0, false) pass through."""
    if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
        return value[1:-1]
    return None


__all__ = [
    "FACTS",
    "ROUTES_FILE",
    "FlashInferEntry",
    "RouteSelect",
    "RouteVersion",
    "RoutesFile",
    "SamplerRoute",
    "attention_routes",
    "fact_name",
]
