"""Each compatibility rule fires on the combination it describes and not on the shipped stacks."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from packaging.specifiers import SpecifierSet

from builder import REPO_ROOT
from builder.knowledge.archflags import derive
from builder.lock.inputs import lock_path
from builder.lock.reading import read_lock
from builder.manifest.check import check_stack
from builder.manifest.resolve import resolve, rule_facts, stack_names
from builder.manifest.rules import Affects, Rule, affected, evaluate, load_rules, retired_by
from tests.conftest import STACKS

FIXTURES = Path(__file__).parent / "fixtures"


def _fired(stacks_dir: Path, name: str) -> list[str]:
    return [v.rule.id for v in check_stack(resolve(name, stacks_dir)).violations]


def test_shipped_stacks_pass_every_rule() -> None:
    """With their committed locks' versions too (an unpinned nvvm is what the lock installs)."""
    for name in stack_names(STACKS):
        stack = resolve(name, STACKS)
        path = lock_path(stack)
        locked = read_lock(path).python.versions() if path.is_file() else None
        assert check_stack(stack, locked).ok, name


def test_the_seed_mtp_marlin_manifest_is_rejected(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    shutil.copy(FIXTURES / "known-bad" / "vllm-0.22-marlin-mtp.yaml", stacks_dir)
    assert _fired(stacks_dir, "vllm-0.22-marlin-mtp") == [
        "draft-inherits-quantization-only-moe-backend-before-0.33"
    ]
    result = run_cli("check", "vllm-0.22-marlin-mtp", stacks_dir=stacks_dir)
    assert result.exit_code == 2
    assert "moe_backend='marlin' is not supported for unquantized MoE" in result.output
    assert "seeds/000_5eeb6bc062d4c411.txt" in result.output
    assert "serve.speculative.moe_backend: triton" in result.output  # the way out


def test_the_seed_mtp_with_the_drafts_own_backend_passes_on_its_own_version(
    stacks_dir: Path,
) -> None:
    """0.22.1 had SpeculativeConfig.moe_backend already: seed 000's wall was avoidable."""
    (stacks_dir / "variant.yaml").write_text(
        "extends: vllm-0.22-marlin\n" "serve: {speculative: {method: mtp, moe_backend: triton}}\n"
    )
    stack = resolve("variant", stacks_dir)
    assert check_stack(stack).ok
    assert stack.draft is not None and stack.draft.moe_backend == "triton"
    assert "fused_moe_120" not in stack.jit_modules


def test_marlin_mtp_on_0_33_falls_to_auto_and_is_refused_on_sm120(stacks_dir: Path) -> None:
    """0.33 no longer raises for marlin: the draft falls to auto, which on SM12x is FlashInfer
    CUTLASS BF16 (fused_moe_120, not precompiled): refused by another rule, same remedy."""
    (stacks_dir / "variant.yaml").write_text(
        "extends: vllm-0.33-marlin\nserve: {speculative: {method: mtp}}\n"
    )
    stack = resolve("variant", stacks_dir)
    assert _fired(stacks_dir, "variant") == ["draft-moe-auto-compiles-fused-moe-120-sm12x"]
    assert stack.draft is not None and stack.draft.moe_backend == "flashinfer_cutlass"
    assert "falls through to auto" in stack.draft.moe_backend_from


def test_a_named_flashinfer_cutlass_draft_derives_fused_moe_120(stacks_dir: Path) -> None:
    (stacks_dir / "variant.yaml").write_text(
        "extends: vllm-0.33-marlin\n"
        "serve: {speculative: {method: mtp, moe_backend: flashinfer_cutlass}}\n"
    )
    stack = resolve("variant", stacks_dir)
    assert "fused_moe_120" in stack.jit_modules
    assert check_stack(stack).ok


def test_the_auto_draft_is_allowed_where_fused_moe_120_is_precompiled(stacks_dir: Path) -> None:
    (stacks_dir / "variant.yaml").write_text(
        "extends: vllm-0.33-marlin\n"
        "serve: {speculative: {method: mtp}}\njit_cache: {modules: [fused_moe_120]}\n"
    )
    assert "draft-moe-auto-compiles-fused-moe-120-sm12x" not in _fired(stacks_dir, "variant")


VARIANTS: dict[str, tuple[str, str]] = {
    # rule id: (base stack, YAML added under a child that extends it)
    "draft-inherits-quantization-only-moe-backend-before-0.33": (
        "vllm-0.22-marlin",
        "serve: {speculative: {method: mtp}}",
    ),
    "draft-inherits-b12x-moe-backend": (
        "vllm-0.33-marlin",
        "serve: {moe_backend: flashinfer_b12x, speculative: {method: mtp}}",
    ),
    "draft-moe-auto-compiles-fused-moe-120-sm12x": (
        "vllm-0.33-marlin",
        "serve: {speculative: {method: mtp}}",
    ),
    "flashinfer-cutlass-trtllm-nvfp4-moe-crash-sm120": (
        "vllm-0.22-marlin",
        "serve: {moe_backend: flashinfer_cutlass}",
    ),
    "flashinfer-trtllm-no-sm120-cubins": (
        "vllm-0.17-flashinfer-cutlass",
        "serve: {moe_backend: flashinfer_trtllm}",
    ),
    "vllm-native-cutlass-nvfp4-moe-garbage-sm120": (
        "vllm-0.17-flashinfer-cutlass",
        "serve: {moe_backend: cutlass}",
    ),
    "flashinfer-cutlass-sm120-needs-capability-patches": (
        "vllm-0.17-flashinfer-cutlass",
        "patches: []",
    ),
    "sm120-fp4-built-for-120a": ("vllm-0.22-marlin", "cuda: '12.8.1'"),
    "host-driver-below-cuda-minimum": ("vllm-0.22-marlin", "host_driver: '575.57.08'"),
    "b12x-needs-cuda13": ("vllm-0.22-b12x", "cuda: '12.9.1'"),
    "b12x-backend-needs-vllm-0.22": ("vllm-0.22-b12x", "python: {packages: {vllm: 0.21.0}}"),
    "precompiled-module-fixed-arch-misses-a-gpu": (
        "vllm-0.17-flashinfer-cutlass",
        "gpus: [sm120, sm121]",
    ),
    # An unset VLLM_USE_FLASHINFER_SAMPLER on vLLM >= 0.21 is the sampler.
    "flashinfer-sampler-freeze-sm12x": (
        "vllm-0.33-marlin",
        "python: {packages: {flashinfer-python: 0.6.13}}",
    ),
    "flashinfer-sampler-opted-in-freeze-sm12x": (
        "vllm-0.17-flashinfer-cutlass",
        "env: {VLLM_USE_FLASHINFER_SAMPLER: '1'}",
    ),
    "flashinfer-cubin-version-differs": (
        "vllm-0.22-marlin",
        "python: {packages: {flashinfer-python: 0.6.14}}",
    ),
    "cuda-python-12.6-overwrites-cuda-bindings": (
        "vllm-0.33-marlin",
        "python: {packages: {cuda-python: 12.6.2.post1, cuda-bindings: 13.5.0}}",
    ),
    "b12x-moe-illegal-memory-access-sm121": (
        "vllm-0.33-spark",
        "serve: {moe_backend: flashinfer_b12x}",
    ),
    "cute-dsl-arch-not-sm121a-on-gb10": ("vllm-0.33-spark", "env: {CUTE_DSL_ARCH: sm_120f}"),
    # 1856 / 8 = 232 columns per GPU: not a multiple of 32.
    "nvfp4-torch-compile-tp-slice-not-multiple-of-32": (
        "vllm-0.33-b12x",
        "serve: {tensor_parallel_size: 8, model: {moe_intermediate_size: 1856}}",
    ),
    "toolkit-wheels-past-cuda": (
        "vllm-0.33-marlin",
        "python: {packages: {nvidia-nvvm: 13.5.37}}",
    ),
    "torch-arch-list-bare-12.1-dropped": (
        "vllm-0.33-spark",
        "build: {toolchain_env: {TORCH_CUDA_ARCH_LIST: '12.1'}}",
    ),
    "cutlass-dsl-before-4.4.2-moe-sm121": (
        "vllm-0.33-spark",
        "python: {packages: {nvidia-cutlass-dsl: {version: 4.4.1, extras: [cu13]}}}",
    ),
    # b12x's route reaches FlashInfer attention (fp8 KV): without the gate-off argument the
    # decode kernel follows the network; with the variable it is XQA, which nobody precompiles.
    "trtllm-gate-follows-network": (
        "vllm-0.33-b12x",
        "serve: {extra_args: [--trust-remote-code]}",
    ),
    "trtllm-gate-on-xqa-not-precompiled": (
        "vllm-0.33-b12x",
        "serve: {extra_args: [--trust-remote-code]}\nenv: {VLLM_HAS_FLASHINFER_CUBIN: '1'}",
    ),
    "serve-path-reaches-network": ("vllm-0.33-marlin", "env: {VLLM_NO_USAGE_STATS: '0'}"),
    # The README's model (512 routed experts, knowledge/models.yaml) with b12x.
    "b12x-nvfp4-moe-512-experts-illegal-memory-access-sm120": (
        "vllm-0.33-marlin",
        "serve: {moe_backend: flashinfer_b12x}",
    ),
}

#: The same combinations at or past the fix (or with the working alternative): the rule is quiet.
PAST_THE_FIX: dict[str, tuple[str, str]] = {
    # The draft's own backend: the remedy each MTP rule proposes.
    "draft-inherits-quantization-only-moe-backend-before-0.33": (
        "vllm-0.22-marlin",
        "serve: {speculative: {method: mtp, moe_backend: triton}}",
    ),
    "draft-inherits-b12x-moe-backend": (
        "vllm-0.33-marlin",
        "serve: {moe_backend: flashinfer_b12x, speculative: {method: mtp, moe_backend: triton}}",
    ),
    "draft-moe-auto-compiles-fused-moe-120-sm12x": (
        "vllm-0.33-marlin",
        "serve: {speculative: {method: mtp, moe_backend: triton}}",
    ),
    "flashinfer-sampler-freeze-sm12x": (
        "vllm-0.33-marlin",
        "python: {packages: {flashinfer-python: 0.6.14}}",
    ),
    "flashinfer-sampler-opted-in-freeze-sm12x": (
        "vllm-0.17-flashinfer-cutlass",
        "env: {VLLM_USE_FLASHINFER_SAMPLER: '1'}\n"
        "python: {overrides: {flashinfer-python: 0.6.14, flashinfer-cubin: 0.6.14}}",
    ),
    "flashinfer-cubin-version-differs": (
        "vllm-0.22-marlin",
        "python: {packages: {flashinfer-python: 0.6.14, flashinfer-cubin: 0.6.14}}",
    ),
    "cuda-python-12.6-overwrites-cuda-bindings": (
        "vllm-0.33-marlin",
        "python: {packages: {cuda-python: 13.4.4, cuda-bindings: 13.4.4}}",
    ),
    "b12x-moe-illegal-memory-access-sm121": ("vllm-0.33-b12x", "gpus: [sm120]"),
    "cute-dsl-arch-not-sm121a-on-gb10": ("vllm-0.33-spark", "env: {CUTE_DSL_ARCH: sm_121a}"),
    # 1856 / 2 = 928 = 29 * 32.
    "nvfp4-torch-compile-tp-slice-not-multiple-of-32": (
        "vllm-0.33-b12x",
        "serve: {tensor_parallel_size: 2, model: {moe_intermediate_size: 1856}}",
    ),
    "toolkit-wheels-past-cuda": (
        "vllm-0.33-marlin",
        "python: {packages: {nvidia-nvvm: 13.0.88}}",
    ),
    "torch-arch-list-bare-12.1-dropped": (
        "vllm-0.33-spark",
        "build: {toolchain_env: {TORCH_CUDA_ARCH_LIST: '12.1a'}}",
    ),
    "cutlass-dsl-before-4.4.2-moe-sm121": (
        "vllm-0.33-spark",
        "python: {packages: {nvidia-cutlass-dsl: {version: 4.4.2, extras: [cu13]}}}",
    ),
}


def test_every_rule_has_a_variant_here() -> None:
    assert {rule.id for rule in load_rules()} == set(VARIANTS)


@pytest.mark.parametrize("rule_id", sorted(VARIANTS))
def test_rule_fires_on_its_combination(rule_id: str, stacks_dir: Path) -> None:
    base, extra = VARIANTS[rule_id]
    (stacks_dir / "variant.yaml").write_text(f"extends: {base}\n{extra}\n")
    assert rule_id in _fired(stacks_dir, "variant")


@pytest.mark.parametrize("rule_id", sorted(PAST_THE_FIX))
def test_rule_is_quiet_past_its_fix(rule_id: str, stacks_dir: Path) -> None:
    base, extra = PAST_THE_FIX[rule_id]
    (stacks_dir / "variant.yaml").write_text(f"extends: {base}\n{extra}\n")
    assert rule_id not in _fired(stacks_dir, "variant")


def test_every_rule_with_a_fix_is_tested_past_it() -> None:
    fixed = {r.id for r in load_rules() if r.affects is not None and r.affects.fixed_in}
    assert fixed <= set(PAST_THE_FIX)


def test_the_sampler_mitigation_keeps_the_022_stacks_working(stacks_dir: Path) -> None:
    """The 0.22 stacks carry VLLM_USE_FLASHINFER_SAMPLER=0; without it, their FlashInfer
    0.6.11.post2 fires the freeze rule, and the violation names the upgrade that retires it."""
    text = (stacks_dir / "vllm-0.22-marlin.yaml").read_text()
    assert 'VLLM_USE_FLASHINFER_SAMPLER: "0"' in text
    (stacks_dir / "vllm-0.22-marlin.yaml").write_text(
        text.replace('VLLM_USE_FLASHINFER_SAMPLER: "0"', 'VLLM_USE_FLASHINFER_SAMPLER: "1"')
    )
    violations = check_stack(resolve("vllm-0.22-b12x", stacks_dir)).violations
    freeze = [v for v in violations if v.rule.id == "flashinfer-sampler-freeze-sm12x"]
    assert freeze and freeze[0].version == "0.6.11.post2"
    assert "fixed in: flashinfer-python 0.6.14 (this stack: 0.6.11.post2)" in freeze[0].describe()


def test_locked_versions_count_for_unpinned_packages() -> None:
    """The first 0.22 lock floated nvvm and crt to 13.5.37 beside nvcc 13.0.88: a stack that
    does not pin them is judged by what its lock installs; a pin wins over the lock."""
    floated = {
        "nvidia-cuda-nvcc": "13.0.88",
        "nvidia-nvvm": "13.5.37",
        "nvidia-cuda-crt": "13.5.37",
    }
    mini = resolve("ci-mini", STACKS)
    assert check_stack(mini).ok
    fired = check_stack(mini, floated).violations
    assert [v.rule.id for v in fired] == ["toolkit-wheels-past-cuda"]
    facts = rule_facts(mini, floated)
    assert facts["toolkit.past_cuda"] == ["nvidia-cuda-crt 13.5.37", "nvidia-nvvm 13.5.37"]
    assert check_stack(resolve("vllm-0.22-marlin", STACKS), floated).ok


def test_a_stale_cubin_in_the_lock_fires(stacks_dir: Path) -> None:
    """vLLM <= 0.25 pins flashinfer-cubin itself: overriding only flashinfer-python leaves the
    lock's cubin behind."""
    stack = resolve("vllm-0.33-marlin", STACKS)
    assert check_stack(stack, {"flashinfer-cubin": "0.7.2.post1"}).ok
    stale = check_stack(stack, {"flashinfer-cubin": "0.6.13"}).violations
    assert [v.rule.id for v in stale] == ["flashinfer-cubin-version-differs"]


def test_affected_and_retired_by() -> None:
    rule = Rule(
        id="r",
        key="k",
        when={},
        error="e",
        evidence=[],
        alternative="a",
        affects=Affects(package="flashinfer-python", introduced="0.6.0", fixed_in="0.6.14"),
    )
    assert [affected(rule, v) for v in ("0.5.9", "0.6.0", "0.6.13.post1", "0.6.14", "0.7")] == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert retired_by(rule, "flashinfer-python", "0.6.14")
    assert retired_by(rule, "FlashInfer_Python", "0.7.2.post1")  # PEP 503 spellings match
    assert not retired_by(rule, "flashinfer-python", "0.6.13")
    assert not retired_by(rule, "flashinfer-cubin", "0.6.14")
    open_ended = rule.model_copy(update={"affects": Affects(package="x", introduced="1.0")})
    assert affected(open_ended, "9.9") and not retired_by(open_ended, "x", "9.9")
    unbounded = rule.model_copy(update={"affects": None})
    assert affected(unbounded, "1.0") and not retired_by(unbounded, "flashinfer-python", "1.0")
    with pytest.raises(ValueError, match="not before"):
        Affects(package="x", introduced="2.0", fixed_in="1.0")


def test_a_rule_with_affects_fires_only_in_its_range() -> None:
    rule = Rule(
        id="r",
        key="k",
        when={"gpus": {"contains": "sm120"}, "image_env.X": {"ne": "0"}},
        error="e",
        evidence=[],
        alternative="a",
        affects=Affects(package="flashinfer-python", fixed_in="0.6.14"),
    )
    facts = {"gpus": ["sm120"], "pins.flashinfer-python": "0.6.11.post2"}
    assert [v.version for v in evaluate(facts, (rule,))] == ["0.6.11.post2"]  # X unset: not "0"
    assert evaluate({**facts, "image_env.X": "0"}, (rule,)) == []
    assert evaluate({**facts, "pins.flashinfer-python": "0.6.14"}, (rule,)) == []
    assert evaluate({"gpus": ["sm120"]}, (rule,)) == []  # no version of the package: not affected


def test_the_docs_list_every_rule() -> None:
    readme = (REPO_ROOT / "docs" / "rules.md").read_text()
    missing = [rule.id for rule in load_rules() if f"`{rule.id}`" not in readme]
    assert not missing


def test_rules_do_not_fire_on_a_driver_that_is_new_enough(stacks_dir: Path) -> None:
    (stacks_dir / "variant.yaml").write_text(
        "extends: vllm-0.22-marlin\nhost_driver: '580.95.05'\n"
    )
    assert _fired(stacks_dir, "variant") == []


def test_arch_flags_derive_per_consumer() -> None:
    both = derive(["sm121", "sm120"], "13.0.2")
    assert both.env["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f 12.1a"
    assert both.env["TORCH_CUDA_ARCH_LIST"] == "12.0a 12.1a"
    assert both.env["CMAKE_CUDA_ARCHITECTURES"] == "120f;121a"
    assert both.jit_arch_tag == "120f_121a"
    assert both.min_driver == "580.65.06"
    old = derive(["sm120"], "12.8.1")
    assert old.env["FLASHINFER_CUDA_ARCH_LIST"] == "12.0a"
    assert derive(["sm90"], "13.0.2").env["FLASHINFER_CUDA_ARCH_LIST"] == "9.0a"


def test_the_driver_minimum_follows_the_stack_cuda(stacks_dir: Path) -> None:
    """CUDA 12.9 needs 575.51.03 (cuda.yaml): 570 is too old for it, 575.57 is enough."""
    for driver, fires in (("570.172.08", True), ("575.57.08", False)):
        (stacks_dir / "variant.yaml").write_text(
            f"extends: vllm-0.22-marlin\ncuda: '12.9.1'\nhost_driver: '{driver}'\n"
        )
        fired = "host-driver-below-cuda-minimum" in _fired(stacks_dir, "variant")
        assert fired is fires, driver


def test_an_unset_moe_backend_is_vllm_auto(stacks_dir: Path) -> None:
    """No --moe-backend lets vLLM 0.17 pick its native CUTLASS MoE: the garbage-output rule."""
    (stacks_dir / "variant.yaml").write_text(
        "extends: vllm-0.17-flashinfer-cutlass\nserve: {moe_backend: null}\n"
    )
    assert "vllm-native-cutlass-nvfp4-moe-garbage-sm120" in _fired(stacks_dir, "variant")


def test_fixed_arch_gaps_name_the_module_and_the_gpu(stacks_dir: Path) -> None:
    (stacks_dir / "variant.yaml").write_text(
        "extends: vllm-0.17-flashinfer-cutlass\ngpus: [sm120, sm121]\n"
    )
    assert resolve("variant", stacks_dir).fixed_arch_gaps() == ["fp4_quantization_120: sm121"]
    # The 0.22 stacks' quantizer follows the arch list (fp4_quantization_120f): no gap.
    (stacks_dir / "variant.yaml").write_text("extends: vllm-0.22-b12x\ngpus: [sm120, sm121]\n")
    assert resolve("variant", stacks_dir).fixed_arch_gaps() == []


def test_a_remedy_pins_what_clears_its_rule() -> None:
    """cuda-python-12.6-overwrites-cuda-bindings: the lock's 12.6.2.post1 fires; the remedy's
    newest release >=12.8 (13.4.4, what the 0.33 stacks pin by hand) does not."""
    rule = next(r for r in load_rules() if r.id == "cuda-python-12.6-overwrites-cuda-bindings")
    assert rule.remedy is not None and rule.remedy.pin == "cuda-python"
    locked = {"pins.cuda-python": "12.6.2.post1", "pins.cuda-bindings": "13.5.0"}
    assert [v.rule.id for v in evaluate(locked, (rule,))] == [rule.id]
    for version in ("12.8.0", "13.4.4"):
        assert version in SpecifierSet(rule.remedy.newest)
        assert evaluate({**locked, "pins.cuda-python": version}, (rule,)) == []
    pinned = resolve("vllm-0.33-marlin", STACKS).manifest.python.packages["cuda-python"]
    assert pinned.version in SpecifierSet(rule.remedy.newest)
