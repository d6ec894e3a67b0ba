"""Is knowledge/jit_dependencies.yaml complete for every locked stack? Checked against PyPI.

Usage: python bench/jit_closure_check.py [WORK_DIR]  (network: PyPI's metadata, through pip)

For each locked stack, the jit-deps stage installs requirements/jit.txt (FlashInfer's closure)
over the lock's heavy part with --no-deps, then `pip check`s it in the build. This asks the
same question ahead of any build: pip's dry-run report gives each package's Requires-Dist (PEP
658 metadata, no wheel download), each requirement's marker is evaluated for the stack's
platform, Python 3.12 and no extras, and a requirement whose package is outside the subset is
printed as MISSING. Exit status 1 if any is.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from builder import REPO_ROOT
from builder.manifest.resolve import resolve, stack_names
from builder.render.context import render

PIP_PLATFORMS = ["manylinux_2_28", "manylinux_2_17", "manylinux2014", "linux"]
PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)", re.M)


def requires_dist(spec: str, machine: str, work: Path) -> list[str]:
    """The package's Requires-Dist, from pip's dry-run report of installing it alone."""
    report = work / f"{spec}-{machine}.json"
    if not report.exists():
        command = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--no-deps"]
        command += ["--ignore-installed", "--only-binary=:all:", "--python-version=3.12"]
        command += [f"--platform={p}_{machine}" for p in PIP_PLATFORMS]
        command += [f"--target={work / 'target'}", f"--report={report}", spec]
        subprocess.run(command, check=True, capture_output=True)
    (installed,) = json.loads(report.read_text())["install"]
    return list(installed["metadata"].get("requires_dist", []))


def missing_requirements(stack: str, work: Path) -> list[str]:
    rendered = render(resolve(stack, REPO_ROOT / "stacks"))
    assert rendered.lock is not None
    machine = rendered.lock.python.platform.split("-")[0]
    environment = {"platform_machine": machine, "sys_platform": "linux", "extra": ""}
    environment |= {"python_version": "3.12", "python_full_version": "3.12.3"}
    pins = PIN.findall(rendered.files["requirements/jit.txt"][0].decode())
    have = {canonicalize_name(n) for n, _ in pins} | {
        canonicalize_name(n) for n in rendered.lock.python.heavy
    }
    missing = []
    for name, version in pins:
        for line in requires_dist(f"{name}=={version}", machine, work):
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate(environment):
                continue
            if canonicalize_name(requirement.name) not in have:
                missing.append(f"{requirement.name} (required by {name} {version})")
    return missing


def main(arguments: list[str]) -> int:
    work = Path(arguments[0]) if arguments else Path(tempfile.mkdtemp(prefix="jit-closure-"))
    work.mkdir(parents=True, exist_ok=True)
    failed = False
    for stack in stack_names(REPO_ROOT / "stacks"):
        if render(resolve(stack, REPO_ROOT / "stacks")).lock is None:
            continue
        missing = missing_requirements(stack, work)
        failed = failed or bool(missing)
        print(f"{stack}: {'MISSING ' + ', '.join(missing) if missing else 'complete'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
