"""The FlashInfer modules a vLLM server loads on its serve path, derived from the serve settings.

A module that vLLM loads but the image did not precompile compiles at serve time (minutes, or an
OOM-killed engine on a small box), while `check` and the image test see nothing wrong: the test
can only judge the modules the stack lists. Which attention modules vLLM asks FlashInfer for is a
chain of decisions (the KV cache dtype, then the attention backend vLLM picks on that GPU, then
the FlashInfer backend's dtypes and head dim), each read from vLLM's source and kept as data in
knowledge/attention_routes.yaml. This module only walks that data for one stack; the module
names come out of the families in knowledge/flashinfer_modules.yaml, spelled as FlashInfer
spells them, or the cache would miss.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.knowledge.jitmodules import ArgValue, jit_modules_known
from builder.knowledge.loader import ManifestKeyError
from builder.knowledge.routes import (
    ROUTES_FILE,
    RoutesFile,
    RouteVersion,
    attention_routes,
    fact_name,
)
from builder.knowledge.text import KvCacheDtype
from builder.manifest.model import Manifest
from builder.vllmcli.serveflags import command_options
from builder.vllmcli.vllm_argv import (
    VLLM_OPTIONS,
    BackendOption,
    ExtraArgError,
    attention_backend_option,
    expand,
    option_of,
)

FLASHINFER = "FLASHINFER"


@dataclass(frozen=True)
class ServePath:
    """What a stack's vLLM server loads from FlashInfer, and why: `show` prints it."""

    vllm: str
    kv_cache_dtype: str
    attention_backend: str
    #: Where the backend choice comes from: the argument of serve.extra_args that names it, as
    #: written, or the routing rule's reason.
    backend_from: str
    flashinfer_sampler: bool
    #: The FlashInfer modules this serve path loads, in the order they are added to the stack.
    modules: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {  # the vLLM version is the manifest's pin, shown there
            "kv_cache_dtype": self.kv_cache_dtype,
            "attention_backend": self.attention_backend,
            "attention_backend_from": self.backend_from,
            "flashinfer_sampler": self.flashinfer_sampler,
            "flashinfer_modules": list(self.modules),
        }


class NoRoute(ManifestKeyError):
    """The stack's vLLM version is one no route covers (derive_serve_path)."""


def check_serve_args(manifest: Manifest) -> None:
    """Refuse what in serve.extra_args would make the server differ from what `check` reads: an
    option the serve command already passes from a typed serve setting (serveflags.SERVE_FLAGS),
    read with vLLM's parser's rules (vllm_argv), and an attention backend named there at all
    (serve.attention_backend names it, typed)."""
    serve = manifest.serve
    options = command_options(serve.engine)
    known = VLLM_OPTIONS if serve.engine == "vllm" else tuple(options)
    for index, arg in enumerate(serve.extra_args):
        parsed = option_of(arg)
        if parsed is None:
            continue
        spelled = parsed[0].partition(".")[0]
        option = expand(spelled, known)
        if option not in options:
            continue
        abbreviated = (
            f" ({spelled} abbreviates it: argparse takes any unambiguous prefix)"
            if spelled != option
            else ""
        )
        raise ManifestKeyError(
            ("serve", "extra_args", index),
            f"{arg}: the serve command passes {option} itself, from the typed serve settings "
            f"(builder/vllmcli/serveflags.py){abbreviated}; the server would run with whichever "
            "comes last, while check (its rules, the FlashInfer modules derived for the serve "
            "path) reads only the typed setting",
            options[option],
        )
    if serve.engine == "vllm":
        named = _extra_args_backend(manifest)
        if named is not None:
            raise ManifestKeyError(
                ("serve", "extra_args", named.index),
                f"{named.spelled}: the attention backend is a typed serve setting",
                f"write serve.attention_backend: {named.backend} (and drop it from "
                "serve.extra_args)",
            )


