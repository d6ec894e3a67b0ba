"""The JIT stages depend on exactly what the compiled modules depend on (issue 37).

Rebuilds compile only what changed only if BuildKit sees the same instructions over the same
bytes: these tests take the jit-deps and jit-cache stages out of the rendered Dockerfile, with
every context file they COPY or bind-mount, and compare them across manifest changes. A vLLM
bump or one more package must leave them byte-identical; a FlashInfer, torch or arch change
must not.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder import REPO_ROOT
from builder.knowledge.jit_dependencies import jit_dependency_names
from builder.lock.inputs import inputs_hash, lock_inputs
from builder.lock.lockfile import LockedPackage
from builder.lock.reading import read_lock
from builder.lock.writing import write_lock
from builder.manifest.resolve import resolve
from builder.render.bases import content_reference
from builder.render.context import RenderedContext, pinned_context, render, template_context
from builder.render.jitdeps import jit_package_names
from tests.golden import STACKS

JIT_STAGES = ("jit-deps", "jit-cache")
FAKE_HASH = "sha256:" + "ab" * 32


def _stages(dockerfile: str) -> dict[str, str]:
    """Stage name -> its instructions (comments left out: BuildKit's key does not see them)."""
    stages: dict[str, list[str]] = {}
    current = ""
    for line in dockerfile.splitlines():
        found = re.match(r"FROM \S+ AS (\S+)$", line)
        if found:
            current = found.group(1)
        if current and not line.lstrip().startswith("#"):
            stages.setdefault(current, []).append(line)
    return {name: "\n".join(lines) for name, lines in stages.items()}


def _lineage(stages: dict[str, str], name: str) -> list[str]:
    """The stage and every stage it is built FROM, down to the base image."""
    chain = [name]
    while (parent := stages[chain[-1]].split()[1]) in stages:
        chain.append(parent)
    return chain


def jit_stage_inputs(rendered: RenderedContext) -> dict[str, object]:
    """What BuildKit keys the compiled modules on: the instructions of jit-cache and of every
    stage under it, and the bytes of every context path they COPY or bind (a folder: every
    file under it)."""
    stages = _stages(rendered.dockerfile)
    text = "\n".join(stages[name] for name in _lineage(stages, "jit-cache"))
    sources = set(re.findall(r"source=([^,\s]+)", text))
    for copy in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.M):
        sources.update(copy.split())
    files = {
        path: rendered.files[path][0] if path in rendered.files else rendered.copied[path].sha256
        for path in sorted({*rendered.files, *rendered.copied})
        if any(path == s or path.startswith(s.rstrip("/") + "/") for s in sources)
    }
    assert files, "the JIT stages read no context file at all?"
    return {"instructions": text, "files": files}


@pytest.fixture
def stacks_dir(stacks_dir: Path) -> Path:
    """The scratch stacks folder with the repository's local wheels beside it (ci-mini's torch)."""
    (stacks_dir.parent / "build").mkdir()
    (stacks_dir.parent / "build" / "wheels").symlink_to(REPO_ROOT / "build" / "wheels")
    return stacks_dir


def _child(stacks: Path, name: str, body: str) -> RenderedContext:
    (stacks / f"{name}.yaml").write_text(body)
    return render(resolve(name, stacks))


def test_one_more_package_or_another_pin_leaves_the_jit_stages_byte_identical(
    stacks_dir: Path,
) -> None:
    parent = jit_stage_inputs(render(resolve("ci-mini", stacks_dir)))
    six = _child(stacks_dir, "six", "extends: ci-mini\npython: {packages: {six: 1.17.0}}\n")
    bumped = _child(
        stacks_dir,
        "bumped",
        "extends: ci-mini\n"
        "python: {packages: {transformers: {version: 5.23.0, extras: [serving]}}}\n",
    )
    for child in (six, bumped):
        assert jit_stage_inputs(child) == parent
    # ...while the packages stage did see the change (the test would prove nothing otherwise).
    assert b"six==1.17.0" in six.files["requirements/all.txt"][0]
    assert b"six" not in six.files["requirements/jit.txt"][0]


def _locked_child(stacks: Path, name: str, body: str, changes: dict[str, str]) -> None:
    """stacks/NAME.yaml and a lock for it: the parent's locked set with `changes` (package ->
    version, a made-up hash) applied, as `lock` would write it after such a manifest change."""
    (stacks / f"{name}.yaml").write_text(body)
    stack = resolve(name, stacks)
    parent = read_lock(stacks / "vllm-0.33-marlin.lock")
    packages = dict(parent.python.packages)
    for package, version in changes.items():
        packages[package] = LockedPackage(version=version, hashes=[FAKE_HASH])
    inputs = lock_inputs(stack)
    lock = parent.model_copy(
        update={
            "stack": name,
            "inputs": inputs,
            "inputs_hash": inputs_hash(inputs),
            "python": parent.python.model_copy(update={"packages": packages}),
        }
    )
    write_lock(stacks / f"{name}.lock", lock)


