"""Rendering: golden files, determinism across processes, layer order, atomic writes, hadolint."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder import REPO_ROOT
from builder.manifest.resolve import resolve, stack_names
from builder.render.context import render, template_context, write_context
from tests.golden import GOLDEN_DIR, STACKS, rendered_dockerfile

ALL_STACKS = stack_names(STACKS)


@pytest.mark.parametrize("name", ALL_STACKS)
def test_golden_dockerfile(name: str) -> None:
    golden = GOLDEN_DIR / f"{name}.Dockerfile"
    assert golden.exists(), "run `make golden` and review the new file"
    assert (
        rendered_dockerfile(name) == golden.read_text()
    ), f"{name} renders differently from {golden}; if intended, `make golden` and review the diff"


def _hash_in_subprocess(env: dict[str, str]) -> str:
    code = (
        "from builder.render.context import render;"
        "from builder.manifest.resolve import resolve, stack_names;"
        "from tests.golden import STACKS;"
        "print(*[n + ' ' + render(resolve(n, STACKS)).content_hash() for n in stack_names(STACKS)])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def test_render_is_deterministic_across_processes_env_locale_and_clock() -> None:
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT)}
    first = _hash_in_subprocess({**base, "LANG": "C", "TZ": "UTC", "PYTHONHASHSEED": "1"})
    second = _hash_in_subprocess(
        {
            **base,
            "LANG": "de_DE.UTF-8",
            "LC_ALL": "tr_TR.UTF-8",
            "TZ": "Pacific/Chatham",
            "PYTHONHASHSEED": "4242",
            "HOME": "/nonexistent",
            "SOURCE_DATE_EPOCH": "1",
            "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
            "MAX_JOBS": "64",
        }
    )
    assert first == second
    assert len(first.split()) == 2 * len(ALL_STACKS)


def test_runtime_settings_come_after_every_package_layer() -> None:
    dockerfile = rendered_dockerfile("vllm-0.22-marlin")
    last_heavy = max(dockerfile.rfind("pip install"), dockerfile.rfind("COPY --from=jit-cache"))
    for marker in ("CMD [", 'TRITON_PTXAS_PATH="'):
        assert dockerfile.rfind(marker) > last_heavy


def test_serve_argument_change_touches_only_the_last_lines(stacks_dir: Path) -> None:
    before = render(resolve("vllm-0.22-marlin", stacks_dir)).dockerfile.splitlines()
    path = stacks_dir / "vllm-0.22-marlin.yaml"
    path.write_text(path.read_text().replace("max_model_len: 32768", "max_model_len: 8192"))
    after = render(resolve("vllm-0.22-marlin", stacks_dir)).dockerfile.splitlines()
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert changed == [len(before) - 1], "only the CMD line may change"


def test_status_description_and_notes_keep_the_content_hash(stacks_dir: Path) -> None:
    """Marking a stack tested must not forget that it was tested: records key on this hash."""
    (stacks_dir / "child.yaml").write_text("extends: vllm-0.22-marlin\n")
    before = render(resolve("child", stacks_dir)).content_hash()
    (stacks_dir / "child.yaml").write_text(
        "extends: vllm-0.22-marlin\nstatus: known-bad\ndescription: Edited.\n"
        "notes: [{text: Prints garbage on some prompts., evidence: ['https://example.org/r/1']}]\n"
    )
    edited = resolve("child", stacks_dir)
    assert edited.manifest.status == "known-bad" and edited.to_json()["status"] == "known-bad"
    assert render(edited).content_hash() == before
    (stacks_dir / "child.yaml").write_text("extends: vllm-0.22-marlin\nenv: {EXTRA: '1'}\n")
    assert render(resolve("child", stacks_dir)).content_hash() != before


def test_stacks_with_the_same_locked_set_share_their_package_layers() -> None:
    """b12x and marlin lock the same packages: every file their package layers COPY must be
    the same bytes (the lock's stack name in a header once made marlin reinstall 9 GB)."""
    b12x, marlin = (
        render(resolve(name, STACKS)) for name in ("vllm-0.22-b12x", "vllm-0.22-marlin")
    )
    requirements = sorted(p for p in b12x.files if p.startswith("requirements/"))
    assert "requirements/lock.txt" in requirements
    assert requirements == sorted(p for p in marlin.files if p.startswith("requirements/"))
    assert all(b12x.files[p] == marlin.files[p] for p in requirements)


def test_arch_flags_reach_each_consumer_in_its_own_spelling() -> None:
    dockerfile = rendered_dockerfile("vllm-0.22-marlin")
    assert 'FLASHINFER_CUDA_ARCH_LIST="12.0f"' in dockerfile
    assert 'TORCH_CUDA_ARCH_LIST="12.0a"' in dockerfile
    assert "12.0f" not in re.findall(r'TORCH_CUDA_ARCH_LIST="([^"]*)"', dockerfile)[0]


def test_write_context_is_complete_and_replaces_atomically(tmp_path: Path) -> None:
    rendered = render(resolve("vllm-0.17-flashinfer-cutlass", STACKS))
    target = write_context(rendered, tmp_path / "ctx")
    for relative, (content, mode) in rendered.files.items():
        assert (target / relative).read_bytes() == content
        assert (target / relative).stat().st_mode & 0o777 == mode
    (target / "stale-file").write_text("x")
    write_context(rendered, target)
    assert not (target / "stale-file").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx"]


def test_rendered_dockerfiles_pass_hadolint(tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    for name in ALL_STACKS:
        path = tmp_path / f"{name}.Dockerfile"
        path.write_text(rendered_dockerfile(name))
        result = subprocess.run(
            [hadolint, "--no-color", "--failure-threshold", "info", str(path)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, f"{name}:\n{result.stdout}{result.stderr}"


def test_stacks_differing_only_at_runtime_render_identical_build_instructions(
    stacks_dir: Path,
) -> None:
    """Layer sharing across stacks needs byte-identical instructions before the runtime ENV."""
    (stacks_dir / "child.yaml").write_text(
        "extends: vllm-0.22-marlin\nenv: {EXTRA: '1'}\nserve: {port: 8011}\n"
    )
    # Its lock is the parent's (env and serve settings are no lock input): the same bases.
    parent_lock = (stacks_dir / "vllm-0.22-marlin.lock").read_text()
    (stacks_dir / "child.lock").write_text(
        parent_lock.replace("stack: vllm-0.22-marlin", "stack: child", 1)
    )

    def instructions(name: str) -> list[str]:
        lines = render(resolve(name, stacks_dir)).dockerfile.splitlines()
        cut = next(i for i, line in enumerate(lines) if line.startswith("ENV VIRTUAL_ENV"))
        return [line for line in lines[:cut] if not line.startswith("#")]

    assert instructions("child") == instructions("vllm-0.22-marlin")


def test_runtime_continues_from_the_build_only_when_the_bases_are_the_same(
    stacks_dir: Path,
) -> None:
    """Same base: no second copy of the venv (torch stays a layer of its own). Another runtime
    base: the venv, the tools and the JIT cache are copied over, and its apt packages installed."""
    (stacks_dir / "slim.yaml").write_text(
        "extends: vllm-0.22-marlin\n"
        "bases: {runtime: {image: 'nvidia/cuda:13.0.2-runtime-ubuntu24.04'}}\n"
    )
    same = render(resolve("vllm-0.22-marlin", stacks_dir)).dockerfile
    other = render(resolve("slim", stacks_dir)).dockerfile
    assert "FROM patched AS runtime" in same
    assert "COPY --from=patched /opt/venv" not in same
    # The modules ship once in FlashInfer's cache and once as AOT .so; the staging copy stays
    # in the jit-cache stage, which the runtime does not continue from.
    aot = "/opt/venv/lib/python3.12/site-packages/flashinfer/data/aot"
    assert f"COPY --from=jit-cache {aot} {aot}" in same
    assert "COPY --from=jit-cache /opt/sm120-stacks-jit/cached_ops/ " in same
    assert same.count("apt-get install") == 1, "the build stage already installed them"
    assert "FROM nvidia/cuda:13.0.2-runtime-ubuntu24.04 AS runtime" in other
    assert "COPY --from=patched /opt/venv /opt/venv" in other
    assert f"COPY --from=jit-cache {aot} {aot}" in other
    assert other.count("apt-get install") == 2
    for dockerfile in (same, other):
        assert "COPY --from=jit-cache /opt/sm120-stacks-jit/cached_ops/" in dockerfile


def test_the_compile_cache_mount_covers_generated_sources_as_well_as_objects() -> None:
    """FlashInfer writes CUTLASS instantiations to <workspace>/generated and objects to
    <workspace>/cached_ops; with only cached_ops in the mount, each resumed build rewrote the
    sources and ninja recompiled every object built from them."""
    dockerfile = rendered_dockerfile("vllm-0.17-flashinfer-cutlass")
    target = re.search(
        r"--mount=type=cache,id=sm120-stacks-flashinfer[^,]*,target=([^,]+),", dockerfile
    )
    assert target, "the compile step has no cache mount"
    workspace = "/opt/flashinfer-cache/.cache/flashinfer/0.6.5/120f"
    assert target.group(1) == workspace
    assert f"cp -a {workspace}/cached_ops/fused_moe_120 " in dockerfile


def test_the_compile_cache_is_shared_only_by_stacks_that_install_the_same(
    stacks_dir: Path,
) -> None:
    """ninja trusts file times: a mount shared with a stack of another torch or CUDA could hand
    over objects built against the wrong headers. A serve-only difference shares it."""
    (stacks_dir / "port.yaml").write_text("extends: vllm-0.22-b12x\nserve: {port: 9000}\n")
    (stacks_dir / "torch.yaml").write_text(
        "extends: vllm-0.22-b12x\npython: {packages: {torch: 2.11.1}}\n"
    )
    (stacks_dir / "cuda.yaml").write_text("extends: vllm-0.22-b12x\ncuda: '13.0.1'\n")
    ids = {
        name: template_context(resolve(name, stacks_dir)).jit_cache_id
        for name in ("vllm-0.22-b12x", "vllm-0.22-marlin", "port", "torch", "cuda")
    }
    assert ids["vllm-0.22-b12x"] == ids["vllm-0.22-marlin"] == ids["port"]
    assert len({ids["vllm-0.22-b12x"], ids["torch"], ids["cuda"]}) == 3
    assert ids["port"].startswith("sm120-stacks-flashinfer-workspace-0.6.11.post2-120f-py3.12-")


def _stack_with_template(tmp_path: Path, template: str) -> Path:
    stacks = tmp_path / "stacks"
    shutil.copytree(STACKS, stacks)
    (stacks / "override.yaml").write_text(
        f"extends: vllm-0.22-marlin\nbuild:\n  template: {template}\n"
    )
    return stacks


def test_a_stack_can_override_a_block_of_the_dockerfile(tmp_path: Path) -> None:
    stacks = _stack_with_template(tmp_path, "overrides/runtime-label.j2")
    (stacks / "plain.yaml").write_text("extends: vllm-0.22-marlin\n")
    base = render(resolve("plain", stacks)).dockerfile
    overridden = render(resolve("override", stacks)).dockerfile
    label = 'LABEL org.sm120-stacks.override="runtime-label"'
    assert label not in base
    assert overridden.rstrip().endswith(label)
    # Everything else is the common template's, byte for byte (the header names the stack).
    assert overridden.replace(label, "").replace("override.yaml", "plain.yaml").rstrip() == (
        base.rstrip()
    )


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("overrides/missing.j2", "does not exist under templates/"),
        ("overrides/README.j2", "does not extend Dockerfile.j2"),
        ("../Dockerfile.j2", "template"),
    ],
)
def test_a_bad_template_override_is_refused_at_check(
    tmp_path: Path, template: str, message: str
) -> None:
    from builder.errors import StackError

    stacks = _stack_with_template(tmp_path, template)
    if template == "overrides/README.j2":
        (REPO_ROOT / "templates" / template).write_text("no extends here\n")
    try:
        with pytest.raises(StackError, match=message):
            resolve("override", stacks)
    finally:
        (REPO_ROOT / "templates" / "overrides" / "README.j2").unlink(missing_ok=True)
