"""Shared fixtures: a scratch copy of the stacks folder and the CLI runner."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist hands its workers the controller's terminal size as COLUMNS and LINES (for
    # its own output); the tool's tables would take it as theirs and wrap at 80. The tests
    # read the tables a pipe gets (builder/cli/__init__.py PIPE_WIDTH), as without workers.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

from builder import REPO_ROOT
from builder.cli.main import cli

STACKS = REPO_ROOT / "stacks"

# The suite's registries (127.0.0.1:5000, the fault tests' own, the namespace hosts') speak
# plain HTTP: named insecure here, as a user names theirs (docs/evidence.md). The TLS test
# (tests/engine/test_tls_registry.py) runs without it.
os.environ.setdefault("SM120_STACKS_INSECURE_REGISTRIES", "127.0.0.0/8,10.0.0.0/8")


@pytest.fixture
def stacks_dir(tmp_path: Path) -> Path:
    """A copy of stacks/ beside a link to patches/, so tests can add or break manifests."""
    target = tmp_path / "stacks"
    shutil.copytree(STACKS, target)
    (tmp_path / "patches").symlink_to(REPO_ROOT / "patches")
    return target


@pytest.fixture
def write_stack(stacks_dir: Path) -> Callable[..., Path]:
    def write(name: str, text: str | bytes | dict[str, object]) -> Path:
        path = stacks_dir / f"{name}.yaml"
        if isinstance(text, dict):
            text = yaml.safe_dump(text, sort_keys=False)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    return write


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., Result]:
    def run(*args: str, stacks_dir: Path | None = None) -> Result:
        options = [
            "--stacks-dir",
            str(stacks_dir or STACKS),
            "--build-dir",
            str(tmp_path / "build"),
        ]
        return CliRunner().invoke(cli, [*options, *args], catch_exceptions=False)

    return run


def marlin_manifest() -> dict[str, object]:
    loaded = yaml.safe_load((STACKS / "vllm-0.22-marlin.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


# --- markers and the durations file -------------------------------------------------------------

#: Where `make test` asks for the slowest tests (--durations-file), and how many.
SLOWEST = 30
#: The engine tests' recorded total (seconds, setup + call + teardown) past which the durations
#: file says so: a warning line, never a failure (a loaded machine is slower, not wrong). Issue
#: 41's target is `make test` in at most 20 minutes with the engine's caches warm; the engine
#: tests get 15 of them. SM120_STACKS_ENGINE_BUDGET_S sets another for another machine.
ENGINE_BUDGET_S = float(os.environ.get("SM120_STACKS_ENGINE_BUDGET_S") or 900)
_durations: dict[str, float] = {}
_engine_nodes: set[str] = set()
_session_began: list[float] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _session_began.append(time.monotonic())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--durations-file",
        default=None,
        metavar="PATH",
        help=f"write the {SLOWEST} slowest tests, the engine tests' total and a warning past "
        "its budget (SM120_STACKS_ENGINE_BUDGET_S) to PATH",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_ci_mini(why): the test builds or pushes ci-mini (3.6 GB) because it needs its "
        "content (JIT cache, transformers serve, soak, device code, a real server's warm "
        "caches); every other engine test takes the tiny stack (tests/engine/conftest.py)",
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Times and skips as reported: under `make test`'s workers (pytest-xdist) only the
    controller sees every test, through these reports, never through collection."""
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if "engine" in report.keywords:
        _engine_nodes.add(report.nodeid)
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        if reason == NO_ENGINE or reason.startswith(NO_PACKAGE_INDEX):
            _loud_skips[reason] = _loud_skips.get(reason, 0) + 1


def durations_text(
    durations: dict[str, float],
    engine_nodes: set[str],
    budget_s: float,
    slowest: int = SLOWEST,
    wall: tuple[float, int] | None = None,
) -> str:
    """The durations file: the slowest tests (seconds, node id), the totals, the session's wall
    time and workers (the totals add up every worker's time), and a WARNING line when the engine
    tests' total is past budget_s."""
    ranked = sorted(durations.items(), key=lambda item: (-item[1], item[0]))[:slowest]
    engine_total = sum(seconds for node, seconds in durations.items() if node in engine_nodes)
    lines = [f"# the {len(ranked)} slowest of {len(durations)} tests (setup + call + teardown)"]
    lines += [f"{seconds:9.2f}s  {node}" for node, seconds in ranked]
    lines.append(f"# all tests: {sum(durations.values()):.1f}s")
    if wall is not None:
        lines.append(f"# wall: {wall[0]:.1f}s on {wall[1]} worker(s)")
    lines.append(
        f"# engine tests: {engine_total:.1f}s over {len(engine_nodes & durations.keys())} tests"
        f" (budget {budget_s:.0f}s, SM120_STACKS_ENGINE_BUDGET_S)"
    )
    if engine_total > budget_s:
        lines.append(
            f"WARNING: the engine tests took {engine_total:.1f}s, past their budget of "
            f"{budget_s:.0f}s: see the slowest above (a loaded machine is slower too)"
        )
    return "\n".join(lines) + "\n"


