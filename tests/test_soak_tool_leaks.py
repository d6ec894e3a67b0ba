"""The tool soak's leak counter (bench/tool_soak_leaks.py): every kind it names lands in one
column of the per-round table, and a loop's temporary folders are what its TMPDIR holds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from builder import REPO_ROOT


def _leaks() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "tool_soak_leaks", REPO_ROOT / "bench" / "tool_soak_leaks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_kind_main_names_has_its_column() -> None:
    leaks = _leaks()
    host = "soak-a-abc123-host"
    names = {
        "engine tags": "images",
        "engine containers": "containers",
        f"{host} containers": "containers",
        f"{host} volumes": "volumes",
        f"{host} networks": "networks",
        f"{host} images": "images",
        "a/build files": "build files",
        "a temporary folders": "temporary folders",
        "registry tags": "registry tags",
        "registry repositories": "registry repositories",
        "registry open uploads": "open uploads",
    }
    assert {name: leaks.kind_of(name) for name in names} == names
    assert set(names.values()) == set(leaks.KINDS)
    header = leaks.tsv_header().split("\t")
    assert header[:3] == ["time_utc", "loop", "round"] and len(header) == 3 + len(leaks.KINDS) + 3


def test_a_loops_temporary_folders_are_what_its_tmpdir_holds(tmp_path: Path) -> None:
    leaks = _leaks()
    folder = leaks.Folder(tmp_path / "a", "soak-a-x", "soak-a-x-host", "unix:///nowhere")
    assert leaks.temporary_folders(folder, tmp_path) == []  # no TMPDIR yet: nothing left
    (tmp_path / "tmp" / "a" / "sm120-build-q1").mkdir(parents=True)
    (tmp_path / "tmp" / "b").mkdir()
    (tmp_path / "tmp" / "b" / "other-loops").mkdir()
    assert leaks.temporary_folders(folder, tmp_path) == ["tmp/a/sm120-build-q1"]
