"""The command line through click's runner: list, show, check, render, schema."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from builder import REPO_ROOT
from builder.cli.app import Terminated, _raise_terminated, user_errors
from builder.cli.main import cli
from builder.manifest.resolve import stack_names
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


def test_every_command_is_in_the_lazy_table_under_its_own_module() -> None:
    from builder.cli.app import COMMAND_MODULES, cli, import_all_commands

    import_all_commands()
    where = {name: command.callback.__module__ for name, command in cli.commands.items()}
    assert where == COMMAND_MODULES, "add new commands to builder.cli.app.COMMAND_MODULES"


def test_a_command_imports_only_its_own_step() -> None:
    code = (
        "import sys; from builder.cli.main import main; sys.argv = ['x', 'show', 'ci-mini']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('docker', 'pytest', 'requests', 'builder.image.build') "
        "if m in sys.modules), file=sys.stderr)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    )
    assert result.stderr.strip().splitlines()[-1] == "[]"


def test_list_prints_the_table_when_a_lock_is_stale(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    """A stale lock used to escape `list` as an error: no table at all. Its row says so now,
    with what to run below the table, and every other stack is listed."""
    path = stacks_dir / "vllm-0.22-marlin.yaml"
    path.write_text(path.read_text().replace("vllm: 0.22.1", "vllm: 0.22.2"))
    result = run_cli("list", stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    rows = {line.split()[1][:20]: line for line in result.output.splitlines() if line[:1] == "│"}
    assert {name[:20] for name in stack_names(stacks_dir)} <= set(rows)  # long names end in …
    assert "lock stale" in rows["vllm-0.22-marlin"]
    assert " ok " in rows["vllm-0.17-flashinfer-cu"[:20]]
    assert "vllm-0.22-marlin: " in result.output
    assert "run `sm120-stacks lock vllm-0.22-marlin`" in result.output


@pytest.mark.parametrize(
    ("given", "reference"),
    [
        ("sha256:" + "ab" * 32, "sha256:" + "ab" * 32),
        ("127.0.0.1:5000/sm120-stacks@sha256:" + "cd" * 32, "sha256:" + "cd" * 32),
        ("127.0.0.1:5000/sm120-stacks:ci-mini-0123456789abcdef", "ci-mini-0123456789abcdef"),
        ("sm120-stacks:ci-mini", "ci-mini"),
    ],
)
def test_evidence_takes_a_digest_a_pinned_ref_or_a_tag(given: str, reference: str) -> None:
    """A bare sha256: digest used to lose its algorithm (rpartition on ':')."""
    from builder.cli.evidence import image_reference

    assert image_reference(given) == reference


def test_drift_is_the_host_check_and_verify_its_old_name() -> None:
    """builder/verify/ implements `test` and `smoke`; the host check is `drift`, and `verify`
    still runs it for one release, saying it is deprecated (CHANGELOG)."""
    from builder.cli.main import cli

    listed = CliRunner().invoke(cli, ["--help"]).output
    assert "drift" in listed and "(DEPRECATED)" in listed
    old = CliRunner().invoke(cli, ["verify"])
    assert old.exit_code == 2 and "deprecated" in old.output.lower(), old.output
    assert "name a HOST" in old.output
    assert "name a HOST" in CliRunner().invoke(cli, ["drift"]).output
