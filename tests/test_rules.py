"""Each compatibility rule fires on the combination it describes and not on the shipped stacks."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from builder.spec.archflags import derive
from builder.spec.check import check_stack
from builder.spec.resolve import resolve, stack_names
from builder.spec.rules import load_rules
from tests.conftest import STACKS

FIXTURES = Path(__file__).parent / "fixtures"


def _fired(stacks_dir: Path, name: str) -> list[str]:
    return [v.rule.id for v in check_stack(resolve(name, stacks_dir)).violations]


def test_shipped_stacks_pass_every_rule() -> None:
    for name in stack_names(STACKS):
        assert check_stack(resolve(name, STACKS)).ok, name


def test_the_seed_mtp_marlin_manifest_is_rejected(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    shutil.copy(FIXTURES / "known-bad" / "vllm-0.22-marlin-mtp.yaml", stacks_dir)
    assert _fired(stacks_dir, "vllm-0.22-marlin-mtp") == [
        "unquantized-draft-head-needs-unquantized-moe-backend"
    ]
    result = run_cli("check", "vllm-0.22-marlin-mtp", stacks_dir=stacks_dir)
    assert result.exit_code == 2
    assert "moe_backend='marlin' is not supported for unquantized MoE" in result.output
    assert "seeds/000_5eeb6bc062d4c411.txt" in result.output
    assert "vllm-0.22-marlin.yaml:" in result.output  # the key lives in the parent


VARIANTS: dict[str, tuple[str, str]] = {
    # rule id: (base stack, YAML added under a child that extends it)
    "unquantized-draft-head-needs-unquantized-moe-backend": (
        "vllm-0.22-b12x",
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
}


def test_every_rule_has_a_variant_here() -> None:
    assert {rule.id for rule in load_rules()} == set(VARIANTS)


@pytest.mark.parametrize("rule_id", sorted(VARIANTS))
def test_rule_fires_on_its_combination(rule_id: str, stacks_dir: Path) -> None:
    base, extra = VARIANTS[rule_id]
    (stacks_dir / "variant.yaml").write_text(f"extends: {base}\n{extra}\n")
    assert rule_id in _fired(stacks_dir, "variant")


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
