"""`test` (what `make stack` runs) finds the serve command's model on the host before a smoke
starts a server, and refuses a missing one with the download command: exit 2, no container."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from builder.errors import StackError
from builder.hosts.pins import DEFAULT_MODELS as PIN_MODELS
from builder.manifest.resolve import resolve
from builder.verify import model_folder

HUB_STACK = """extends: ci-mini
env: {HF_HOME: /models/hf}
serve:
  model: {id: example-org/Tiny-Chat-1B}
"""


def _snapshot(models: Path, model_id: str, *, config: bool = True) -> Path:
    repo = "models--" + model_id.replace("/", "--")
    snapshot = models / "hf" / "hub" / repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    if config:
        (snapshot / "config.json").write_text("{}")
    return snapshot


def test_the_test_default_is_the_folder_pins_mount() -> None:
    assert model_folder.DEFAULT_MODELS == PIN_MODELS


def test_a_hub_model_is_found_through_the_models_folder(
    tmp_path: Path, stacks_dir: Path, write_stack: Callable[..., Path]
) -> None:
    write_stack("hub", HUB_STACK)
    stack = resolve("hub", stacks_dir)
    models = tmp_path / "models"
    snapshot = _snapshot(models, "example-org/Tiny-Chat-1B")
    mounts = model_folder.with_models_folder(stack, {}, models)
    assert mounts == {str(models.resolve()): "/models"}
    assert model_folder.require(stack, mounts, models) == snapshot.resolve()
    # A mount that already gives the model wins: the models folder is not added beside it.
    other = tmp_path / "elsewhere"
    _snapshot(other, "example-org/Tiny-Chat-1B")
    given = {str(other): "/models"}
    assert model_folder.with_models_folder(stack, given, models) == given


def test_a_download_cut_short_is_missing(
    tmp_path: Path, stacks_dir: Path, write_stack: Callable[..., Path]
) -> None:
    write_stack("hub", HUB_STACK)
    stack = resolve("hub", stacks_dir)
    models = tmp_path / "models"
    _snapshot(models, "example-org/Tiny-Chat-1B", config=False)
    mounts = model_folder.with_models_folder(stack, {}, models)
    with pytest.raises(StackError, match="hf download example-org/Tiny-Chat-1B"):
        model_folder.require(stack, mounts, models)


@pytest.mark.engine
def test_a_missing_hub_model_stops_test_before_any_container(
    tmp_path: Path,
    stacks_dir: Path,
    write_stack: Callable[..., Path],
    run_cli: Callable[..., Result],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real engine is connected (the smoke's gate asks it); nothing of the validation,
    whose static checks start containers, may run."""
    manifest = write_stack("hub", HUB_STACK)
    started: list[str] = []
    monkeypatch.setattr(
        "builder.cli.verify.validate", lambda *args, **kwargs: started.append("validate")
    )
    models = tmp_path / "no-models-here"
    result = run_cli("test", "hub", "--models", str(models), stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert started == []
    line = next(n for n, text in enumerate(manifest.read_text().splitlines(), 1) if "id:" in text)
    assert f"hub.yaml:{line}: serve.model.id:" in result.output, result.output
    assert "example-org/Tiny-Chat-1B is not on this host" in result.output
    assert f"HF_HOME={models}/hf hf download example-org/Tiny-Chat-1B" in result.output
    assert "MODELS=DIR" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "build" / "hub" / "reports").exists()


@pytest.mark.engine
def test_a_missing_model_folder_names_the_mount(
    tmp_path: Path, stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    """ci-mini reads /models/tiny: with no --volume and an empty models folder it stops before
    the image is even looked for (the image of this scratch stacks folder was never built)."""
    models = tmp_path / "models"
    models.mkdir()
    result = run_cli("test", "ci-mini", "--models", str(models), stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert f"{models}/tiny does not exist" in result.output, result.output
    assert "--volume HOST:/models/tiny:ro" in result.output
    assert "no image of" not in result.output


@pytest.mark.engine
def test_a_skipped_gpu_smoke_needs_no_model(
    tmp_path: Path, stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    """Without a GPU here the flagship's smoke is skipped, so its 45 GB model is not asked for:
    the command goes on to the image (not built in this scratch build folder)."""
    from builder.engine.hostprobe import gather

    if gather(None, None).gpus:
        pytest.skip("this machine has a GPU: the smoke would run")
    result = run_cli(
        "test", "vllm-0.33-marlin", "--models", str(tmp_path / "none"), stacks_dir=stacks_dir
    )
    assert "is not on this host" not in result.output, result.output
    assert "no image of vllm-0.33-marlin" in result.output


def test_make_stack_hands_the_models_folder_to_test() -> None:
    """`make stack STACK=vllm-… MODELS=DIR` tests with DIR as the model folder (dry run)."""
    import subprocess

    from builder import REPO_ROOT

    def test_line(*args: str) -> str:
        printed = subprocess.run(
            ["make", "-n", "stack", *args], cwd=REPO_ROOT, capture_output=True, text=True
        ).stdout
        return next(line for line in printed.splitlines() if " test " in line)

    assert test_line("STACK=vllm-0.33-b12x", "MODELS=/srv/m").endswith(
        "test vllm-0.33-b12x --models /srv/m"
    )
    assert test_line("STACK=vllm-0.33-b12x").endswith(f"--models {PIN_MODELS}")
    assert "--volume" in test_line("STACK=ci-mini") and "--models" not in test_line("STACK=ci-mini")
