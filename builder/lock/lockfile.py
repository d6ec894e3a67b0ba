"""Lock files: a stack's base images and complete Python dependency set, frozen with hashes.

The manifest pins what we chose (torch, vLLM, ...); a fresh resolution still floats everything
they pull in (environment.md: nvidia-cuda-nvcc floated to 13.5). `sm120-stacks lock STACK`
resolves the whole set once with uv for the stack's platform, Python and indexes and writes
stacks/STACK.lock; builds then install exactly that set with `pip --require-hashes --no-deps`.
The lock records the manifest inputs it was made from, so a lock that no longer matches its
manifest is refused by builds and reported by `check` instead of silently installing old pins.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, StringConstraints

from builder.engine.protocol import Engine
from builder.errors import (
    EngineError,
    EngineNotFound,
    EngineUnreachable,
    RegistryUnreachable,
    StackError,
    ToolMissing,
)
from builder.files import write_atomic
from builder.spec.knowledge import parse_document
from builder.spec.manifest import Digest, ImageRef, PackageName, Url
from builder.spec.resolve import ResolvedStack, canonical_json, local_wheels
from builder.spec.strict import Strict
from builder.spec.yamlsafe import MAX_BYTES, load_yaml

LOCK_SCHEMA = 1
#: What a parse cache file holds (_ParseCacheEntry); 1 was the bare lock.
PARSE_CACHE_FORMAT = 2
#: uv's target per manifest platform. manylinux_2_28 (glibc 2.28) is below every base we use
#: (Debian 12: 2.36, Ubuntu 24.04: 2.39), so a wheel it picks always installs in the image.
UV_PLATFORMS = {"linux/amd64": "x86_64-manylinux_2_28", "linux/arm64": "aarch64-manylinux_2_28"}
UV_TIMEOUT_S = 900
HEADER = (
    "# Written by `sm120-stacks lock {stack}`: the complete, hash-checked input set of its image.\n"
    "# Do not edit; change stacks/{stack}.yaml and lock again. Builds refuse a stale lock.\n"
)

Hash = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
Version = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.+!_-]+$")]


#: The note of a base the registry could not be asked about: recorded in the lock.
UNPINNED = "NOT PINNED: "


class LockedBase(Strict):
    image: ImageRef
    #: The digest the registry gave for image when locked; None when it could not be asked
    #: (the note says why: no engine, or a registry that could not be reached at all).
    digest: Digest | None = None
    note: str = ""

    @property
    def reference(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image

    @property
    def unpinned(self) -> bool:
        """A build FROM it takes whatever the tag points to that day."""
        return self.digest is None


class LockedBases(Strict):
    build: LockedBase
    runtime: LockedBase


class LockedPackage(Strict):
    version: Version
    hashes: list[Hash] = Field(min_length=1)


class VersionSource(Strict):
    """Another lock whose versions this one was resolved to prefer (`lock --versions-from`).

    A local variant of a flagship (another Python, say) then installs the flagship's locked
    set wherever its Python allows; the packages where it does not are listed, not hidden.
    """

    stack: str
    inputs_hash: Hash
    #: Packages at another version here, or on one side only: name -> "theirs -> ours".
    differs: dict[PackageName, str] = Field(default_factory=dict)


class LockedPython(Strict):
    version: str
    platform: str
    resolver: str
    index_url: Url
    extra_index_urls: list[Url] = Field(default_factory=list)
    #: The heavy packages (torch and all it needs): installed first, in a layer of their own.
    heavy: dict[PackageName, LockedPackage] = Field(default_factory=dict)
    #: Everything else the stack needs.
    packages: dict[PackageName, LockedPackage]
    versions_from: VersionSource | None = None

    def versions(self) -> dict[str, str]:
        return {name: pin.version for name, pin in {**self.heavy, **self.packages}.items()}


class Lock(Strict):
    schema_version: Literal[1]
    stack: str
    #: sha256 of the manifest inputs below; what builds and `check` compare.
    inputs_hash: Hash
    #: sha256 of what the lock pins (bases and the Python set): a lock cut short or edited by
    #: hand still validates package by package, so the whole is checked against this (kept
    #: near the top, where a cut leaves it). Locks made before it existed have none.
    locked_hash: Hash | None = None
    inputs: dict[str, Any]
    bases: LockedBases
    python: LockedPython

    def pinned_hash(self) -> str:
        pinned = self.model_dump(mode="json", include={"bases", "python"})
        return "sha256:" + hashlib.sha256(canonical_json(pinned).encode()).hexdigest()


# --- inputs ------------------------------------------------------------------------------------


#: Digests of parsed locks' Python sets, by lock object (frozen, so its digest cannot move;
#: a copy with changes is another object). The weak reference tells a reused id apart.
_python_digests: dict[int, tuple[weakref.ref[Lock], str]] = {}


def python_digest(lock: Lock) -> str:
    """sha256 of the locked Python set (where its versions came from left out: a note, not an
    input): what the JIT compile's objects are built against. Its canonical JSON is most of a
    lock's 400 kB, so a lock read from its file takes the digest from the parse cache, where it
    was worked out once for these very bytes."""
    known = _python_digests.get(id(lock))
    if known is not None and known[0]() is lock:
        return known[1]
    python = lock.python.model_dump(mode="json", exclude={"versions_from"})
    digest = "sha256:" + hashlib.sha256(canonical_json(python).encode()).hexdigest()
    _remember_python_digest(lock, digest)
    return digest


def _remember_python_digest(lock: Lock, digest: str) -> None:
    key = id(lock)
    _python_digests[key] = (weakref.ref(lock, lambda _: _python_digests.pop(key, None)), digest)


def lock_path(stack: ResolvedStack) -> Path:
    """stacks/NAME.lock, beside the stack's own manifest."""
    return stack.sources[0].with_name(f"{stack.name}.lock")


