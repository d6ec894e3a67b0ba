"""Manifest files -> one validated, fully resolved stack.

Resolution applies `extends` (maps merge, lists replace, the child wins), validates the result
against the schema, derives arch flags, expands JIT presets and checks patch files. Everything
later in the pipeline reads a ResolvedStack and never the YAML.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version
from pydantic import ValidationError

from builder import REPO_ROOT
from builder.engine import imageref
from builder.errors import StackError
from builder.knowledge.archflags import ArchFlags, arch_table, cuda_facts, derive
from builder.knowledge.jitmodules import JitModule as JitModule
from builder.knowledge.jitmodules import jit_modules_known as jit_modules_known
from builder.knowledge.jitmodules import jit_presets as jit_presets
from builder.knowledge.loader import ManifestKeyError, error_at, validation_error
from builder.knowledge.model_shapes import known_shape
from builder.manifest.chain import deep_merge, load_chain
from builder.manifest.model import Bases, Manifest
from builder.manifest.rules import evaluate
from builder.manifest.servepath import NoRoute, ServePath, check_serve_args, derive_serve_path
from builder.manifest.speculative import DraftPath, check_speculative, derive_draft
from builder.manifest.start_switches import StartSwitches, start_switches
from builder.manifest.substitute import Substitutions

#: Manifest fields that describe a stack but do not shape its image. They stay out of the
#: image's identity, so marking a stack `working` or adding a note keeps its test and push records.
EDITORIAL_FIELDS = frozenset({"description", "status", "notes"})
#: Settings of a test run on the image, not of the image (the soak's length and limits): also
#: out of its identity, so tuning them keeps its records.
TEST_ONLY_FIELDS: dict[str, Any] = {"smoke": {"soak": True}}


@dataclass(frozen=True)
class ResolvedStack:
    name: str
    manifest: Manifest
    arch: ArchFlags
    #: The FlashInfer modules to precompile: presets expanded, then the manifest's own modules,
    #: then those its serve path loads (servepath.py); order kept, duplicates dropped.
    jit_modules: tuple[str, ...]
    #: Manifest files, the stack's own first, then each parent.
    sources: tuple[Path, ...]
    repo_root: Path
    #: The bases as written, before site substitution: what a lock pins (lock/inputs).
    written_bases: Bases
    #: Base references replaced by site substitution: original -> substitute.
    base_substitutions: dict[str, str] = field(default_factory=dict)
    #: What the vLLM server loads from FlashInfer and why (None: not derived for this stack).
    serve_path: ServePath | None = None
    #: How its server sets what vLLM reads at start that follows the network (None: not read).
    start_switches: StartSwitches | None = None
    #: What the speculative-decoding draft's MoE runs on (None: no speculative decoding).
    draft: DraftPath | None = None

    def to_json(self, editorial: bool = True) -> dict[str, Any]:
        """The resolved manifest with derived values: what `show` prints. Without the editorial
        fields it is what images carry and what the content hash covers."""
        excluded: dict[str, Any] = {"extends": True}
        if not editorial:
            excluded |= dict.fromkeys(EDITORIAL_FIELDS, True) | TEST_ONLY_FIELDS
        data = self.manifest.model_dump(mode="json", exclude=excluded)
        data["name"] = self.name
        data["derived"] = {
            "arch_env": self.arch.env,
            "jit_arch_tag": self.arch.jit_arch_tag,
            "cubin_archs": list(self.arch.cubin_archs),
            "min_driver": self.arch.min_driver,
            "jit_modules": list(self.jit_modules),
            "base_substitutions": self.base_substitutions,
        }
        if editorial and self.serve_path is not None:
            # What `show` explains; images carry only its outcome (jit_modules), so the content
            # hash of a stack whose modules did not change stays the same.
            data["derived"]["serve_path"] = self.serve_path.to_json()
        if editorial and self.start_switches is not None:
            data["derived"]["start_switches"] = self.start_switches.to_json()
        if editorial and self.draft is not None:
            data["derived"]["draft"] = self.draft.to_json()
        return data

    def module_archs(self) -> dict[str, list[str]]:
        """The device code each precompiled module must hold: the stack's cubin archs, unless
        the module's generator hard-codes its own (knowledge/flashinfer_modules.yaml)."""
        known = jit_modules_known()
        return {
            name: list(known[name].fixed_archs or self.arch.cubin_archs)
            for name in self.jit_modules
        }

    def fixed_arch_gaps(self) -> list[str]:
        """`module: gpu` for each precompiled module whose generator hard-codes archs that
        none of the stack's GPUs' capability matches: that GPU would get no device code from
        the cache and JIT-compile (or fail) at first use, which the image test cannot see."""
        known = jit_modules_known()
        table = arch_table()
        gaps = []
        for name in self.jit_modules:
            fixed = known[name].fixed_archs
            for gpu in self.manifest.gpus:
                digits = "sm_" + table.gpus[gpu].capability.replace(".", "")
                if fixed and not any(arch.rstrip("af") == digits for arch in fixed):
                    gaps.append(f"{name}: {gpu}")
        return gaps

    def local_file(self, path: str) -> Path:
        """A file the manifest names: relative to the repository root, or absolute."""
        return self.repo_root / path


