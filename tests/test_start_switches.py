"""What vLLM 0.33 reads at start that follows the network: pinned on every stack, refused when a
stack leaves it open, sets it both ways, or names a variable the wheel does not read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.errors import StackError
from builder.knowledge.loader import read_knowledge
from builder.manifest.checkpoint import check_checkpoint_rules
from builder.manifest.resolve import resolve, stack_names
from tests.conftest import STACKS


def test_every_stack_runs_one_route_with_and_without_a_network() -> None:
    """Flip the host's network: the decode kernel each stack's server runs must not move."""
    covered = 0
    for name in stack_names(STACKS):
        switches = resolve(name, STACKS).start_switches
        if switches is None:
            continue
        covered += 1
        assert switches.decode(online=True) == switches.decode(online=False), name
        assert switches.open == (), name
    assert covered >= 5  # every 0.33 stack


def test_b12x_reaches_flashinfer_and_decodes_on_fa2_everywhere() -> None:
    switches = resolve("vllm-0.33-b12x", STACKS).start_switches
    assert switches is not None and switches.gate_reached and switches.gate == "off"
    assert switches.decode(online=True).startswith("FA2")


def test_without_the_gate_the_route_follows_the_network(stacks_dir: Path) -> None:
    (stacks_dir / "v.yaml").write_text(
        "extends: vllm-0.33-b12x\nserve: {extra_args: [--trust-remote-code]}\n"
    )
    switches = resolve("v", stacks_dir).start_switches
    assert switches is not None
    assert switches.decode(online=True) != switches.decode(online=False)
    assert switches.open[0][0] == "trtllm-attention-gate"


def test_the_gate_set_both_ways_is_exit_2_at_its_key(stacks_dir: Path) -> None:
    (stacks_dir / "v.yaml").write_text(
        "extends: vllm-0.33-marlin\nenv:\n  VLLM_HAS_FLASHINFER_CUBIN: '1'\n"
    )
    with pytest.raises(StackError) as caught:
        resolve("v", stacks_dir)
    error = caught.value
    assert "both ways" in str(error) and error.key == "env.VLLM_HAS_FLASHINFER_CUBIN"
    assert error.file is not None and Path(error.file).name == "v.yaml" and error.line == 3


@pytest.mark.parametrize("name", ["VLLM_USE_TRTLLM_ATTENTION", "VLLM_NO_SUCH_SWITCH"])
def test_a_variable_the_wheel_does_not_read_is_exit_2(stacks_dir: Path, name: str) -> None:
    (stacks_dir / "v.yaml").write_text(f"extends: vllm-0.33-marlin\nenv:\n  {name}: '1'\n")
    with pytest.raises(StackError) as caught:
        resolve("v", stacks_dir)
    assert caught.value.key == f"env.{name}" and caught.value.line == 3
    assert "does not read" in str(caught.value)


def test_every_switch_variable_is_one_the_wheel_reads() -> None:
    """The names the image sets are in the wheel (VLLM_* ones through the recorded name list)."""
    names = set(read_knowledge("vllm_env_names.yaml").data["versions"][0]["names"])
    version = read_knowledge("serve_switches.yaml").data["versions"][0]
    for switch in version["switches"]:
        for env in switch["env"]:
            assert not env.startswith("VLLM_") or env in names, env
    assert set(version["gate"]["on_env"]) <= names
    assert not set(version["not_read"]) & names


def _folder(tmp_path: Path, experts: int) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"n_routed_experts": experts}))
    return tmp_path


def test_the_checkpoints_own_expert_count_decides_at_test(stacks_dir: Path, tmp_path: Path) -> None:
    """A b12x stack on a model the table does not know: its config.json's 512 is refused."""
    (stacks_dir / "v.yaml").write_text(
        "extends: vllm-0.33-b12x\nserve: {model: {id: some/other-model, num_experts: null}}\n"
    )
    stack = resolve("v", stacks_dir)
    with pytest.raises(StackError, match="512-experts"):
        check_checkpoint_rules(stack, _folder(tmp_path, 512))
    assert check_checkpoint_rules(stack, _folder(tmp_path, 128)) == (
        "checkpoint config.json n_routed_experts: 128"
    )


HINTS = (
    # vllm 0.33.0 vllm/utils/flashinfer.py:143-155, printed by every image of these stacks.
    "WARNING 12-02 06:00:00 [flashinfer.py:143] FlashInfer's precompiled kernels are missing or "
    "do not match flashinfer-python 0.7.2.post1 (flashinfer-cubin not installed, "
    "flashinfer-jit-cache not installed). FlashInfer then downloads and compiles kernels at "
    "startup, which can take several minutes, or fails to import mismatched ones. Run `vllm "
    "download-kernels` in this Python environment to install them.",
)


def test_the_download_kernels_hint_is_neither_a_compile_nor_an_error() -> None:
    from builder.verify.compiles import find_events

    assert find_events("\n".join(HINTS)) == []