def derive_serve_path(manifest: Manifest) -> ServePath | None:
    """The stack's serve path, or None where it serves with no vLLM (another engine, or no vllm
    pin). Errors point at the manifest key to add or change: a vLLM version no route covers is
    one, since its sampler and attention modules would silently go unbuilt."""
    serve = manifest.serve
    python = manifest.python
    pin_key = "overrides" if "vllm" in python.overrides else "packages"
    pin = {**python.packages, **python.overrides}.get("vllm")
    if serve.engine != "vllm" or pin is None:
        return None
    routes = attention_routes()
    version = next(
        (v for v in routes.versions if Version(pin.version) in SpecifierSet(v.vllm)), None
    )
    if version is None:
        raise NoRoute(
            ("python", pin_key, "vllm"),
            f"no route in knowledge/{ROUTES_FILE} covers vllm {pin.version}: add one (what its "
            "FlashInfer backend and sampler build) or pin a covered version",
            f"covered: {', '.join(v.vllm for v in routes.versions)}; without a route, the "
            "FlashInfer modules its server loads (sampler, attention) would compile at serve time",
        )
    kv_cache_dtype = _kv_cache_dtype(manifest, version)
    option = _backend_option(manifest)
    backend, backend_from = _backend(manifest, version, kv_cache_dtype, option)
    sampler = _sampler_on(manifest, version, routes)
    modules: list[str] = list(routes.sampler.modules) if sampler else []
    if backend == FLASHINFER:
        if version.flashinfer_not_derived:
            raise ManifestKeyError(
                _backend_key(manifest, option),
                f"vLLM {pin.version} serves attention with FlashInfer here ({backend_from}); "
                f"{version.flashinfer_not_derived}",
                "serve with a setting that keeps vLLM's FLASH_ATTN backend, or read that "
                "version's FlashInfer backend and add its modules to "
                "knowledge/attention_routes.yaml",
            )
        facts = _Facts(manifest, routes, pin.version, backend_from, kv_cache_dtype)
        modules += _flashinfer_modules(
            manifest, version, routes, facts, kv_cache_dtype, _backend_key(manifest, option)
        )
    return ServePath(
        vllm=pin.version,
        kv_cache_dtype=kv_cache_dtype,
        attention_backend=backend,
        backend_from=backend_from,
        flashinfer_sampler=sampler,
        modules=tuple(dict.fromkeys(modules)),
    )


def _kv_cache_dtype(manifest: Manifest, version: RouteVersion) -> KvCacheDtype:
    """The KV cache dtype vLLM serves with: the option, or what auto becomes. serve.extra_args
    cannot name another (check_serve_args)."""
    asked = manifest.serve.kv_cache_dtype or "auto"
    checkpoint = manifest.serve.model.checkpoint_kv_cache_dtype
    if asked == "auto" and version.auto_kv_from_checkpoint and checkpoint is not None:
        return checkpoint
    return asked


def _extra_args_backend(manifest: Manifest) -> BackendOption | None:
    """attention_backend_option over the stack's serve.extra_args, its errors located there."""
    try:
        return attention_backend_option(manifest.serve.extra_args)
    except ExtraArgError as exc:
        raise ManifestKeyError(("serve", "extra_args", exc.index), exc.message, exc.hint) from None


def _backend_option(manifest: Manifest) -> BackendOption | None:
    """The backend serve.attention_backend names, as vLLM runs it (upper-cased); None or auto:
    vLLM picks."""
    named = manifest.serve.attention_backend
    if named is None or named.lower() == "auto":
        return None
    return BackendOption(named.upper(), -1, f"serve.attention_backend {named}")


def _backend_key(manifest: Manifest, option: BackendOption | None) -> tuple[str | int, ...]:
    """The manifest key that sent the stack to its attention backend."""
    serve = manifest.serve
    if option is not None:
        return ("serve", "attention_backend")
    if serve.kv_cache_dtype in (None, "auto") and serve.model.checkpoint_kv_cache_dtype:
        return ("serve", "model", "checkpoint_kv_cache_dtype")
    return ("serve", "kv_cache_dtype")


def _backend(
    manifest: Manifest,
    version: RouteVersion,
    kv_cache_dtype: KvCacheDtype,
    option: BackendOption | None,
) -> tuple[str, str]:
    """The attention backend vLLM runs, and where that choice comes from."""
    if option is not None:
        return option.backend, option.spelled
    for rule in version.select:
        gpus = [gpu for gpu in manifest.gpus if gpu in rule.gpus]
        if gpus and kv_cache_dtype in rule.kv_cache_dtypes:
            return rule.backend, f"kv_cache_dtype {kv_cache_dtype} on {gpus[0]}: {rule.why}"
    on = ", ".join(manifest.gpus)
    return (
        version.default_backend,
        f"vLLM's first choice for kv_cache_dtype {kv_cache_dtype} on {on}",
    )


def _sampler_on(manifest: Manifest, version: RouteVersion, routes: RoutesFile) -> bool:
    """Whether vLLM samples with FlashInfer: the variable as vLLM reads it, bool(int(value))."""
    value = manifest.env.get(routes.sampler.env)
    if value is None:
        return version.flashinfer_sampler_default
    try:
        return bool(int(value))
    except ValueError:
        raise ManifestKeyError(
            ("env", routes.sampler.env),
            f"{routes.sampler.env}={value!r}: vLLM reads it as an integer (bool(int(value))) "
            "and fails at start on anything else",
            "write 0 or 1",
        ) from None