def jit_module_table(stack: ResolvedStack | None = None) -> dict[str, dict[str, Any]]:
    """What the in-image tool needs per module (generator and arguments): every listed one, so
    the image can also name a module it lacks as a miss, and the stack's own modules a family
    spells (knowledge/flashinfer_modules.yaml), which no list holds."""
    known = jit_modules_known()
    names = [*known, *(stack.jit_modules if stack else ())]
    return {n: {"generator": known[n].generator, "args": known[n].args} for n in names}


def stack_names(stacks_dir: Path) -> list[str]:
    if not stacks_dir.is_dir():
        raise StackError(
            f"stacks directory {stacks_dir} does not exist",
            hint="run from the repository root or pass --stacks-dir",
        )
    return sorted(p.stem for p in stacks_dir.glob("*.yaml"))


def resolve(
    name: str, stacks_dir: Path, substitutions: Substitutions | None = None
) -> ResolvedStack:
    """The stack `name` resolved from its files. Its checks judge the typed manifest and say
    which key is wrong (ManifestKeyError); this is the one place that finds the file and line
    that spell it, in the stack's files, child first."""
    docs = load_chain(name, stacks_dir)
    merged: dict[str, Any] = {}
    for doc in reversed(docs):
        merged = deep_merge(merged, doc.data)
    merged.pop("extends", None)
    try:
        manifest = Manifest.model_validate(merged)
    except ValidationError as exc:
        raise validation_error(exc, docs) from None
    try:
        return _derived(name, manifest, tuple(d.path for d in docs), stacks_dir, substitutions)
    except ManifestKeyError as exc:
        raise error_at(docs, exc.key_path, exc.message, exc.hint) from None


def _derived(
    name: str,
    manifest: Manifest,
    sources: tuple[Path, ...],
    stacks_dir: Path,
    substitutions: Substitutions | None,
) -> ResolvedStack:
    """The stack its valid manifest derives, every check of it passed."""
    repo_root = stacks_dir.resolve().parent
    written_bases = manifest.bases
    manifest, substituted = _substitute_bases(manifest, substitutions or Substitutions())
    check_serve_args(manifest)  # first: the serve path reads the typed settings only
    check_speculative(manifest)
    draft = derive_draft(manifest)
    uncovered: NoRoute | None = None
    try:
        serve_path = derive_serve_path(manifest)
    except NoRoute as exc:
        serve_path, uncovered = None, exc
    stack = ResolvedStack(
        name=name,
        manifest=manifest,
        written_bases=written_bases,
        base_substitutions=substituted,
        arch=derive(list(manifest.gpus), manifest.cuda),
        jit_modules=_expand_modules(manifest, serve_path, draft),
        sources=sources,
        repo_root=repo_root,
        serve_path=serve_path,
        start_switches=start_switches(manifest, serve_path),
        draft=draft,
    )
    _check_reserved_env(stack)
    _check_patches(stack)
    _check_distinct_names(("python", "wheels"), stack.manifest.python.wheels)
    _check_template(stack)
    if uncovered is not None and not evaluate(rule_facts(stack)):
        # Where a compatibility rule fires (no flashinfer_b12x before vLLM 0.22), its message says
        # more: `check` and every command that builds (Settings.checked) refuse with it instead.
        raise uncovered
    return stack


def _substitute_bases(
    manifest: Manifest, substitutions: Substitutions
) -> tuple[Manifest, dict[str, str]]:
    replaced: dict[str, str] = {}
    bases = {}
    for role in ("build", "runtime"):
        base = getattr(manifest.bases, role)
        new = substitutions.apply(base.image)
        if new is None:
            bases[role] = base
            continue
        parsed = imageref.parse(new)  # a substitution is a REFERENCE (Substitutions.parse)
        replaced[base.reference] = new
        bases[role] = base.model_copy(update={"image": parsed.tagged, "digest": parsed.digest})
    if not replaced:
        return manifest, {}
    new_bases = manifest.bases.model_copy(update=bases)
    return manifest.model_copy(update={"bases": new_bases}), replaced