def lock_inputs(stack: ResolvedStack) -> dict[str, Any]:
    """What a lock depends on: platform, bases, the python section and the local wheels' bytes.

    Serve settings, env or JIT modules are left out on purpose: changing them needs no new lock.
    """
    m = stack.manifest
    wheels = {
        path.name: "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        for path in local_wheels(stack)
    }
    bases = original_bases(stack)
    return {
        "lock_schema": LOCK_SCHEMA,
        "platform": m.platform,
        "bases": {
            role: {"image": image, "digest": digest} for role, (image, digest) in bases.items()
        },
        "python": m.python.model_dump(mode="json"),
        "wheel_files": wheels,
    }


def original_bases(stack: ResolvedStack) -> dict[str, tuple[str, str | None]]:
    """role -> (image, digest) as the manifest wrote them, before any site substitution.

    A lock pins the manifest's bases; a site that builds FROM a mirror (--substitute-base)
    uses the same lock, and its substitute wins over the locked digest.
    """
    undo = {new: old for old, new in _substitutions(stack).items()}
    out: dict[str, tuple[str, str | None]] = {}
    for role in ("build", "runtime"):
        base = getattr(stack.manifest.bases, role)
        image, _, digest = undo.get(base.reference, base.reference).partition("@")
        out[role] = (image, digest or None)
    return out


def base_reference(stack: ResolvedStack, lock: Lock | None, role: str) -> str:
    """What FROM uses: a substituted base as substituted, else the locked digest, else the
    manifest's reference."""
    base = getattr(stack.manifest.bases, role)
    if lock is None or base.reference in _substitutions(stack).values():
        return str(base.reference)
    return str(getattr(lock.bases, role).reference)


#: Base images made on the build machine (`make base-local`, `make base-cuda-local`): no
#: registry holds them, so no digest can pin them; the image IDs the build records do.
LOCAL_BASE_PREFIX = "local/"


def floating_bases(stack: ResolvedStack, lock: Lock | None) -> list[str]:
    """The roles whose FROM follows a tag: a registry image with no digest in the lock or the
    manifest. A substituted base (a site's mirror or local image) and a local base are the
    site's own choice and not counted."""
    floating = []
    for role in ("build", "runtime"):
        reference = base_reference(stack, lock, role)
        base = getattr(stack.manifest.bases, role)
        substituted = base.reference in _substitutions(stack).values()
        local = reference.startswith(LOCAL_BASE_PREFIX)
        if "@sha256:" not in reference and not substituted and not local:
            floating.append(role)
    return floating


