"""`drift` reads the host's rendered compose.yaml and systemd unit (issue 47, bad input): a file
edited by hand to a tag instead of the pinned digest, or to a volume that is not the pin's, is a
drift naming the file, line and key and what to do; the files as deploy wrote them are not.

No engine: the files are read, nothing is run (the CLI test points at a socket nobody serves).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from builder.hosts.deploy import unit_name, write_files
from builder.hosts.pins import CACHE_TARGET, Pin, cache_volume_name, write_pin
from builder.hosts.rendered import file_drifts, rendered_files
from tests.test_hosts import DIGEST, REPO, STACK, _pin

PINNED = f"{REPO}@{DIGEST}"
TAG = f"{REPO}:latest"
OTHER = f"{REPO}@sha256:" + "cd" * 32
AGAIN = "; render it again with `sm120-stacks deploy gpu-node-07` (edit the pin, not this file)"


def _rendered(stacks_dir: Path, tmp_path: Path) -> tuple[Pin, Path, Path]:
    pin = _pin(stacks_dir, tmp_path)
    out = tmp_path / "build" / "hosts" / pin.host
    write_files(pin, out)
    return pin, out / "compose.yaml", out / unit_name(pin)


def _edit(path: Path, old: str, new: str) -> int:
    """Replace old (which must be there) and return the 1-based line of its first place."""
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))
    return text[: text.index(old)].count("\n") + 1


def test_files_as_deploy_wrote_them_have_no_drift(stacks_dir: Path, tmp_path: Path) -> None:
    pin, compose, unit = _rendered(stacks_dir, tmp_path)
    found = rendered_files(pin, compose.parent, None, unit_dir=tmp_path / "systemd")
    assert found == [compose, unit]
    assert file_drifts(pin, found) == []


def test_a_compose_image_edited_to_a_tag_is_a_drift(stacks_dir: Path, tmp_path: Path) -> None:
    pin, compose, _ = _rendered(stacks_dir, tmp_path)
    line = _edit(compose, f'image: "{PINNED}"', f'image: "{TAG}"')
    [drift] = file_drifts(pin, [compose])
    assert drift.name == "file"
    assert drift.detail == (
        f"{compose}:{line}: services.llm.image is {TAG} (a tag, not a digest), pinned "
        f"{PINNED}: the next start runs whatever that names{AGAIN}"
    )


def test_a_unit_edited_to_a_tag_or_another_digest_is_a_drift(
    stacks_dir: Path, tmp_path: Path
) -> None:
    """ExecStart's `docker run` image and the pre-start pull, each with its line."""
    pin, _, unit = _rendered(stacks_dir, tmp_path)
    text = unit.read_text()
    pull_line = next(i for i, t in enumerate(text.splitlines(), 1) if "docker pull" in t)
    run_line = next(i for i, t in enumerate(text.splitlines(), 1) if t.strip() == f'"{PINNED}" \\')
    unit.write_text(text.replace(f"pull {PINNED}", f"pull {OTHER}").replace(f'"{PINNED}"', TAG))
    details = [d.detail for d in file_drifts(pin, [unit])]
    assert details == [
        f"{unit}:{pull_line}: ExecStartPre is {OTHER} (another digest), pinned {PINNED}: the "
        f"next start runs whatever that names{AGAIN}",
        f"{unit}:{run_line}: ExecStart (docker run's image) is {TAG} (a tag, not a digest), "
        f"pinned {PINNED}: the next start runs whatever that names{AGAIN}",
    ]


def test_a_volume_that_is_not_the_pins_is_a_drift(stacks_dir: Path, tmp_path: Path) -> None:
    pin, compose, unit = _rendered(stacks_dir, tmp_path)
    ours = cache_volume_name(STACK, pin.host)
    theirs = cache_volume_name(STACK, "gpu-node-08")
    for path in (compose, unit):  # as `sed -i s/OURS/THEIRS/` would edit them
        path.write_text(path.read_text().replace(ours, theirs))
    details = [d.detail for d in file_drifts(pin, [compose, unit])]
    assert len(details) == 2, details
    assert details[0].startswith(f"{compose}:")
    assert (
        f": services.llm.volumes.1 mounts volume {theirs} at {CACHE_TARGET}, pinned {ours}: "
        in (details[0])
    )
    assert details[1].startswith(f"{unit}:")
    assert (
        f"ExecStart (--mount) mounts volume {theirs} at {CACHE_TARGET}, pinned {ours}: "
        in (details[1])
    )
    assert all(d.endswith(AGAIN) for d in details)


def test_a_compose_file_that_no_longer_parses_is_a_drift(stacks_dir: Path, tmp_path: Path) -> None:
    pin, compose, _ = _rendered(stacks_dir, tmp_path)
    compose.write_text(compose.read_text() + "services: [\n")
    [drift] = file_drifts(pin, [compose])
    assert drift.detail.startswith(f"{compose}: cannot be read (") and drift.detail.endswith(AGAIN)


def test_drift_reports_a_tag_in_the_files_through_the_cli(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    """The files deploy wrote into BUILD_DIR/hosts/HOST, and --files for deploy's --out."""
    pin, compose, _ = _rendered(stacks_dir, tmp_path)
    write_pin(tmp_path / "hosts", pin)
    nobody = f"unix://{tmp_path}/no-engine.sock"
    clean = run_cli("drift", pin.host, "--engine", nobody, stacks_dir=stacks_dir)
    assert clean.exit_code == 1, clean.output  # the engine is not there: a drift of its own
    assert "DRIFT file" not in clean.output and f"{pin.host}: as pinned: files" in clean.output
    line = _edit(compose, f'image: "{PINNED}"', f'image: "{TAG}"')
    edited = run_cli("drift", pin.host, "--engine", nobody, stacks_dir=stacks_dir)
    assert edited.exit_code == 1
    assert f"{pin.host}: DRIFT file: {compose}:{line}: services.llm.image is {TAG}" in " ".join(
        edited.output.split()
    )
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    compose.rename(moved / "compose.yaml")
    elsewhere = run_cli(
        "drift", pin.host, "--engine", nobody, "--files", str(moved), stacks_dir=stacks_dir
    )
    assert f"DRIFT file: {moved / 'compose.yaml'}:{line}:" in " ".join(elsewhere.output.split())


@pytest.mark.parametrize("remote", [True, False])
def test_the_installed_unit_is_read_only_for_this_machines_engine(
    stacks_dir: Path, tmp_path: Path, remote: bool
) -> None:
    pin, _, unit = _rendered(stacks_dir, tmp_path)
    installed = tmp_path / "systemd"
    installed.mkdir()
    (installed / unit.name).write_text(unit.read_text())
    engine = "ssh://ops@gpu-node-07" if remote else None
    found = rendered_files(pin, tmp_path / "nothing", engine, unit_dir=installed)
    assert found == ([] if remote else [installed / unit.name])