def _expand_modules(
    manifest: Manifest,
    serve_path: ServePath | None,
    draft: DraftPath | None = None,
) -> tuple[str, ...]:
    presets = jit_presets()
    modules: list[str] = []

    def add_preset(preset_name: str, trail: tuple[str, ...]) -> None:
        if preset_name not in presets:
            raise ManifestKeyError(
                ("jit_cache", "presets"),
                f"unknown JIT preset {preset_name!r}",
                f"known presets: {', '.join(sorted(presets))} (knowledge/jit_presets.yaml)",
            )
        if preset_name in trail:
            raise StackError(f"JIT preset include cycle: {' -> '.join((*trail, preset_name))}")
        preset = presets[preset_name]
        for included in preset.includes:
            add_preset(included, (*trail, preset_name))
        modules.extend(preset.modules)

    for preset_name in manifest.jit_cache.presets:
        add_preset(preset_name, ())
    modules.extend(manifest.jit_cache.modules)
    known = jit_modules_known()
    for name in modules:
        if name not in known:
            raise ManifestKeyError(
                ("jit_cache",),
                f"unknown FlashInfer JIT module {name!r}",
                f"known modules: {', '.join(sorted(known))}, and any name of the families "
                f"{', '.join(sorted(known.families))} (knowledge/flashinfer_modules.yaml)",
            )
    # Appended last, so a stack whose presets already list them keeps its order.
    modules.extend(serve_path.modules if serve_path else ())
    # The draft's own MoE backend, where the manifest names it (speculative.py; `auto` is
    # left to the rules: a 97-step module nobody asked for is refused, not silently built).
    if draft is not None and draft.named:
        modules.extend(draft.flashinfer_modules)
    return tuple(dict.fromkeys(modules))


def _check_reserved_env(stack: ResolvedStack) -> None:
    """Arch variables are derived; a manifest spelling them would be a second source of truth."""
    for key in stack.manifest.env:
        if key in stack.arch.env or key in ("MAX_JOBS", "FLASHINFER_NVCC_THREADS"):
            raise ManifestKeyError(
                ("env", key),
                f"{key} is derived by the builder and cannot be set in env",
                "list target GPUs under `gpus:` and build settings under `build:`",
            )


def _check_patches(stack: ResolvedStack) -> None:
    patches_dir = (stack.repo_root / "patches").resolve()
    _check_distinct_names(("patches",), [p.file for p in stack.manifest.patches], "file")
    for index, patch in enumerate(stack.manifest.patches):
        path = stack.local_file(patch.file).resolve()
        if not path.is_relative_to(patches_dir):
            raise ManifestKeyError(
                ("patches", index, "file"),
                f"patch {patch.file} is outside the repository's patches/ folder",
                "keep patch files under patches/",
            )
        if not path.is_file():
            raise ManifestKeyError(
                ("patches", index, "file"), f"patch file {patch.file} does not exist"
            )
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != patch.sha256:
            raise ManifestKeyError(
                ("patches", index, "sha256"),
                f"patch {patch.file} has sha256 {actual}, the manifest says {patch.sha256}",
                "if the patch changed on purpose, update sha256 in the manifest",
            )


def _check_distinct_names(key: tuple[str, ...], files: list[str], field: str | None = None) -> None:
    """The build context keeps these files by name alone: two of one name would overwrite each
    other there, and the build would fail at its sha256 check or patch step, hours in."""
    seen: dict[str, int] = {}
    for index, file in enumerate(files):
        name = Path(file).name
        if name in seen:
            where = (*key, index, *((field,) if field else ()))
            raise ManifestKeyError(
                where,
                f"{file} has the same file name as entry {seen[name]} ({files[seen[name]]})",
                "give each file a name of its own",
            )
        seen[name] = index


def local_wheels(stack: ResolvedStack) -> list[Path]:
    """The manifest's local wheels, each checked to be on this machine.

    Asked where the files are read (rendering a context, making a lock), never by `resolve`:
    what a manifest says is valid on a fresh clone before anything is fetched into build/, so
    `check` and `list` do not depend on the machine's disk.
    """
    paths = [stack.local_file(wheel) for wheel in stack.manifest.python.wheels]
    for index, (wheel, path) in enumerate(zip(stack.manifest.python.wheels, paths, strict=True)):
        if not path.is_file():
            docs = load_chain(stack.name, stack.sources[0].parent)  # for the file and line
            raise error_at(
                docs,
                ("python", "wheels", index),
                f"wheel {wheel} does not exist on this machine",
                "`make wheels-local` fetches the wheels the test stacks use",
            )
    return paths


