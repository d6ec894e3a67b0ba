"""The draft's settings (serve.speculative): checked per vLLM version against
knowledge/speculative_config.yaml, rendered into the exact --speculative-config JSON, and read back
from a serve argv (rendered or hand-written) the way vLLM's parser reads it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from builder.manifest.resolve import resolve
from builder.manifest.serve import serve_argv
from builder.manifest.speculative import speculative_of_argv
from builder.vllmcli.vllm_argv import ExtraArgError, speculative_config
from tests.conftest import STACKS


def _check(stacks_dir: Path, run_cli: Callable[..., Result], base: str, speculative: str) -> Result:
    (stacks_dir / "variant.yaml").write_text(
        f"extends: {base}\nserve:\n  speculative:\n{speculative}"
    )
    return run_cli("check", "variant", stacks_dir=stacks_dir)


def test_the_mtp_stack_renders_the_exact_speculative_config() -> None:
    stack = resolve("vllm-0.33-marlin-mtp", STACKS)
    argv = serve_argv(stack)
    at = argv.index("--speculative-config")
    assert argv[argv.index("--moe-backend") + 1] == "marlin"
    assert argv[at + 1] == '{"method":"mtp","moe_backend":"triton","num_speculative_tokens":3}'
    assert speculative_of_argv(argv) == stack.manifest.serve.speculative


def test_unset_draft_settings_stay_out_of_the_json() -> None:
    """A stack that only names the method renders what it did before the draft keys existed."""
    stack = resolve("vllm-0.33-marlin-mtp", STACKS)
    spec = stack.manifest.serve.speculative
    assert spec is not None
    plain = spec.model_copy(update={"moe_backend": None})
    assert plain.model_dump() == {"method": "mtp", "num_speculative_tokens": 3}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--speculative-config", '{"method": "mtp", "moe_backend": "triton"}'],
            {"method": "mtp", "moe_backend": "triton"},
        ),
        (
            ['--speculative_config={"method":"mtp","num-speculative-tokens":2}'],
            {"method": "mtp", "num_speculative_tokens": 2},
        ),
        (["-sc", '{"method": "eagle"}', "-sc", '{"method": "mtp"}'], {"method": "mtp"}),
        # dotted keys are merged into one object passed after the others: it replaces the JSON
        (
            [
                "--speculative-config.method",
                "mtp",
                "--speculative-config",
                '{"method": "ngram"}',
                "--speculative-config.moe_backend",
                "triton",
            ],
            {"method": "mtp", "moe_backend": "triton"},
        ),
        (
            ["--specul", '{"method": "mtp"}', "--spec-tokens", "2"],
            {"method": "mtp", "num_speculative_tokens": 2},
        ),
        (["--spec-method", "mtp"], {"method": "mtp"}),
        (["--max-model-len", "256"], None),
    ],
)
def test_a_hand_written_argv_is_read_as_vllm_reads_it(
    argv: list[str], expected: dict[str, object] | None
) -> None:
    found = speculative_config(argv)
    assert (found.config if found else None) == expected


def test_argv_readers_refuse_what_vllm_refuses() -> None:
    with pytest.raises(ExtraArgError, match="not a JSON object"):
        speculative_config(["--speculative-config", "[1]"])
    with pytest.raises(ExtraArgError, match="mutually exclusive"):
        speculative_config(["-sc", '{"method": "mtp"}', "--spec-method", "eagle"])
    with pytest.raises(ExtraArgError, match="takes a value"):
        speculative_config(["--speculative-config"])


def test_a_key_the_version_lacks_is_refused_at_its_line(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    """0.22.1's SpeculativeConfig has no kv_cache_dtype (0.33.0 has, :448-451)."""
    result = _check(
        stacks_dir,
        run_cli,
        "vllm-0.22-marlin",
        "    method: mtp\n    moe_backend: triton\n    kv_cache_dtype: fp8\n",
    )
    assert result.exit_code == 2, result.output
    assert "variant.yaml:6" in result.output
    assert "serve.speculative.kv_cache_dtype" in result.output
    assert "vLLM 0.22.1's SpeculativeConfig has no kv_cache_dtype" in result.output
    assert "draft_tensor_parallel_size, moe_backend, attention_backend" in result.output
    assert "Traceback" not in result.output