def refresh_bases(
    stack: ResolvedStack, lock: Lock, engine: Engine | None
) -> tuple[Lock, list[str]]:
    """The lock with each base's digest asked of its registry again (no package resolution):
    a digest the registry gives replaces the locked one (said, with both); a registry that
    cannot be reached leaves the locked digest as it was (said too)."""
    said: list[str] = []
    bases = {}
    for role in ("build", "runtime"):
        locked: LockedBase = getattr(lock.bases, role)
        asked = resolve_base(locked.image, None, engine)
        if asked.digest is None:
            said.append(f"{role} base {locked.image}: not verified ({asked.note}); kept")
            bases[role] = locked
        elif asked.digest == locked.digest:
            said.append(f"{role} base {locked.image}: verified, {asked.digest}")
            bases[role] = asked
        else:
            said.append(f"{role} base {locked.image}: {locked.digest} -> {asked.digest}")
            bases[role] = asked
    refreshed = lock.model_copy(update={"bases": LockedBases(**bases)})
    return refreshed, said


def _substitutions(stack: ResolvedStack) -> dict[str, str]:
    return dict(getattr(stack, "base_substitutions", None) or {})


def inputs_hash(inputs: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(inputs).encode()).hexdigest()


def normalize(name: str) -> str:
    """PEP 503 name: what uv prints and what comparisons use."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- reading -----------------------------------------------------------------------------------


def read_lock(path: Path) -> Lock:
    """A lock file, validated; any problem is a StackError with the file, key and line.

    A lock is a few hundred kB of hashes, and one command asks for it several times (its
    freshness, its versions for the rules, its requirements for the context): it is parsed once
    per process for as long as the file is unchanged (size, mtime, inode), and the parsed lock
    is frozen, so sharing it is safe."""
    stat = path.stat()
    if stat.st_size > MAX_BYTES:
        raise StackError(f"lock file is larger than {MAX_BYTES} bytes", file=path)
    return _parsed_lock(path.resolve(), stat.st_size, stat.st_mtime_ns, stat.st_ino)


@functools.lru_cache(maxsize=64)
def _parsed_lock(path: Path, size: int, mtime_ns: int, inode: int) -> Lock:
    """Parsed from the YAML, or from the parse cache when these very bytes were parsed before:
    YAML parsing is most of what `list` and `check` cost (30 ms a lock), the validated JSON of
    the same lock loads in 2."""
    raw = path.read_bytes()
    cached = _parse_cache_file(raw)
    if cached is not None:
        try:
            entry = _ParseCacheEntry.model_validate_json(cached.read_bytes())
        except (OSError, ValueError):
            pass  # unreadable or from another version of the model: parse the YAML again
        else:
            _remember_python_digest(entry.lock, entry.python_digest)
            return entry.lock
    lock = parse_document(load_yaml(path), Lock)
    if lock.locked_hash is not None and lock.locked_hash != lock.pinned_hash():
        raise StackError(
            "what the lock pins does not match its locked_hash: the file was cut short or "
            "edited by hand",
            file=path,
            key="locked_hash",
            hint=f"run `sm120-stacks lock {lock.stack}` again (or restore the file from git)",
        )
    if cached is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written costs time only
            entry = _ParseCacheEntry(lock=lock, python_digest=python_digest(lock))
            write_atomic(cached, entry.model_dump_json())
    return lock


class _ParseCacheEntry(Strict):
    """A parse cache file: the validated lock and what is slow to derive from it."""

    python_digest: Hash
    lock: Lock


def _parse_cache_file(raw: bytes) -> Path | None:
    """Where the parsed form of a lock with these bytes is kept: named by their sha256 and
    the lock schema, so it cannot go stale; $SM120_STACKS_CACHE_DIR, else the user's cache
    folder ($XDG_CACHE_HOME or ~/.cache); None where neither can be found."""
    explicit, user = os.environ.get("SM120_STACKS_CACHE_DIR"), os.environ.get("XDG_CACHE_HOME")
    if explicit:
        base = Path(explicit)
    elif user:
        base = Path(user) / "sm120-stacks"
    else:
        try:
            base = Path.home() / ".cache" / "sm120-stacks"
        except RuntimeError:  # no home directory
            return None
    digest = hashlib.sha256(raw).hexdigest()
    return base / "parsed-locks" / f"v{LOCK_SCHEMA}-c{PARSE_CACHE_FORMAT}-{digest}.json"


def stale_reason(stack: ResolvedStack, lock: Lock) -> str | None:
    """Why the lock does not match the manifest now (None when it does)."""
    current = lock_inputs(stack)
    if inputs_hash(lock.inputs) != lock.inputs_hash:
        return "its recorded inputs do not match its inputs_hash (edited by hand?)"
    if lock.stack == stack.name and inputs_hash(current) == lock.inputs_hash:
        return None
    if lock.stack != stack.name:
        return f"it was made for stack {lock.stack!r}"
    was, now = flatten(lock.inputs), flatten(current)
    changed = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
    if not changed:
        return "its inputs_hash does not match its recorded inputs (edited by hand?)"
    shown = ", ".join(
        f"{key} ({_short(was.get(key))} -> {_short(now.get(key))})" for key in changed[:4]
    )
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    return f"the manifest changed since it was made: {shown}{more}"


def current_lock(stack: ResolvedStack) -> Lock | None:
    """The stack's lock for a build: None without one; a stale or broken lock is an error."""
    path = lock_path(stack)
    if not path.is_file():
        return None
    lock = read_lock(path)
    reason = stale_reason(stack, lock)
    if reason is not None:
        raise StackError(
            f"lock no longer matches stacks/{stack.name}.yaml: {reason}",
            file=path,
            key="inputs_hash",
            hint=f"run `sm120-stacks lock {stack.name}`, or delete the lock to build without one",
        )
    return lock