def _check_template(stack: ResolvedStack) -> None:
    template = stack.manifest.build.template
    if template is None:
        return
    path = REPO_ROOT / "templates" / template  # where render's templates live
    if not path.is_file():
        raise ManifestKeyError(
            ("build", "template"),
            f"template {template} does not exist under templates/",
            'write templates/overrides/NAME.j2 starting with {% extends "Dockerfile.j2" %}',
        )
    if '{% extends "Dockerfile.j2" %}' not in path.read_text(errors="replace"):
        raise ManifestKeyError(
            ("build", "template"),
            f"templates/{template} does not extend Dockerfile.j2",
            'start it with {% extends "Dockerfile.j2" %} and override only the blocks it changes',
        )


def rule_facts(stack: ResolvedStack, locked: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The flat fact table rules.yaml conditions read (see the header of that file).

    locked: the stack's lock (name -> version), where it has one: an unpinned package's
    pins.<name> is then its locked version, the one its image installs.
    """
    facts: dict[str, Any] = {}

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                flatten(f"{prefix}.{key}" if prefix else key, item)
        facts[prefix] = value

    m = stack.manifest
    flatten("", m.model_dump(mode="json"))
    pins = {name: pin.version for name, pin in {**m.python.packages, **m.python.overrides}.items()}
    pinned = {_normalize(name) for name in pins}
    for name, version in (locked or {}).items():
        if _normalize(name) not in pinned:
            facts[f"pins.{name}"] = version
    for package, version in pins.items():
        facts[f"pins.{package}"] = version
    facts["patched"] = sorted({p.package for p in m.patches})
    facts["arch.flashinfer"] = list(stack.arch.flashinfer_archs)
    # What the image's processes see: derived arch flags, toolchain, then the stack's env.
    image_env = {**stack.arch.env, **m.build.toolchain_env, **m.env}
    for key, value in image_env.items():
        facts[f"image_env.{key}"] = value
    facts["arch.torch"] = image_env.get("TORCH_CUDA_ARCH_LIST", "").replace(";", " ").split()
    if m.serve.engine == "vllm" and m.serve.moe_backend is None:
        facts["serve.moe_backend"] = "auto"  # no --moe-backend: vLLM picks, as with auto
    facts["jit.fixed_arch_gaps"] = stack.fixed_arch_gaps() or None
    facts["jit.modules"] = list(stack.jit_modules)
    if stack.draft is not None:
        facts["draft.moe_backend"] = stack.draft.moe_backend
    driver, minimum = m.host_driver, stack.arch.min_driver
    if driver is not None and minimum is not None:
        facts["driver.below_minimum"] = Version(driver) < Version(minimum)
    facts["toolkit.past_cuda"] = _toolkit_past_cuda(m.cuda, facts) or None
    facts["model.slice_not_multiple_of_32"] = _slice_not_multiple_of_32(stack)
    # The manifest's own count first, else knowledge/models.yaml's (checkpoint.py: config.json).
    shape = known_shape(m.serve.model.id)
    table = shape.routed_experts if shape is not None else None
    facts["model.routed_experts"] = m.serve.model.num_experts or table
    if stack.serve_path is not None:
        facts["route.attention_backend"] = stack.serve_path.attention_backend
    switches = stack.start_switches
    if switches is not None:
        facts["start.trtllm_gate"] = switches.gate
        facts["start.open_switches"] = [f"{s}: {fix}" for s, fix in switches.open] or None
    return facts


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _toolkit_past_cuda(cuda: str, facts: dict[str, Any]) -> list[str]:
    """`package version` for each CUDA compiler wheel (knowledge/cuda.yaml compiler_wheels),
    pinned or locked, whose major.minor is past the stack's CUDA."""
    target = Version(cuda).release[:2]
    wheels = {_normalize(w) for w in cuda_facts().compiler_wheels}
    past = []
    for key, value in facts.items():
        if not key.startswith("pins.") or _normalize(key[5:]) not in wheels or value is None:
            continue
        try:
            release = Version(str(value)).release[:2]
        except InvalidVersion:
            continue
        if release > target:
            past.append(f"{key[5:]} {value}")
    return sorted(past)


def _slice_not_multiple_of_32(stack: ResolvedStack) -> bool | None:
    """Whether a tensor-parallel GPU's slice of the model's (MoE) intermediate width is not a
    multiple of 32 (or the width does not divide evenly); None when no width is given."""
    model, tp = stack.manifest.serve.model, stack.manifest.serve.tensor_parallel_size
    widths = [w for w in (model.intermediate_size, model.moe_intermediate_size) if w is not None]
    if not widths:
        return None
    return any(width % tp or (width // tp) % 32 for width in widths)


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