def test_a_moe_backend_vllm_lacks_is_refused_with_the_accepted_values(
    stacks_dir: Path, run_cli: Callable[..., Result], tmp_path: Path
) -> None:
    result = _check(
        stacks_dir, run_cli, "vllm-0.33-marlin", "    method: mtp\n    moe_backend: trtion\n"
    )
    assert result.exit_code == 2, result.output
    assert "variant.yaml:5" in result.output
    assert "knows no such MoE backend" in result.output
    assert "batched_triton" in result.output and "flashinfer_cutlass" in result.output
    render = run_cli("render", "variant", stacks_dir=stacks_dir)
    assert render.exit_code == 2
    assert not (tmp_path / "build" / "variant").exists()  # nothing rendered


def test_speculative_without_a_method_is_refused(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    result = _check(stacks_dir, run_cli, "vllm-0.33-marlin", "    moe_backend: triton\n")
    assert result.exit_code == 2, result.output
    assert "serve.speculative: Value error, speculative decoding needs a method" in result.output
    assert "variant.yaml" in result.output
    assert "one of mtp, eagle, eagle3, ngram, draft_model" in result.output


def test_a_version_not_read_takes_only_method_and_tokens(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    result = _check(
        stacks_dir,
        run_cli,
        "vllm-0.17-flashinfer-cutlass",
        "    method: mtp\n    moe_backend: triton\n",
    )
    assert result.exit_code == 2, result.output
    assert "no entry of knowledge/speculative_config.yaml covers vllm 0.17" in result.output


def test_show_derives_the_drafts_backend(run_cli: Callable[..., Result]) -> None:
    result = run_cli("show", "vllm-0.33-marlin-mtp")
    assert result.exit_code == 0, result.output
    draft = json.loads(result.output)["derived"]["draft"]
    assert draft["moe_backend"] == "triton"
    assert draft["runtime_compiles"] == ["triton"]
    assert draft["flashinfer_modules"] == []


def test_a_serve_only_child_builds_on_its_parents_lock(stacks_dir: Path) -> None:
    """The README's my-mtp.yaml changes only serve settings: its bases and packages are its
    parent's, so the parent's lock (bases by digest) is its lock; a child that changes a
    package is not given it."""
    from builder.lock.locked import lock_stack
    from builder.lock.reading import locked_versions

    (stacks_dir / "my-mtp.yaml").write_text(
        "extends: vllm-0.33-marlin\nserve: {speculative: {method: mtp, moe_backend: triton}}\n"
    )
    locked = lock_stack(resolve("my-mtp", stacks_dir))
    assert locked.lock is not None and locked.stale is None
    assert "@sha256:" in locked.build_base and not locked.floating
    assert locked_versions(resolve("my-mtp", stacks_dir)) == locked.lock.python.versions()
    (stacks_dir / "moved.yaml").write_text(
        "extends: vllm-0.33-marlin\npython: {packages: {flashinfer-python: 0.7.4}}\n"
    )
    assert lock_stack(resolve("moved", stacks_dir)).lock is None


def test_propose_writes_a_set_remedy_into_the_serve_block() -> None:
    """A `set` remedy (rules.yaml) lands in the proposal as a nested serve setting."""
    from builder.manifest.rules import load_rules
    from builder.upstream.settings import settings_lines, settings_set

    rule = next(r for r in load_rules() if r.id == "draft-moe-auto-compiles-fused-moe-120-sm12x")
    assert rule.remedy is not None
    applied = settings_set(rule, rule.remedy)  # type: ignore[arg-type]
    assert applied.serve == {"speculative.moe_backend": "triton"}
    base = resolve("vllm-0.33-marlin", STACKS)
    lines = settings_lines(base, [applied])
    assert lines[0] == "serve:"
    assert '  speculative: {"moe_backend": "triton"}' in lines


@pytest.mark.parametrize("value", ["[1]", "mtp", "3"])
def test_a_speculative_config_that_is_not_a_json_object_is_refused_naming_the_option(
    value: str,
) -> None:
    """vLLM refuses a --speculative-config that is not a JSON object at start; the reader says
    so with the option's own name and an example of the object it takes."""
    from builder.vllmcli.vllm_argv import ExtraArgError, speculative_config

    with pytest.raises(ExtraArgError) as refused:
        speculative_config(["--speculative-config", value])
    assert "--speculative-config refuses it" in str(refused.value)
    assert refused.value.index == 0 and '"method": "mtp"' in refused.value.hint
