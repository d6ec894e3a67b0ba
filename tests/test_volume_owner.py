"""A pin's cache volume is its own (issue 47, bad input): a pin edited or copied to mount a
volume that is not its own is refused by `deploy`, exit 2, naming the pin file, key and line,
before any file is rendered or any container started. No engine: the refusal comes first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from click.testing import Result

from builder.hosts.pins import cache_volume_name, write_pin
from tests.test_hosts import STACK, _pin

FIRST, SECOND = "gpu-node-07", "gpu-node-08"


def _two_pins(stacks_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    hosts = tmp_path / "hosts"
    paths = [write_pin(hosts, _pin(stacks_dir, tmp_path, host=h)) for h in (FIRST, SECOND)]
    return paths[0], paths[1]


def _line_of(path: Path, text: str) -> int:
    body = path.read_text()
    return body[: body.index(text)].count("\n") + 1


def test_a_pin_edited_to_another_pins_volume_is_refused_before_anything_is_written(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    _, second = _two_pins(stacks_dir, tmp_path)
    theirs, ours = cache_volume_name(STACK, FIRST), cache_volume_name(STACK, SECOND)
    second.write_text(second.read_text().replace(ours, theirs))
    line = _line_of(second, theirs)
    for args in ((SECOND,), (SECOND, "--apply"), ("--all",)):
        result = run_cli("deploy", *args, stacks_dir=stacks_dir)
        assert result.exit_code == 2, result.output
        said = " ".join(result.output.split())
        assert f"{second}:{line}: volumes.1.source: the pin mounts volume {theirs} at " in said
        assert f"the cache volume of host {FIRST}'s pin, not its own" in said
        assert "nothing was rendered or started" in said
        assert f"set volumes[1].source to {ours}" in said
        assert f"`sm120-stacks pin {SECOND} {STACK}`" in said
        assert "Traceback" not in result.output
        assert not (tmp_path / "build" / "hosts").exists(), "nothing rendered"
    first = run_cli("deploy", FIRST, stacks_dir=stacks_dir)
    assert first.exit_code == 0, "the volume's own pin is not the one at fault"


def test_a_pin_file_copied_from_another_host_is_refused(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    """Copied and its host edited: the volume's name says whose it is, even with that host's
    own pin gone from the folder."""
    first, _ = _two_pins(stacks_dir, tmp_path)
    copy = tmp_path / "hosts" / "gpu-node-09.yaml"
    copy.write_text(first.read_text().replace(f"host: {FIRST}", "host: gpu-node-09"))
    first.unlink()
    result = run_cli("deploy", "gpu-node-09", stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"the pin mounts volume {cache_volume_name(STACK, FIRST)} at" in said
    assert "another pin's, not its own" in said


def test_a_volume_of_the_users_own_naming_is_the_pins(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    """`pin --volume my-cache:/var/cache/sm120-stacks` (the field report's hosts5-cache) is
    deployed as it was pinned."""
    hosts = tmp_path / "hosts"
    volume = ("/srv/m:/models:ro", "my-cache:/var/cache/sm120-stacks")
    write_pin(hosts, _pin(stacks_dir, tmp_path, host=FIRST, volumes=volume))
    assert run_cli("deploy", FIRST, stacks_dir=stacks_dir).exit_code == 0