class _Facts:
    """The model facts a route's parameters name, each looked up (and missed) only when used.
    A fact has one value, or several where the model's layers differ (sliding_window_layers
    `some`): the route then builds one module per value."""

    def __init__(
        self,
        manifest: Manifest,
        routes: RoutesFile,
        vllm: str,
        backend_from: str,
        kv_cache_dtype: KvCacheDtype,
    ) -> None:
        self.manifest, self.routes = manifest, routes
        self.why = f"vLLM {vllm} serves attention with FlashInfer here ({backend_from})"
        self.kv_cache_dtype = kv_cache_dtype

    def values(self, fact: str) -> tuple[ArgValue, ...]:
        model = self.manifest.serve.model
        if fact == "dtype":
            return (self._dtype(),)
        if fact == "kv_dtype":
            kv = self.routes.kv_cache_dtypes[self.kv_cache_dtype]
            return (self._dtype() if kv == "model" else kv,)
        if fact == "head_dim":
            if model.head_dim is None:
                raise ManifestKeyError(
                    ("serve", "model", "head_dim"),
                    f"{self.why}, whose JIT modules are built per head dimension: the manifest "
                    "gives none",
                    "take it from the model's config.json (head_dim; text_config.head_dim for "
                    "a multimodal model; hidden_size / num_attention_heads where neither is "
                    "given) and set serve.model.head_dim",
                )
            return (model.head_dim,)
        if fact == "sliding_window":
            if model.sliding_window is None:
                return (False,)
            # vLLM puts sliding-window and full-attention layers in KV cache groups of their own,
            # each planned by its own metadata builder with its own window (v1/attention/
            # backends/flashinfer.py FlashInferMetadataBuilder, utils.py get_per_layer_parameters)
            return (False, True) if model.sliding_window_layers == "some" else (True,)
        if fact == "logits_soft_cap":
            return (model.logits_soft_cap is not None,)
        raise ValueError(f"{ROUTES_FILE}: unknown fact {{{fact}}}")

    def _dtype(self) -> str:
        dtype = self.manifest.serve.dtype
        if dtype is None or dtype not in self.routes.model_dtypes:
            raise ManifestKeyError(
                ("serve", "dtype"),
                f"{self.why}, whose JIT modules are built per model dtype: serve.dtype is "
                f"{dtype or 'unset'}",
                f"set serve.dtype to one of {', '.join(self.routes.model_dtypes)}: the dtype "
                "the model is served in (its config.json torch_dtype, usually bfloat16)",
            )
        return self.routes.model_dtypes[dtype]


def _flashinfer_modules(
    manifest: Manifest,
    version: RouteVersion,
    routes: RoutesFile,
    facts: _Facts,
    kv_cache_dtype: KvCacheDtype,
    backend_key: tuple[str | int, ...],
) -> list[str]:
    """The attention modules the version's FLASHINFER backend builds for this stack: one per
    route entry that matches its GPUs and KV cache dtype (and one per value of a fact with
    several), named by the family. Refused where the pinned flashinfer-python is not one the
    family's spelling was read for: a name that is off by one character is a cache miss that
    compiles at serve time, which nothing before a GPU run would notice."""
    known = jit_modules_known()
    flashinfer = {**manifest.python.packages, **manifest.python.overrides}.get("flashinfer-python")
    names: list[str] = []
    for entry in version.flashinfer:
        if not any(gpu in entry.gpus for gpu in manifest.gpus):
            continue
        if entry.kv_cache_dtypes is not None and kv_cache_dtype not in entry.kv_cache_dtypes:
            continue
        if entry.not_derived is not None or entry.family is None:
            raise ManifestKeyError(
                backend_key,
                f"{facts.why}; {entry.not_derived}",
                "serve with a setting that keeps vLLM's FLASH_ATTN backend, or read that case "
                "and give its entry in knowledge/attention_routes.yaml a family",
            )
        family = known.families[entry.family]
        if (
            flashinfer is not None
            and family.flashinfer is not None
            and Version(flashinfer.version) not in SpecifierSet(family.flashinfer)
        ):
            key = "overrides" if "flashinfer-python" in manifest.python.overrides else "packages"
            raise ManifestKeyError(
                ("python", key, "flashinfer-python"),
                f"{facts.why}; the module family {entry.family} is read for flashinfer-python "
                f"{family.flashinfer} only, and a name for {flashinfer.version} may not be the "
                "one it looks up",
                f"read that version's {family.generator} and widen the family's `flashinfer` "
                "in knowledge/flashinfer_modules.yaml (or add a family)",
            )
        choices = {key: _params(value, facts) for key, value in routes.prefill_params.items()}
        for values in itertools.product(*choices.values()):
            names.append(known.instance(entry.family, dict(zip(choices, values, strict=True))).name)
    return names


def _params(value: ArgValue, facts: _Facts) -> tuple[ArgValue, ...]:
    """A parameter's values as the route gives it: a literal, or "{fact}" for a fact's."""
    fact = fact_name(value)
    return (value,) if fact is None else facts.values(fact)
