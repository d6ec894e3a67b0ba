"""Image checks under pytest: the plugins that feed image_checks.py and collect its outcomes.

Apart from validate.py so that only `test` pays for importing pytest; every other command
starts without it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from builder.verify.report import CheckResult

CHECKS_MODULE = Path(__file__).with_name("image_checks.py")


class _Collector:
    """A pytest plugin that keeps each check's outcome and its short failure text."""

    def __init__(self) -> None:
        self.results: list[CheckResult] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = re.sub(r"-?docker://[0-9a-f]+-?", "", report.nodeid.split("::", 1)[-1])
        name = name.removeprefix("test_").replace("[]", "")
        if report.when == "call" or (report.when == "setup" and not report.passed):
            detail = ""
            if report.failed:
                crash = getattr(report.longrepr, "reprcrash", None)
                detail = str(crash.message) if crash else str(report.longrepr)[-500:]
            elif report.skipped and isinstance(report.longrepr, tuple):
                detail = str(report.longrepr[2])
            self.results.append(CheckResult(name, report.passed, report.skipped, detail))


class CheckInputs:
    """A pytest plugin handing image_checks.py what to expect, as fixtures and parameters.

    Passed to pytest.main as an object, not through environment variables or module globals, so
    a second image checked in the same process gets its own expectations.
    """

    def __init__(
        self, expect: dict[str, Any], inspect: dict[str, Any], proxy_ca_lines: list[str]
    ) -> None:
        self._expect = expect
        self._inspect = inspect
        self._proxy_ca_lines = proxy_ca_lines

    @pytest.fixture
    def expect(self) -> dict[str, Any]:
        return self._expect

    @pytest.fixture
    def inspect(self) -> dict[str, Any]:
        return self._inspect

    @pytest.fixture
    def proxy_ca_lines(self) -> list[str]:
        return self._proxy_ca_lines

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "package" in metafunc.fixturenames:
            metafunc.parametrize("package", sorted(self._expect["packages"]))
        if "variable" in metafunc.fixturenames:
            metafunc.parametrize("variable", sorted(self._expect["env"]))
        if "patch" in metafunc.fixturenames:
            patches = self._expect["patches"] or [None]
            ids = [Path(p["file"]).name if p else "none" for p in patches]
            metafunc.parametrize("patch", patches, ids=ids)


def run_checks(
    inputs: CheckInputs, hosts: str, workdir: Path, select: str | None = None
) -> list[CheckResult]:
    """Run image_checks.py against testinfra `hosts` (-k `select` picks checks by name)."""
    collector = _Collector()
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\n")
    args = [str(CHECKS_MODULE), f"--hosts={hosts}", "-p", "no:terminal", "-p", "no:cacheprovider"]
    args += ["-c", str(ini), "--rootdir", str(workdir)] + (["-k", select] if select else [])
    status = pytest.main(args, plugins=[collector, inputs])
    if status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) or not collector.results:
        raise RuntimeError(f"the image checks did not run (pytest exit status {status})")
    return collector.results
