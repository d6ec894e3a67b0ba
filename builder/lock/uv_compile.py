"""Making a lock: the stack's complete Python set resolved with `uv pip compile` for its
platform, Python and indexes (the heavy part resolved again inside the whole), every pin of
the manifest checked to be held, and uv's output parsed into packages with their hashes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from builder.engine.protocol import Engine
from builder.engine.scratch import die_with_parent
from builder.errors import (
    StackError,
    ToolMissing,
)
from builder.lock.bases import resolve_base
from builder.lock.inputs import inputs_hash, lock_inputs, original_bases
from builder.lock.lockfile import (
    LOCK_SCHEMA,
    Lock,
    LockedBases,
    LockedPackage,
    LockedPython,
    VersionSource,
    normalize,
)
from builder.manifest.resolve import ResolvedStack

#: uv's target per manifest platform. manylinux_2_28 (glibc 2.28) is below every base we use
#: (Debian 12: 2.36, Ubuntu 24.04: 2.39), so a wheel it picks always installs in the image.
UV_PLATFORMS = {"linux/amd64": "x86_64-manylinux_2_28", "linux/arm64": "aarch64-manylinux_2_28"}

UV_TIMEOUT_S = 900


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
    """One `uv pip compile` of requirements (label names its files in work), with the
    manifest's overrides, constraints where given (the heavy subset resolved inside the whole)
    and prefer, the versions to start from; uv's output parsed."""
    argv, output = _compile_argv(
        uv, stack, work, label, requirements, overrides, constraints, prefer
    )
    try:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=UV_TIMEOUT_S,
            preexec_fn=die_with_parent,  # a killed lock's uv must not go on writing
        )
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


def _compile_argv(
    uv: Path,
    stack: ResolvedStack,
    work: Path,
    label: str,
    requirements: list[str],
    overrides: list[str],
    constraints: list[str] | None,
    prefer: dict[str, str] | None,
) -> tuple[list[str], Path]:
    """uv's command line for one compile and the file it writes: its inputs written into work
    (uv reads requirements, overrides and constraints from files), and prefer written into the
    output file beforehand, since uv keeps the pins of an existing output file."""
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
    return argv, output


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