def test_a_vllm_bump_in_the_lock_leaves_the_jit_stages_and_their_cache_byte_identical(
    stacks_dir: Path,
) -> None:
    parent = render(resolve("vllm-0.33-marlin", stacks_dir))
    _locked_child(
        stacks_dir,
        "bump",
        "extends: vllm-0.33-marlin\npython: {packages: {vllm: 0.33.1}}\n",
        {"vllm": "0.33.1", "humanize": "4.12.0"},
    )
    child = render(resolve("bump", stacks_dir))
    assert child.lock is not None and child.lock.python.packages["vllm"].version == "0.33.1"
    assert jit_stage_inputs(child) == jit_stage_inputs(parent)
    assert child.files["requirements/lock.txt"] != parent.files["requirements/lock.txt"]
    ids = [
        template_context(resolve(n, stacks_dir)).jit_cache_id for n in ("bump", "vllm-0.33-marlin")
    ]
    assert ids[0] == ids[1]


def test_flashinfer_torch_or_arch_changes_change_the_jit_stages_and_the_cache(
    stacks_dir: Path,
) -> None:
    """A module whose inputs changed is compiled again, never taken from another's cache."""
    parent = render(resolve("ci-mini", stacks_dir))
    variants = {
        "flashinfer": "python: {packages: {flashinfer-python: 0.6.10}}",
        "torch": "python: {packages: {torch: 2.12.0+cpu}}",
        "arch": "gpus: [sm90]",
        "flags": "build: {nvcc_threads: 2}",
    }
    seen = {template_context(resolve("ci-mini", stacks_dir)).jit_cache_id}
    for name, body in variants.items():
        child = _child(stacks_dir, name, f"extends: ci-mini\n{body}\n")
        assert jit_stage_inputs(child) != jit_stage_inputs(parent), name
        seen.add(template_context(resolve(name, stacks_dir)).jit_cache_id)
    assert len(seen) == 1 + len(variants), "each change must name its own compile cache"


def test_another_module_list_keeps_the_cache_so_shared_modules_compile_once(
    stacks_dir: Path,
) -> None:
    """The mount holds one folder per module: a stack that adds a module to another's list
    finds the modules they share compiled in the same mount."""
    child = _child(stacks_dir, "more", "extends: ci-mini\njit_cache: {modules: [norm, rope]}\n")
    parent = render(resolve("ci-mini", stacks_dir))
    assert _stages(child.dockerfile)["jit-deps"] == _stages(parent.dockerfile)["jit-deps"]
    assert _stages(child.dockerfile)["jit-cache"] != _stages(parent.dockerfile)["jit-cache"]
    ids = {template_context(resolve(n, stacks_dir)).jit_cache_id for n in ("more", "ci-mini")}
    assert len(ids) == 1


def test_the_jit_deps_stage_installs_torch_flashinfer_and_its_imports_only() -> None:
    stack = resolve("vllm-0.33-marlin", STACKS)
    rendered = render(stack)
    assert rendered.lock is not None
    names = set(jit_package_names(stack, rendered.lock))
    assert {"torch", "flashinfer-python", "apache-tvm-ffi", "nvidia-cutlass-dsl"} <= names
    assert set(rendered.lock.python.heavy) <= names
    assert not names & {"vllm", "transformers", "fastapi", "openai", "six"}
    jit = rendered.files["requirements/jit.txt"][0].decode()
    assert "flashinfer-python==0.7.2.post1 \\\n    --hash=sha256:" in jit
    assert "torch==" not in jit, "torch comes from lock-heavy.txt, the packages stage's layer"
    stages = _stages(rendered.dockerfile)
    assert "-r /opt/sm120-stacks/requirements/lock-heavy.txt" in stages["jit-deps"]
    # The image ships jit-deps' very files (the modules were compiled against them, and ninja
    # judges them by their times): packages continues from it, and installs no heavy part again.
    assert _lineage(stages, "runtime") == [
        "runtime",
        "patched",
        "packages",
        "jit-deps",
        "toolchain",
    ]
    assert "lock-heavy.txt" not in stages["packages"]
    assert "pip check" in stages["jit-deps"]
    assert jit_dependency_names() >= {"flashinfer-python", "ninja"}


def test_only_the_patches_to_the_jit_packages_are_applied_in_jit_deps() -> None:
    rendered = render(resolve("vllm-0.17-flashinfer-cutlass", STACKS))
    jit_deps = _stages(rendered.dockerfile)["jit-deps"]
    assert "flashinfer-sm120-moe-arch.patch" in jit_deps
    assert "vllm-sm120-capability.patch" not in jit_deps
    sums = rendered.files["patches/SHA256SUMS.jit"][0].decode()
    assert sums.count("\n") == 1 and sums.endswith("  flashinfer-sm120-moe-arch.patch\n")
    assert "FROM jit-deps AS jit-cache" in rendered.dockerfile
    # ...and not again in patched, which continues from it: patch --forward would refuse it.
    patched = _stages(rendered.dockerfile)["patched"]
    assert "vllm-sm120-capability.patch" in patched
    assert "--input=/opt/sm120-stacks/patches/flashinfer-sm120-moe-arch.patch" not in patched


