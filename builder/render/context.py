"""Resolved stack -> build context (Dockerfile plus every file it copies), byte-for-byte stable.

A typed TemplateContext (spack's idea) is the only thing templates see, so they never reach into
manifest internals and StrictUndefined catches any name that drifts. The same stack renders to
identical bytes on any machine, clock, locale or environment: nothing here reads them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import jinja2

from builder import REPO_ROOT
from builder.errors import StackError
from builder.files import fingerprint
from builder.lock.inputs import base_reference
from builder.lock.locked import LockedStack, lock_stack
from builder.lock.lockfile import Lock
from builder.lock.reading import packages_base_lock
from builder.manifest.model import Patch
from builder.manifest.resolve import ResolvedStack, jit_module_table, local_wheels
from builder.manifest.serve import serve_argv
from builder.render.digests import DigestCache
from builder.render.jitdeps import jit_inputs_digest, jit_patches, jit_requirements
from builder.render.requirements import lock_requirements, uv_requirements

TEMPLATES_DIR = REPO_ROOT / "templates"
#: Where FlashInfer's JIT cache lives in every image (FLASHINFER_WORKSPACE_BASE): fixed, so
#: neither $HOME nor `docker run --user` can move it.
JIT_WORKSPACE = "/opt/flashinfer-cache"
VENV = "/opt/venv"
EXECUTABLE = 0o755
REGULAR = 0o644
#: The resolved manifest as the context carries it (ResolvedStack.to_json without the editorial
#: fields): what the content hash covers, and what the image's manifest label says.
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class TemplateContext:
    stack: str
    build_base: str
    runtime_base: str
    python_version: str
    build_apt_packages: list[str]
    runtime_apt_packages: list[str]
    #: Build and runtime bases are the same image: the runtime stage continues from patched
    #: instead of copying /opt/venv over, which would merge torch and every other package into
    #: one layer and keep the venv twice in the build cache (bench/RESULTS.md §4).
    runtime_from_build: bool
    heavy_packages: list[str]
    pip_flags: str
    wheels: list[str]
    has_overrides: bool
    patches: list[dict[str, Any]]
    jit_modules: list[str]
    aot_dir: str
    #: FlashInfer's cached_ops directory in the image.
    jit_dir: str
    #: Its parent, FlashInfer's per-version, per-arch workspace: the BuildKit cache mount. It
    #: holds generated/ too, the CUTLASS instantiations some generators write: outside the mount
    #: they were written afresh by every run, and ninja recompiled each object built from them
    #: (63 of fused_moe_120's 90 steps after an interruption, found on the 0.17 stack).
    jit_workspace_dir: str
    #: Named by exactly what the modules are compiled from (jitdeps.jit_inputs_digest), never
    #: by the stack: every stack of the same FlashInfer, torch, CUDA, arch and flags shares it.
    jit_cache_id: str
    #: The patches the jit-deps stage applies too (those to the packages it installs).
    jit_patches: list[dict[str, Any]]
    #: Where the compile step copies finished modules inside its own layer (see jit_cache.j2).
    jit_staging_dir: str
    max_jobs_default: int
    jit_env: dict[str, str]
    env: dict[str, str]
    port: int
    serve_argv: list[str]
    #: stacks/NAME.lock exists: install requirements/lock*.txt with --require-hashes --no-deps.
    locked: bool = False
    #: The lock's heavy part is not empty (its own, earlier layer).
    locked_heavy: bool = False
    #: The stack whose lock file it installs from: its own, or for a child that changes only
    #: serve settings, the parent's it builds on (lock.reading.inherited_lock).
    lock_name: str = ""
    #: Where the installer stage puts uv (mounted into the packages stage, never shipped).
    uv_dir: str = "/opt/sm120-stacks-uv"
    #: The stack whose lock's packages the packages stage installs first (requirements/
    #: lock-base.txt, lock.reading.packages_base_lock): an ancestor's, so that its image and
    #: all its children share that layer, or the stack's own.
    packages_base_name: str = ""
    #: The stack's own lock differs from that base: a second, small step installs it over the
    #: base (requirements/lock.txt) and uninstalls `lock_removes`, the base's packages it lacks.
    lock_over_base: bool = False
    lock_removes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CopiedFile:
    """A file the context takes from disk unchanged (a local wheel): named by its digest, and
    copied only when the context is written, so a large one is never held in memory."""

    source: Path
    sha256: str
    size: int
    #: files.fingerprint of the source when its digest was taken: a copy or a memo refuses a
    #: file that moved since.
    fingerprint: str


@dataclass(frozen=True)
class RenderedContext:
    """The build context: generated files in memory (relative path -> (bytes, mode)) and files
    copied from disk. One command renders a stack once and hands this down to every step."""

    stack: str
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    copied: dict[str, CopiedFile] = field(default_factory=dict)
    #: The lock the context installs from (None: resolved at build time). Kept so that later
    #: steps judge the image by the lock it was built from, without reading the file again.
    lock: Lock | None = None
    #: Set on a context pinned to this engine's bases (pinned_context): the content hash of the
    #: context it was pinned from. The image keeps the hash its manifest and lock give on every
    #: machine; the bases it was built on are in its label (image.basepins).
    recipe_hash: str | None = None
    #: role (build, runtime) -> the reference its stage's FROM names: the LockedStack's, decided
    #: once there, so the steps that pin or check the bases read them here, not again.
    bases: dict[str, str] = field(default_factory=dict)
    #: The lock whose set the packages stage installs first (LockedStack.packages_base), so
    #: that pinned_context renders the same two package steps.
    packages_base: Lock | None = None

    @property
    def dockerfile(self) -> str:
        return self.files["Dockerfile"][0].decode()

    @cached_property
    def _hash(self) -> str:
        digest = hashlib.sha256()
        for path in sorted({*self.files, *self.copied}):
            if path in self.files:
                content, mode = self.files[path]
                digest.update(f"{path}\0{mode:o}\0{len(content)}\0".encode())
                digest.update(content)
            else:
                copied = self.copied[path]
                digest.update(f"{path}\0{REGULAR:o}\0{copied.size}\0sha256:".encode())
                digest.update(copied.sha256.encode())
        return digest.hexdigest()

    def content_hash(self) -> str:
        """sha256 over every path, mode and content (a copied file by its sha256): the image's
        identity. A pinned context answers the hash of the context it was pinned from."""
        return self.recipe_hash or self._hash


def template_context(stack: ResolvedStack, lock: Lock | None = None) -> TemplateContext:
    """What the templates see for stack built from lock (None: unlocked)."""
    bases = (base_reference(stack, lock, "build"), base_reference(stack, lock, "runtime"))
    packages_base = packages_base_lock(stack, lock) if lock is not None else None
    return _template_context(stack, lock, *bases, packages_base)


def _template_context(
    stack: ResolvedStack,
    lock: Lock | None,
    build_base: str,
    runtime_base: str,
    packages_base: Lock | None = None,
) -> TemplateContext:
    """template_context with the FROM of each stage and the packages' base lock already known
    (a LockedStack's)."""
    m = stack.manifest
    build = m.build
    apt = list(build.apt_packages)
    if m.patches and "patch" not in apt:
        apt.append("patch")
    max_jobs_default = 2 if build.max_jobs == "auto" else build.max_jobs
    jit_env: dict[str, str] = {
        **stack.arch.env,
        **build.toolchain_env,
        "FLASHINFER_WORKSPACE_BASE": JIT_WORKSPACE,
        "FLASHINFER_NVCC_THREADS": str(build.nvcc_threads),
    }
    runtime_from_build = build_base == runtime_base
    jit_env = dict(sorted(jit_env.items()))
    runtime_apt = [p for p in build.runtime_apt_packages if not (runtime_from_build and p in apt)]
    return TemplateContext(
        stack=stack.name,
        build_base=build_base,
        runtime_base=runtime_base,
        python_version=m.python.version,
        build_apt_packages=apt,
        runtime_apt_packages=runtime_apt,
        runtime_from_build=runtime_from_build,
        heavy_packages=[p for p in m.python.heavy if p in m.python.packages],
        pip_flags="--find-links /opt/sm120-stacks/wheels " if m.python.wheels else "",
        wheels=[Path(w).name for w in m.python.wheels],
        has_overrides=bool(m.python.overrides),
        patches=[_patch_entry(p) for p in m.patches],
        jit_modules=list(stack.jit_modules),
        aot_dir=f"{VENV}/lib/python{m.python.version}/site-packages/flashinfer/data/aot",
        jit_dir=jit_cached_ops_dir(stack),
        jit_workspace_dir=flashinfer_workspace_dir(stack),
        jit_staging_dir="/opt/sm120-stacks-jit/cached_ops",
        jit_cache_id=f"sm120-stacks-flashinfer-workspace-{flashinfer_version(stack)}"
        f"-{stack.arch.jit_arch_tag}-py{m.python.version}"
        f"-{jit_inputs_digest(stack, lock, build_base, apt, jit_env)}",
        jit_patches=[_patch_entry(p) for p in jit_patches(stack, lock)],
        max_jobs_default=max_jobs_default,
        jit_env=jit_env,
        env=dict(sorted(m.env.items())),
        port=m.serve.port,
        serve_argv=serve_argv(stack),
        locked=lock is not None,
        lock_name=lock.stack if lock is not None else stack.name,
        locked_heavy=bool(lock and lock.python.heavy),
        **_packages_layers(lock, packages_base or lock),
    )


def _packages_layers(lock: Lock | None, base: Lock | None) -> dict[str, Any]:
    """The packages stage's two steps: the base lock's set, then the stack's own over it."""
    if lock is None or base is None:
        return {}
    own, shared = lock.python.packages, base.python.packages
    return {
        "packages_base_name": base.stack,
        "lock_over_base": own != shared,
        "lock_removes": sorted(set(shared) - set(own)),
    }


def _patch_entry(patch: Patch) -> dict[str, Any]:
    return {"file": Path(patch.file).name, "strip": patch.strip}


def flashinfer_workspace_dir(stack: ResolvedStack) -> str:
    """FlashInfer's per-version, per-arch workspace: <base>/.cache/flashinfer/<version>/<arch
    tag>, holding cached_ops/ and generated/ (flashinfer/jit/env.py)."""
    version = flashinfer_version(stack)
    return f"{JIT_WORKSPACE}/.cache/flashinfer/{version}/{stack.arch.jit_arch_tag}"


def jit_cached_ops_dir(stack: ResolvedStack) -> str:
    """Where FlashInfer keeps this stack's compiled modules."""
    return f"{flashinfer_workspace_dir(stack)}/cached_ops"


def flashinfer_version(stack: ResolvedStack) -> str:
    python = stack.manifest.python
    pin = {**python.packages, **python.overrides}.get("flashinfer-python")
    return pin.version if pin else "none"


def requirements(
    stack: ResolvedStack,
    names: list[str] | None = None,
    overrides: bool = False,
    constraints: bool = False,
) -> str:
    """A pip requirements file of the pins; constraints carry no extras (pip refuses them)."""
    py = stack.manifest.python
    lines = [f"--index-url {py.index_url}"] + [
        f"--extra-index-url {u}" for u in py.extra_index_urls
    ]
    for name, pin in (py.overrides if overrides else py.packages).items():
        if names is None or name in names:
            extras = f"[{','.join(pin.extras)}]" if pin.extras and not constraints else ""
            lines.append(f"{name}{extras}=={pin.version}")
    return "\n".join(lines) + "\n"


def render(
    stack: ResolvedStack,
    templates_dir: Path = TEMPLATES_DIR,
    digests: DigestCache | None = None,
) -> RenderedContext:
    """render_locked with the stack's lock read here (a stale lock is an error): for callers
    that hold no LockedStack (tests, benches, `diff`)."""
    locked = lock_stack(stack)
    if locked.stale is not None:
        raise locked.stale
    return render_locked(locked, templates_dir, digests)


def render_locked(
    locked: LockedStack,
    templates_dir: Path = TEMPLATES_DIR,
    digests: DigestCache | None = None,
) -> RenderedContext:
    """Everything the image is built from, of the stack and the lock the command read once
    (lock.locked.lock_stack). `digests` remembers large files' hashes across commands (the CLI
    keeps one under the build folder); without it they are hashed afresh."""
    digests = digests or DigestCache()
    stack, lock = locked.stack, locked.lock
    ctx = _template_context(
        stack, lock, locked.build_base, locked.runtime_base, locked.packages_base
    )
    files: dict[str, tuple[bytes, int]] = {
        "Dockerfile": (_dockerfile(stack, ctx, templates_dir), REGULAR),
        MANIFEST_FILE: (
            (json.dumps(stack.to_json(editorial=False), indent=2, sort_keys=True) + "\n").encode(),
            REGULAR,
        ),
        "requirements/all.txt": (requirements(stack).encode(), REGULAR),
        "requirements/constraints.txt": (requirements(stack, constraints=True).encode(), REGULAR),
        "requirements/heavy.txt": (requirements(stack, ctx.heavy_packages).encode(), REGULAR),
        # The jit-deps stage's own file: it copies this alone, so that no other pin reaches it.
        "requirements/jit.txt": (jit_requirements(stack, lock).encode(), REGULAR),
        "requirements/uv.txt": (uv_requirements(stack.manifest.python.index_url).encode(), REGULAR),
    }
    if stack.manifest.python.overrides:
        files["requirements/overrides.txt"] = (
            requirements(stack, overrides=True).encode(),
            REGULAR,
        )
    if lock is not None:
        if ctx.locked_heavy:
            files["requirements/lock-heavy.txt"] = (
                lock_requirements(lock, "heavy").encode(),
                REGULAR,
            )
        files["requirements/lock.txt"] = (lock_requirements(lock, "packages").encode(), REGULAR)
        # The set the packages stage installs first: byte for byte its base stack's lock.txt,
        # so that the COPY and the install over it are one BuildKit step for all of them.
        base = locked.packages_base or lock
        files["requirements/lock-base.txt"] = (
            lock_requirements(base, "packages").encode(),
            REGULAR,
        )
    for tool in sorted((templates_dir / "tools").iterdir()):
        if not tool.is_file():
            continue  # a __pycache__ left by a local import of a tool is not part of the image
        mode = EXECUTABLE if os.access(tool, os.X_OK) else REGULAR
        files[f"tools/{tool.name}"] = (tool.read_bytes(), mode)
    files["tools/jit-modules.json"] = (
        (json.dumps(jit_module_table(stack), indent=2, sort_keys=True) + "\n").encode(),
        REGULAR,
    )
    copied: dict[str, CopiedFile] = {}
    for source in local_wheels(stack):
        seen = fingerprint(source)  # before the digest: a change while hashing is then seen
        copied[f"wheels/{source.name}"] = CopiedFile(
            source, digests.sha256(source), source.stat().st_size, seen
        )
    files.update(_patch_files(stack, {p["file"] for p in ctx.jit_patches}))
    bases = {"build": locked.build_base, "runtime": locked.runtime_base}
    return RenderedContext(
        stack=stack.name,
        files=files,
        copied=copied,
        lock=lock,
        bases=bases,
        packages_base=locked.packages_base,
    )


def pinned_context(
    rendered: RenderedContext,
    stack: ResolvedStack,
    pins: dict[str, str],
    templates_dir: Path = TEMPLATES_DIR,
) -> RenderedContext:
    """rendered with each base FROM names by tag replaced by the content reference pins give
    for it (tag -> `REPO:TAG-id-<image id>`, bases.content_reference): the Dockerfile a build
    runs, whose FROM, compile cache id and label name the same image. Its content hash stays
    rendered's (RenderedContext.recipe_hash)."""
    if not pins:
        return rendered
    build_base, runtime_base = rendered.bases["build"], rendered.bases["runtime"]
    ctx = _template_context(
        stack,
        rendered.lock,
        pins.get(build_base, build_base),
        pins.get(runtime_base, runtime_base),
        rendered.packages_base,
    )
    files = {**rendered.files, "Dockerfile": (_dockerfile(stack, ctx, templates_dir), REGULAR)}
    return replace(rendered, files=files, recipe_hash=rendered.content_hash())


def _dockerfile(stack: ResolvedStack, ctx: TemplateContext, templates_dir: Path) -> bytes:
    template = stack.manifest.build.template or "Dockerfile.j2"
    return _tidy(_jinja_env(templates_dir).get_template(template).render(ctx=ctx)).encode()


def _patch_files(stack: ResolvedStack, jit_names: set[str]) -> dict[str, tuple[bytes, int]]:
    """The stack's patches with their SHA256SUMS, and the jit-deps stage's own sums of the
    patches it applies (jit_names): none without patches."""
    files: dict[str, tuple[bytes, int]] = {}
    if not stack.manifest.patches:
        return files
    sums = []
    for patch in stack.manifest.patches:
        content = stack.local_file(patch.file).read_bytes()
        name = Path(patch.file).name
        files[f"patches/{name}"] = (content, REGULAR)
        sums.append(f"{hashlib.sha256(content).hexdigest()}  {name}")
    files["patches/SHA256SUMS"] = (("\n".join(sums) + "\n").encode(), REGULAR)
    if jit_names:
        jit_sums = [line for line in sums if line.split("  ", 1)[1] in jit_names]
        files["patches/SHA256SUMS.jit"] = (("\n".join(jit_sums) + "\n").encode(), REGULAR)
    return files


def write_context(rendered: RenderedContext, target: Path) -> Path:
    """Write the context to target atomically: a complete new directory or the old one untouched."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for relative, (content, mode) in sorted(rendered.files.items()):
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            path.chmod(mode)
        for relative, copied in sorted(rendered.copied.items()):
            _copy_unchanged(copied, staging / relative)
        if target.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            target.rename(retired / "context")
            staging.rename(target)
            shutil.rmtree(retired)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _copy_unchanged(copied: CopiedFile, path: Path) -> None:
    """Copy a file into the context, refusing one that changed since its digest was taken: the
    image would carry bytes its content hash does not name."""
    stat = copied.source.stat()  # its mode: a hard link keeps the source's
    if fingerprint(copied.source) != copied.fingerprint:
        raise StackError(
            f"{copied.source} changed while the context was written",
            hint="run the command again once nothing writes to that file",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if stat.st_mode & 0o777 == REGULAR:
        try:
            os.link(copied.source, path)  # same file system: no copy of hundreds of MB
            return
        except OSError:
            pass
    shutil.copyfile(copied.source, path)
    path.chmod(REGULAR)


@cache
def _jinja_env(templates_dir: Path) -> jinja2.Environment:
    """One environment per templates folder: compiled templates are reused across stacks."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=False,
    )
    env.filters["shq"] = lambda value: shlex.quote(str(value))
    env.filters["dq"] = dockerfile_quote
    env.filters["envlines"] = lambda mapping: " \\\n    ".join(
        f"{key}={dockerfile_quote(value)}" for key, value in mapping.items()
    )
    env.policies["json.dumps_kwargs"] = {"sort_keys": False, "ensure_ascii": True}
    return env


def dockerfile_quote(value: object) -> str:
    """A double-quoted Dockerfile ENV/LABEL value: backslash, quote and $ escaped."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{text}"'


def _tidy(text: str) -> str:
    """One trailing newline, no trailing spaces, one blank line between stages."""
    lines = [line.rstrip() for line in text.strip().splitlines()]
    kept = [line for i, line in enumerate(lines) if line or (i > 0 and lines[i - 1])]
    return "\n".join(kept) + "\n"
