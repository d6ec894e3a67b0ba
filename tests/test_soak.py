"""The soak's judge against a stand-in chat server (seconds, no engine): it passes a healthy
server and fails each fault by its own check. The real server, with hooks in it, is soaked by
tests/engine/test_soak.py."""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Callable
from itertools import count
from pathlib import Path

import pytest
from click.testing import Result

from builder import REPO_ROOT
from builder.manifest.resolve import ResolvedStack, resolve
from builder.verify.smoke import LiveServer
from builder.verify.smoke_report import SmokeReport
from builder.verify.soak import run_soak
from builder.verify.soak_files import Chart, png, summary_line
from builder.verify.soak_load import USER_AGENT, SoakSettings, process_tree_rss, soak_prompts
from builder.verify.soak_verdict import CHECK_ERRORS, CHECK_MEMORY, CHECK_STALL
from tests.support.fake_chat import Behaviour, fake_chat_server, url_of


@pytest.fixture(scope="module")
def stack() -> ResolvedStack:
    return resolve("ci-mini", REPO_ROOT / "stacks")


def settings(**changes: float | int | None) -> SoakSettings:
    values: dict[str, float | int | None] = {
        "seconds": 2.0,
        "concurrency": 2,
        "stall_s": 1.0,
        "max_error_rate": 0.0,
        "max_memory_growth_mb": 100.0,
    }
    values.update(changes)
    return SoakSettings(**values)  # type: ignore[arg-type]


def steady() -> int:
    return 500_000_000


def soak(
    stack: ResolvedStack,
    behaviour: Behaviour,
    tmp_path: Path,
    memory: object = steady,
    **changes: float | int | None,
) -> tuple[SmokeReport, dict[str, object], float]:
    report = SmokeReport(stack="ci-mini", image="fake", gpu=False, started_at="now")
    with fake_chat_server(behaviour) as server:
        live = LiveServer(url_of(server), "tiny", lambda: True, None, report)
        began = time.monotonic()
        result = run_soak(
            live,
            stack,
            settings(**changes),
            tmp_path / "ci-mini-soak",
            memory=memory,  # type: ignore[arg-type]
            memory_source="a test's numbers",
            log=lambda line: None,
        )
        took = time.monotonic() - began
        assert set(server.user_agents) == {USER_AGENT}
    return report, result.summary, took


def failed(report: SmokeReport) -> set[str]:
    return {check.name for check in report.failed()}