# --- engine tests ---------------------------------------------------------------------------

REQUIRE_ENGINE = os.environ.get("SM120_STACKS_REQUIRE_ENGINE") == "1"
NO_ENGINE = "no Docker engine reachable (start dockerd, or see .ci/run)"
NO_PACKAGE_INDEX = "the package index does not answer"
#: Skip reasons said again, loudly, at the end (reason -> tests), whichever worker skipped them.
_loud_skips: dict[str, int] = {}
#: Why a test must fail instead of running: the engine or the index CI requires is missing.
_MUST_FAIL = pytest.StashKey[str]()
#: Where the engine tests live: one unit of work for one worker (pytest_xdist_make_scheduler).
ENGINE_DIR = "tests/engine/"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `make test`'s workers (pytest-xdist), every engine test runs on one worker, in
    order: they share the session's ci-mini and ci-tiny builds and the registry's repositories.
    The other tests go file by file to whichever worker is free (a file's module fixtures, such
    as the host-setup stand-ins, are made once). xdist's own `--dist loadgroup` cannot be used:
    it renames node ids through an attribute pytest 9.2 no longer reads."""
    from xdist.scheduler import LoadScopeScheduling

    class EngineTestsTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return ENGINE_DIR if path.startswith(ENGINE_DIR) else path

    return EngineTestsTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Engine tests run whenever an engine answers; without one they skip loudly, or fail in CI.
    Tests that ask the real package index (marker `network`) likewise, when PyPI does not
    answer."""
    _skip_network_tests_loudly(items)
    engine_items = [item for item in items if item.get_closest_marker("engine")]
    if not engine_items:
        return
    from builder.engine.address import from_environment
    from builder.engine.docker_adapter import engine_reachable

    if not engine_reachable(from_environment()):
        _skip_or_fail(engine_items, NO_ENGINE)


def _skip_network_tests_loudly(items: list[pytest.Item]) -> None:
    network_items = [item for item in items if item.get_closest_marker("network")]
    if not network_items:
        return
    import urllib.request

    try:
        urllib.request.urlopen("https://pypi.org/simple/six/", timeout=10).close()
    except OSError as exc:
        _skip_or_fail(network_items, f"{NO_PACKAGE_INDEX} (https://pypi.org: {exc})")


def _skip_or_fail(items: list[pytest.Item], reason: str) -> None:
    """Skip (said loudly at the end), or under SM120_STACKS_REQUIRE_ENGINE=1 (CI) fail each test
    at its setup: a failed test is reported by whichever worker ran it, a session flag is not."""
    for item in items:
        if REQUIRE_ENGINE:
            item.stash[_MUST_FAIL] = "SM120_STACKS_REQUIRE_ENGINE=1 but " + reason
        else:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = item.stash.get(_MUST_FAIL, None)
    if reason is not None:
        pytest.fail(reason, pytrace=False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = session.config.getoption("--durations-file")
    if target and _durations and not hasattr(session.config, "workerinput"):
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        written = path.with_name(path.name + ".part")
        wall = (time.monotonic() - _session_began[0], _workers(session.config))
        written.write_text(durations_text(_durations, _engine_nodes, ENGINE_BUDGET_S, wall=wall))
        written.replace(path)  # whole or not at all: a killed run leaves the last one


def _workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers ran the tests (1 without -n)."""
    count = getattr(config.option, "numprocesses", None)
    return count if isinstance(count, int) and count > 0 else 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for reason, count in sorted(_loud_skips.items()):
        kind = "engine" if reason == NO_ENGINE else "network"
        line = f"{count} {kind} tests NOT RUN: {reason}"
        terminalreporter.write_sep("!", line, red=True, bold=True)


@pytest.fixture(autouse=True)
def _fake_hosts_have_the_served_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hosts the unit tests pin are not this machine: `pin` reads their GPU kind as the
    one their records served on (tests/support/served.py), not this machine's (none)."""
    from tests.support.served import SERVED_GPU

    monkeypatch.setattr("builder.cli.pin._host_gpu_kind", lambda engine: SERVED_GPU)