def locked_versions(stack: ResolvedStack) -> dict[str, str] | None:
    """The versions the stack's lock installs (name -> version), for the compatibility rules:
    None without a lock or with a stale one (`check` reports that on its own)."""
    path = lock_path(stack)
    if not path.is_file():
        return None
    lock = read_lock(path)
    return lock.python.versions() if stale_reason(stack, lock) is None else None


# --- making ------------------------------------------------------------------------------------


def make_lock(stack: ResolvedStack, engine: Engine | None, prefer: Lock | None = None) -> Lock:
    """Resolve the stack's complete dependency set (uv) and its base digests (engine).

    With `prefer`, uv starts from that lock's versions and moves only what this stack's
    Python, platform or pins require (uv keeps the pins of an existing output file).
    """
    bases = original_bases(stack)
    # Asked first, once per image (build and runtime are usually the same one): a registry that
    # refuses stops the lock before minutes of package resolution.
    found = {base: resolve_base(*base, engine) for base in set(bases.values())}
    uv = find_uv()
    m = stack.manifest
    py = m.python
    with tempfile.TemporaryDirectory(prefix="sm120-lock-") as scratch:
        work = Path(scratch)
        top = [_spec(name, pin.version, pin.extras) for name, pin in py.packages.items()]
        overrides = [_spec(name, pin.version, []) for name, pin in py.overrides.items()]
        # An override is installed whether or not anything asks for it (unlocked builds install
        # overrides.txt on their own); uv's --override only replaces requirements, so an
        # override nothing depends on (flashinfer-cubin on the 0.17 stack) is also a direct one.
        preferred = prefer.python.versions() if prefer is not None else None
        full = _compile(
            uv, stack, work, "all", top + overrides, overrides, constraints=None, prefer=preferred
        )
        _check_pins_locked(stack, full)
        heavy_names = {normalize(n) for n in py.heavy if n in py.packages}
        heavy: dict[str, LockedPackage] = {}
        if heavy_names:
            heavy_top = [s for s in top if normalize(_spec_name(s)) in heavy_names]
            pinned = [f"{name}=={pkg.version}" for name, pkg in full.items()]
            subset = _compile(uv, stack, work, "heavy", heavy_top, overrides, constraints=pinned)
            heavy = {name: full[name] for name in subset if name in full}
    inputs = lock_inputs(stack)
    return Lock(
        schema_version=LOCK_SCHEMA,
        stack=stack.name,
        inputs_hash=inputs_hash(inputs),
        inputs=inputs,
        bases=LockedBases(build=found[bases["build"]], runtime=found[bases["runtime"]]),
        python=LockedPython(
            version=py.version,
            platform=UV_PLATFORMS[m.platform],
            resolver=_uv_version(uv),
            index_url=py.index_url,
            extra_index_urls=list(py.extra_index_urls),
            heavy=heavy,
            packages={n: p for n, p in full.items() if n not in heavy},
            versions_from=_version_source(prefer, full) if prefer is not None else None,
        ),
    )


