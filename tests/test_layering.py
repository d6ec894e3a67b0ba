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


def test_the_docker_contract_covers_every_module_but_the_adapter() -> None:
    """.importlinter forbids `docker` to each step and each module of image/ and engine/ but
    the adapter:
    a new module of either must be listed there too, or it could import the SDK unseen."""
    contract = (REPO_ROOT / ".importlinter").read_text().split("[importlinter:contract:docker]")[1]
    listed = set(re.findall(r"^\s+(builder\.[a-z_.]+)$", contract, re.M))
    modules = {
        f"builder.{step}.{p.stem}"
        for step in ("image", "engine")
        for p in (PACKAGE / step).glob("*.py")
    }
    expected = modules - {
        "builder.engine.docker_adapter",
        "builder.image.__init__",
        "builder.engine.__init__",
    }
    assert expected <= listed, expected - listed
    assert "builder.engine.docker_adapter" not in listed
