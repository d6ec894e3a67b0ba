"""The suite's time, measured (issue 41): the durations file `make test` writes (the slowest
tests, the engine tests' total, a warning past its budget, never a failure) and
bench/test_time.py's by-file table from pytest's JUnit XML."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from builder import REPO_ROOT
from tests.conftest import durations_text

SCRIPT = REPO_ROOT / "bench" / "test_time.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_test_time", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


DURATIONS = {
    "tests/engine/test_a.py::test_slow": 120.0,
    "tests/engine/test_a.py::test_fast": 1.5,
    "tests/test_b.py::test_unit": 0.25,
}
ENGINE = {"tests/engine/test_a.py::test_slow", "tests/engine/test_a.py::test_fast"}


def test_the_durations_file_ranks_the_slowest_and_totals_the_engine_tests() -> None:
    text = durations_text(DURATIONS, ENGINE, budget_s=900, slowest=2, wall=(80.25, 2))
    lines = text.splitlines()
    assert lines[0] == "# the 2 slowest of 3 tests (setup + call + teardown)"
    assert lines[1] == "   120.00s  tests/engine/test_a.py::test_slow"
    assert lines[2] == "     1.50s  tests/engine/test_a.py::test_fast"
    assert "# engine tests: 121.5s over 2 tests (budget 900s" in text
    assert "# wall: 80.2s on 2 worker(s)" in lines
    assert "WARNING" not in text


def test_past_the_budget_the_durations_file_warns_and_nothing_fails() -> None:
    text = durations_text(DURATIONS, ENGINE, budget_s=100)
    warning = [line for line in text.splitlines() if line.startswith("WARNING")]
    assert warning == [
        "WARNING: the engine tests took 121.5s, past their budget of 100s: see the slowest "
        "above (a loaded machine is slower too)"
    ]


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.engine.test_registry" name="test_push" time="30.5"/>
<testcase classname="tests.engine.test_registry" name="test_pull" time="10.0">
  <skipped message="no engine"/></testcase>
<testcase classname="tests.test_suite_time" name="test_x" time="0.5">
  <failure message="boom"/></testcase>
<testcase classname="tests.engine.test_gone.TestClass" name="test_y" time="2"/>
</testsuite></testsuites>
"""


def test_the_junit_xml_is_tabulated_by_file(tmp_path: Path) -> None:
    script = _script()
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    files = script.by_file(path)
    registry = files["tests/engine/test_registry.py"]
    assert (registry.seconds, registry.tests, registry.skipped, registry.failed) == (40.5, 2, 1, 0)
    assert files["tests/test_suite_time.py"].failed == 1
    assert "tests/engine/test_gone/TestClass.py" in files  # no such file: the parts as a path
    table = script.table(files)
    assert table.splitlines()[2] == "| tests/engine/test_registry.py | 40.5 | 2 | 1 | 0 |"
    assert table.splitlines()[-1] == "| **all** | 43.0 | 4 | 1 | 1 |"


def test_before_and_after_side_by_side(tmp_path: Path) -> None:
    before, after = tmp_path / "before.xml", tmp_path / "after.xml"
    before.write_text(JUNIT)
    after.write_text(JUNIT.replace('time="30.5"', 'time="5.5"'))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(before), str(after)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "| tests/engine/test_registry.py | 40.5 | 15.5 | 25.0 | 2 | 2 |" in done.stdout


def test_a_file_that_is_not_junit_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "console.log"
    bad.write_text("collected 1270 items\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True)
    assert done.returncode == 2
    assert str(bad) in done.stderr and "not a JUnit XML file" in done.stderr
    assert "Traceback" not in done.stderr


def _engine_tests_without_an_engine(require: bool) -> subprocess.CompletedProcess[str]:
    """One engine test file run as `make test` runs the suite (two workers), against an engine
    address where nothing answers."""
    env = {k: v for k, v in os.environ.items() if k != "SM120_STACKS_REQUIRE_ENGINE"}
    env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"
    if require:
        env["SM120_STACKS_REQUIRE_ENGINE"] = "1"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            "-q",
            "tests/engine/test_orphans.py",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_under_two_workers_no_engine_fails_ci_and_a_user_s_run_says_what_did_not_run() -> None:
    """A worker's skip or failure reaches the controller only as a test report: CI
    (SM120_STACKS_REQUIRE_ENGINE=1) fails each engine test; a user's run skips them and says so
    loudly at the end."""
    ci = _engine_tests_without_an_engine(require=True)
    assert ci.returncode == 1, ci.stdout[-2000:]
    assert "2 errors" in ci.stdout  # failed at setup, before any fixture asks the engine
    assert "SM120_STACKS_REQUIRE_ENGINE=1 but no Docker engine reachable" in ci.stdout
    user = _engine_tests_without_an_engine(require=False)
    assert user.returncode == 0, user.stdout[-2000:]
    assert "2 skipped" in user.stdout
    assert "2 engine tests NOT RUN: no Docker engine reachable" in user.stdout