def _version_source(prefer: Lock, locked: dict[str, LockedPackage]) -> VersionSource:
    theirs, ours = prefer.python.versions(), {n: p.version for n, p in locked.items()}
    differs = {
        name: f"{theirs.get(name, 'absent')} -> {ours.get(name, 'absent')}"
        for name in sorted(theirs.keys() | ours.keys())
        if theirs.get(name) != ours.get(name)
    }
    return VersionSource(stack=prefer.stack, inputs_hash=prefer.inputs_hash, differs=differs)


def write_lock(path: Path, lock: Lock) -> None:
    """Atomically, as YAML with one hash per line (diffs in review show exactly what moved)."""
    lock = lock.model_copy(update={"locked_hash": lock.pinned_hash()})
    data = lock.model_dump(mode="json")
    if lock.python.versions_from is None:
        del data["python"]["versions_from"]  # locks made without a preference stay as they were
    text = HEADER.format(stack=lock.stack) + yaml.dump(
        data, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=200
    )
    if len(text.encode()) > MAX_BYTES:
        raise StackError(
            f"the lock would be {len(text.encode())} bytes, over the {MAX_BYTES}-byte file limit",
            file=path,
            hint="fewer packages or indexes with fewer wheels per release",
        )
    write_atomic(path, text)


def resolve_base(image: str, digest: str | None, engine: Engine | None) -> LockedBase:
    """The registry's digest for image. Without an engine, or when the registry cannot be
    reached at all, the image as given, its note saying so; any other failure (authentication,
    no such image or tag) is a StackError naming the image."""
    if digest:
        return LockedBase(image=image, digest=digest, note="digest pinned in the manifest")
    if engine is None:
        return LockedBase(image=image, note=UNPINNED + "no Docker engine to ask a registry")
    try:
        found = engine.registry_digest(image)
    except RegistryUnreachable as exc:
        reason = _reason(exc)
        return LockedBase(image=image, note=f"{UNPINNED}registry not reachable ({reason})")
    except EngineUnreachable as exc:
        return LockedBase(image=image, note=f"{UNPINNED}engine not reachable ({_reason(exc)})")
    except EngineNotFound as exc:
        raise StackError(
            f"base image {image}: the registry has no such image or tag ({_reason(exc)})",
            hint="check the image name and tag in the manifest's bases; no lock was written",
        ) from None
    except EngineError as exc:
        reason = _reason(exc)
        raise StackError(
            f"base image {image}: the registry refused to give its digest ({reason})",
            hint="log in to that registry (`docker login HOST`) or check the image name; "
            "no lock was written",
        ) from None
    return LockedBase(image=image, digest=found, note="digest resolved from the registry")


def _reason(exc: EngineError) -> str:
    return " ".join(exc.explanation.split())[:300]


