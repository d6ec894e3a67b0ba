"""Boundaries the import contract (.importlinter) cannot state: which module may look at the
host's devices, and which may talk to Docker through its SDK."""

from __future__ import annotations

import re
from pathlib import Path

from builder import REPO_ROOT

PACKAGE = REPO_ROOT / "builder"
#: Device nodes, CDI spec folders and the toolkit's hooks: the GPU probe's business alone.
DEVICE_LOOKUP = re.compile(r"/dev/nvidia|/etc/cdi|/var/run/cdi|nvidia-container-runtime-hook")
#: The PCIe topology readings (`doctor`'s tensor-parallel checks) are hostprobe's too.
PROBES = {"engine/hostprobe.py"}
DOCKER_IMPORT = re.compile(r"^\s*(import docker\b|from docker\b)", re.M)


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_only_the_probe_looks_at_devices() -> None:
    lookers = {name for name, text in _sources().items() if DEVICE_LOOKUP.search(text)}
    assert lookers <= PROBES, lookers - PROBES
    assert "engine/hostprobe.py" in lookers
    smi = {name for name, text in _sources().items() if re.search(r"""["']nvidia-smi["']""", text)}
    assert smi <= PROBES, smi - PROBES


def test_only_the_engine_adapter_imports_docker() -> None:
    importers = {name for name, text in _sources().items() if DOCKER_IMPORT.search(text)}
    assert importers == {"engine/docker_adapter.py"}


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    assert DEVICE_LOOKUP.search('Path("/dev/nvidia0").exists()')
    assert DOCKER_IMPORT.search("def f():\n    import docker\n")


def test_the_docker_contract_covers_every_package_and_ignores_only_the_adapter() -> None:
    """.importlinter forbids `docker` to each package of builder/ (with every module below it)
    and to errors.py and files.py, and lets through only the adapter's own import: a new
    module is covered by its package, and a new package must be listed, or it fails here."""
    contract = (REPO_ROOT / ".importlinter").read_text().split("[importlinter:contract:docker]")[1]
    sources = contract.split("source_modules =")[1].split("forbidden_modules")[0]
    listed = set(re.findall(r"^\s+(builder\.[a-z_]+)$", sources, re.M))
    top = {
        f"builder.{p.stem if p.is_file() else p.name}"
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem not in {"__init__", "__main__"})
        or (p / "__init__.py").is_file()
    }
    assert listed == top, (top - listed, listed - top)
    ignored = contract.split("ignore_imports =")[1].split("allow_indirect_imports")[0]
    assert ignored.split() == ["builder.engine.docker_adapter", "->", "docker"]
