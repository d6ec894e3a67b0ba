"""The command line through click's runner: list, show, check, render, schema."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from builder.cli.app import Terminated, _raise_terminated, user_errors
from builder.cli.main import cli
from builder.spec.resolve import stack_names
from tests.conftest import STACKS


def test_list_shows_every_stack_with_status(run_cli: Callable[..., Result]) -> None:
    result = run_cli("list")
    assert result.exit_code == 0
    for name in stack_names(STACKS):
        assert name in result.output
    assert "working" in result.output


def test_show_prints_the_resolved_manifest_with_derived_flags(
    run_cli: Callable[..., Result],
) -> None:
    result = run_cli("show", "vllm-0.22-b12x")
    data = json.loads(result.output)
    assert data["serve"]["moe_backend"] == "flashinfer_b12x"  # the child's value
    assert data["python"]["packages"]["vllm"]["version"] == "0.22.1"  # inherited
    assert data["derived"]["arch_env"]["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f"
    assert "extends" not in data


def test_check_all(run_cli: Callable[..., Result]) -> None:
    result = run_cli("check")
    assert result.exit_code == 0
    assert result.output.count("ok ") == len(stack_names(STACKS))


def test_render_writes_the_context_and_prints_its_path(
    run_cli: Callable[..., Result], tmp_path: Path
) -> None:
    result = run_cli("render", "vllm-0.17-flashinfer-cutlass")
    assert result.exit_code == 0
    context = Path(result.output.strip())
    assert context == tmp_path / "build" / "vllm-0.17-flashinfer-cutlass" / "context"
    assert (context / "Dockerfile").is_file()
    assert (context / "patches" / "SHA256SUMS").is_file()
    assert (
        (context / "requirements" / "overrides.txt")
        .read_text()
        .endswith("flashinfer-python==0.6.5\nflashinfer-cubin==0.6.5\n")
    )


def test_render_stdout_prints_the_dockerfile_only(
    run_cli: Callable[..., Result], tmp_path: Path
) -> None:
    result = run_cli("render", "vllm-0.22-marlin", "--stdout")
    assert result.output.startswith("# Rendered by sm120-stacks")
    assert not (tmp_path / "build").exists()


def test_schema_is_json_schema_with_the_manifest_keys(run_cli: Callable[..., Result]) -> None:
    schema = json.loads(run_cli("schema").output)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert {"gpus", "cuda", "serve", "python", "jit_cache"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def test_sigterm_and_ctrl_c_stop_a_command_with_their_exit_status() -> None:
    @user_errors
    def long_build() -> None:
        _raise_terminated(signal.SIGTERM, None)

    with pytest.raises(SystemExit) as stopped:
        long_build()
    assert stopped.value.code == 128 + signal.SIGTERM

    @user_errors
    def ctrl_c() -> None:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stopped:
        ctrl_c()
    assert stopped.value.code == 128 + signal.SIGINT
    assert issubclass(Terminated, KeyboardInterrupt)  # so a running build is stopped, untagged
    previous = signal.getsignal(signal.SIGTERM)
    try:
        CliRunner().invoke(cli, ["--stacks-dir", str(STACKS), "list"])
        assert signal.getsignal(signal.SIGTERM) is _raise_terminated
    finally:
        signal.signal(signal.SIGTERM, previous)