def find_uv() -> Path:
    """uv from PATH or beside this Python (pip installs it into the virtual environment)."""
    for candidate in (shutil.which("uv"), Path(sys.executable).parent / "uv"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise ToolMissing(
        "uv is not installed (it resolves lock files)",
        hint="pip install uv (part of sm120-stacks' dependencies)",
    )


def _check_pins_locked(stack: ResolvedStack, locked: dict[str, LockedPackage]) -> None:
    """Every pin of the manifest must be in the lock at its version (`==` semantics: a local
    label such as +cu128 matches), or builds would install what the image checks refuse."""
    py = stack.manifest.python
    wrong = []
    for name, pin in {**py.packages, **py.overrides}.items():
        got = locked.get(normalize(name))
        if got is None or got.version.split("+")[0] != pin.version.split("+")[0]:
            wrong.append(f"{name}=={pin.version} (locked: {got.version if got else 'absent'})")
    if wrong:
        raise StackError(
            f"the resolution of {stack.name} does not hold its pins: {', '.join(wrong)}",
            file=stack.sources[0],
            key="python",
            hint="report this with the uv version; no lock was written",
        )


def _compile(
    uv: Path,
    stack: ResolvedStack,
    work: Path,
    label: str,
    requirements: list[str],
    overrides: list[str],
    constraints: list[str] | None,
    prefer: dict[str, str] | None = None,
) -> dict[str, LockedPackage]:
    py = stack.manifest.python
    source = work / f"{stack.name}-{label}.in"
    source.write_text("\n".join(requirements) + "\n")
    argv = [
        str(uv),
        "pip",
        "compile",
        "--no-config",
        "--quiet",
        "--generate-hashes",
        "--no-header",
        "--no-annotate",
        "--python-platform",
        UV_PLATFORMS[stack.manifest.platform],
        "--python-version",
        py.version,
        "--index-url",
        py.index_url,
        *[arg for url in py.extra_index_urls for arg in ("--extra-index-url", url)],
    ]
    for folder in sorted({str(stack.local_file(w).resolve().parent) for w in py.wheels}):
        argv += ["--find-links", folder]
    if overrides:
        (work / "overrides.txt").write_text("\n".join(overrides) + "\n")
        argv += ["--override", str(work / "overrides.txt")]
    if constraints is not None:
        (work / "constraints.txt").write_text("\n".join(constraints) + "\n")
        argv += ["--constraint", str(work / "constraints.txt")]
    output = work / f"{label}.txt"
    if prefer:
        output.write_text("".join(f"{name}=={version}\n" for name, version in prefer.items()))
    argv += ["--output-file", str(output), str(source)]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=UV_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StackError(f"uv did not resolve {stack.name} within {UV_TIMEOUT_S}s") from None
    if result.returncode != 0:
        detail = "\n    ".join(result.stderr.strip().splitlines()[-12:])
        raise StackError(
            f"uv could not resolve the python section of {stack.name}:\n    {detail}",
            file=stack.sources[0],
            key="python",
            hint="fix the pins (or indexes/wheels); network errors: check the proxy CA "
            "(SSL_CERT_FILE) and UV_NATIVE_TLS",
        )
    return parse_compiled(output.read_text())


def parse_compiled(text: str) -> dict[str, LockedPackage]:
    """`uv pip compile --generate-hashes` output -> {name: version + hashes}."""
    packages: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if match := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s\\;]+)", line):
            current = normalize(match.group(1))
            packages[current] = (match.group(3), [])
        elif stripped.startswith("--hash=") and current is not None:
            packages[current][1].append(stripped.removeprefix("--hash=").rstrip(" \\"))
        elif not line.startswith((" ", "-")):
            raise StackError(f"unexpected line in uv's output: {line[:120]!r}")
    missing = [name for name, (_, hashes) in packages.items() if not hashes]
    if missing:
        raise StackError(
            f"uv found no hash for {', '.join(missing)}",
            hint="a hash-checked install needs one per package: the index or find-links source "
            "must publish sha256 digests",
        )
    return {n: LockedPackage(version=v, hashes=sorted(h)) for n, (v, h) in sorted(packages.items())}


def _spec(name: str, version: str, extras: list[str]) -> str:
    return f"{name}{'[' + ','.join(extras) + ']' if extras else ''}=={version}"


def _spec_name(spec: str) -> str:
    return re.split(r"[\[=]", spec, maxsplit=1)[0]


def _uv_version(uv: Path) -> str:
    result = subprocess.run([str(uv), "--version"], capture_output=True, text=True, timeout=30)
    return result.stdout.strip() or "uv (unknown version)"


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted key paths: how a lock's inputs and two stacks are compared."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def _short(value: Any) -> str:
    text = "unset" if value is None else canonical_json(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _NoAliasDumper(yaml.SafeDumper):
    """Equal lists must be written out each time: the strict reader refuses YAML aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