def test_a_steady_server_passes_with_its_numbers_and_files(
    stack: ResolvedStack, tmp_path: Path
) -> None:
    report, summary, _ = soak(stack, Behaviour(), tmp_path)
    assert report.passed, report.failed()
    assert {c.name for c in report.checks} == {CHECK_STALL, CHECK_ERRORS, CHECK_MEMORY}
    assert summary["requests"] and summary["errors"] == 0
    ttft, itl = summary["ttft_s"], summary["itl_s"]
    assert isinstance(ttft, dict) and isinstance(itl, dict)
    assert ttft["p50"] is not None and ttft["p99"] >= ttft["p50"]
    assert itl["p50"] is not None and itl["p99"] >= itl["p50"]
    kinds = summary["by_kind"]
    assert isinstance(kinds, dict) and all(k["requests"] for k in kinds.values()), kinds
    assert report.soak == summary
    saved = json.loads((tmp_path / "ci-mini-soak.json").read_text())
    assert saved["passed"] is True and saved["ttft_s"] == ttft
    rows = list(csv.DictReader((tmp_path / "ci-mini-soak.csv").open()))
    assert len(rows) >= 2 and float(rows[0]["tokens_per_s"]) > 0
    assert rows[0]["memory_mb"] == "500.0"
    png = (tmp_path / "ci-mini-soak.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png.endswith(b"IEND\xaeB`\x82")


def test_mixed_prompt_lengths(stack: ResolvedStack) -> None:
    prompts = soak_prompts(stack)
    assert [p.kind for p in prompts] == ["short", "medium", "long"]
    assert len(prompts[0].prompt) < len(prompts[1].prompt) < len(prompts[2].prompt)


def test_a_server_whose_streams_all_stop_fails_as_a_stall_and_ends_early(
    stack: ResolvedStack, tmp_path: Path
) -> None:
    report, summary, took = soak(stack, Behaviour(stall_after=4), tmp_path, seconds=20.0)
    assert failed(report) == {CHECK_STALL}, report.failed()
    stall = next(c for c in report.failed() if c.name == CHECK_STALL)
    assert "no token on any of 2 open streams" in stall.detail
    assert "while the server was up" in stall.detail
    assert took < 10, "a stall ends the soak: its verdict cannot change"
    assert str(summary["stopped_early"]).startswith("stalled")


def test_errors_above_the_threshold_fail_and_below_it_pass(
    stack: ResolvedStack, tmp_path: Path
) -> None:
    report, summary, _ = soak(stack, Behaviour(fail_every=3), tmp_path)
    assert failed(report) == {CHECK_ERRORS}
    assert "HTTP 500" in next(c.detail for c in report.failed())
    assert 0.2 < float(summary["error_rate"]) < 0.5  # type: ignore[arg-type]
    report, _, _ = soak(stack, Behaviour(fail_every=3), tmp_path, max_error_rate=0.5)
    assert report.passed, report.failed()


def test_memory_past_its_bound_fails_and_ends_early(stack: ResolvedStack, tmp_path: Path) -> None:
    calls = count()

    def leaking() -> int:
        return 500_000_000 + 150_000_000 * next(calls)

    report, summary, took = soak(stack, Behaviour(), tmp_path, leaking, seconds=30.0)
    assert failed(report) == {CHECK_MEMORY}
    assert "at most 100 MB" in report.failed()[0].detail
    assert took < 10
    memory = summary["memory"]
    assert isinstance(memory, dict) and memory["peak_growth_mb"] > 100


def test_the_resident_set_of_a_process_tree() -> None:
    mine = process_tree_rss(os.getpid())
    assert mine is not None and mine > 10_000_000
    assert process_tree_rss(2**22 + 1) is None


def test_the_chart_is_a_png_matplotlib_drew_of_every_panel(tmp_path: Path) -> None:
    """The chart reads back as a PNG of the figure's size (900 x 750), and a soak on a machine
    without the plotting library writes no chart and says how to get one."""
    import struct

    rows = [
        {"t_s": t, "tokens_per_s": 40.0 + t, "ttft_p50_s": 0.1 if t % 2 else None}
        for t in range(30)
    ]
    chart = Chart("ci-mini", 2, 30.0, None, True, [(t, 500.0 + t) for t in range(30)], 600.0)
    data = png(chart, rows)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (900, 750)
    summary_files = {"json": "x.json", "csv": "x.csv"}
    assert "no chart: pip install 'sm120-stacks[report]'" in summary_line(
        _summary_for_line(summary_files)
    )


def _summary_for_line(files: dict[str, str]) -> dict[str, object]:
    stats = {"p50": 0.1, "p99": 0.2}
    return {
        "passed": True,
        "ran_s": 2.0,
        "requests": 3,
        "errors": 0,
        "ttft_s": stats,
        "itl_s": stats,
        "tokens_per_s": 9.0,
        "memory": {"samples": 0},
        "stopped_early": None,
        "files": files,
    }


def test_smoke_url_soak_judges_a_server_the_tool_did_not_start(
    stacks_dir: Path, run_cli: Callable[..., Result], tmp_path: Path
) -> None:
    """`smoke STACK --url URL --soak SECONDS --server-pid PID` through the command line: the
    smoke passes, then the soak runs on the same server, memory from that process tree."""
    (stacks_dir / "url-soak.yaml").write_text(
        "extends: vllm-0.22-b12x\n"
        "smoke: {concurrency: 2, floors: {single_stream_tok_s: 0, batched_tok_s: 0}}\n"
    )
    report = tmp_path / "reports" / "url-soak-url-smoke.json"
    with fake_chat_server(Behaviour(answers=True)) as server:
        result = run_cli(
            "smoke",
            "url-soak",
            "--url",
            url_of(server),
            "--report",
            str(report),
            "--soak",
            "2",
            "--server-pid",
            str(os.getpid()),
            stacks_dir=stacks_dir,
        )
    assert result.exit_code == 0, result.output
    smoke = json.loads(report.read_text())
    assert smoke["passed"] and CHECK_STALL in {c["name"] for c in smoke["checks"]}
    soak = json.loads((tmp_path / "reports" / "url-soak-url-soak.json").read_text())
    assert soak["passed"] and soak["requests"] > 0
    assert soak["memory"]["source"] == f"resident set of process {os.getpid()} and its children"
    assert (tmp_path / "reports" / "url-soak-url-soak.png").is_file()