def test_b12x_and_marlin_share_the_jit_deps_layers_and_the_compile_cache() -> None:
    """Their module lists differ; what one compiled, the other finds in the shared mount."""
    b12x, marlin = (render(resolve(n, STACKS)) for n in ("vllm-0.33-b12x", "vllm-0.33-marlin"))
    files = [jit_stage_inputs(r)["files"] for r in (b12x, marlin)]
    assert isinstance(files[0], dict) and isinstance(files[1], dict)
    for table in files:
        table.pop("tools/jit-modules.json")
    assert files[0] == files[1]
    assert _stages(b12x.dockerfile)["jit-deps"] == _stages(marlin.dockerfile)["jit-deps"]
    names = ("vllm-0.33-b12x", "vllm-0.33-marlin")
    assert len({template_context(resolve(n, STACKS)).jit_cache_id for n in names}) == 1


def _base_step(dockerfile: str) -> str:
    """The packages stage up to and including the install of requirements/lock-base.txt: the
    instructions BuildKit keys that layer on (comments left out)."""
    stage = _stages(dockerfile)["packages"]
    end = stage.index("-r /opt/sm120-stacks/requirements/lock-base.txt")
    return stage[: stage.index("\n", stage.index("compileall", end))]


def test_a_locked_child_installs_its_parents_set_as_the_parents_own_step_then_its_difference(
    stacks_dir: Path,
) -> None:
    """Issue 46: the first packages step of a child is the parent's step over the parent's
    bytes (one BuildKit layer for both), and only the child's own lock follows it, with the
    parent's packages the child lacks uninstalled."""
    parent = render(resolve("vllm-0.33-marlin", stacks_dir))
    parent_lock = read_lock(stacks_dir / "vllm-0.33-marlin.lock")
    dropped = next(iter(sorted(parent_lock.python.packages)))
    _locked_child(
        stacks_dir,
        "bump",
        "extends: vllm-0.33-marlin\npython: {packages: {vllm: 0.33.1}}\n",
        {"vllm": "0.33.1", "humanize": "4.12.0"},
    )
    lock = read_lock(stacks_dir / "bump.lock")
    packages = dict(lock.python.packages)
    del packages[dropped]
    write_lock(
        stacks_dir / "bump.lock",
        lock.model_copy(update={"python": lock.python.model_copy(update={"packages": packages})}),
    )
    child = render(resolve("bump", stacks_dir))
    base = parent.files["requirements/lock-base.txt"]
    assert (
        base == parent.files["requirements/lock.txt"] == child.files["requirements/lock-base.txt"]
    )
    assert _base_step(child.dockerfile) == _base_step(parent.dockerfile)
    # The parent installs its set once; the child installs its own lock over it.
    assert "requirements/lock.txt \\" not in parent.dockerfile
    own = _stages(child.dockerfile)["packages"].split(_base_step(child.dockerfile))[1]
    assert "-r /opt/sm120-stacks/requirements/lock.txt" in own
    assert f"uv pip uninstall --python /opt/venv/bin/python {dropped} \\" in own
    assert b"humanize==4.12.0" in child.files["requirements/lock.txt"][0]
    assert b"humanize" not in base
    # Pinned to this engine's base by id (a local base), only the FROM lines and the compile
    # cache id change: the two package steps stay.
    built_on = child.bases["build"]
    pinned = pinned_context(
        child, resolve("bump", stacks_dir), {built_on: content_reference(built_on, FAKE_HASH)}
    )
    lines = list(zip(child.dockerfile.splitlines(), pinned.dockerfile.splitlines(), strict=True))
    changed = [(a, b) for a, b in lines if a != b]
    assert changed and all(a.startswith("FROM ") or "flashinfer-workspace" in a for a, _ in changed)


def test_a_child_on_another_python_does_not_start_from_its_parents_set(stacks_dir: Path) -> None:
    """A parent's set for another interpreter would not install (nor be shared): the child's
    own lock is its base."""
    _locked_child(stacks_dir, "py311", "extends: vllm-0.33-marlin\n", {"humanize": "4.12.0"})
    lock = read_lock(stacks_dir / "py311.lock")
    write_lock(
        stacks_dir / "py311.lock",
        lock.model_copy(update={"python": lock.python.model_copy(update={"version": "3.11"})}),
    )
    child = render(resolve("py311", stacks_dir))
    assert child.files["requirements/lock-base.txt"] == child.files["requirements/lock.txt"]
    assert "requirements/lock.txt \\" not in child.dockerfile
