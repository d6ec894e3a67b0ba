"""A soak that reaches its time limit with streams open (issue 34 item 3; bench/FAULTS.md,
bench/results/faults/soak-time-limit/): the streams still open are cut off, not left running,
are left out of the counts whatever they end with, and are said.

Before the fix a stream the server kept quiet at the end held its worker thread and socket for
the read timeout (max(30 s, 2 x stall_s)) after the soak returned; an error such a stream met
after the end (its reader cut, the server stopping) counted as the server's failure, while the
verdict was being drawn; and a soak shorter than one answer failed with "no request finished"
and no word of why.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from builder import REPO_ROOT
from builder.manifest.resolve import ResolvedStack, resolve
from builder.verify.smoke import LiveServer
from builder.verify.smoke_report import SmokeReport
from builder.verify.soak import run_soak
from builder.verify.soak_load import SoakRun, SoakSettings, _Request, soak_prompts
from builder.verify.soak_verdict import CHECK_ERRORS
from tests.support.fake_chat import Behaviour, fake_chat_server, url_of


@pytest.fixture(scope="module")
def stack() -> ResolvedStack:
    return resolve("ci-mini", REPO_ROOT / "stacks")


def _soak_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("soak-") and t.is_alive()]


def _live(url: str, report: SmokeReport) -> LiveServer:
    return LiveServer(url, "tiny", lambda: True, None, report)


def test_streams_quiet_at_the_limit_are_cut_off_not_left_reading(
    stack: ResolvedStack, tmp_path: Path
) -> None:
    """The server stops sending once the second request is open; stall_s (30 s) is beyond the
    soak's 2 s, so no stall is judged: the end finds both streams open and silent."""
    report = SmokeReport(stack="ci-mini", image="fake", gpu=False, started_at="now")
    with fake_chat_server(Behaviour(tokens=100_000, stall_after=1)) as server:
        settings = SoakSettings(2.0, 2, 30.0, 0.0, None)
        began = time.monotonic()
        result = run_soak(
            _live(url_of(server), report), stack, settings, tmp_path / "s", log=lambda _: None
        )
        took = time.monotonic() - began
        left = _soak_threads()
    assert not left, f"worker threads still reading after the soak: {[t.name for t in left]}"
    assert took < settings.seconds + 10, took
    assert result.summary["cut_off_at_end"] == 2
    assert result.summary["requests"] == 0 and result.summary["errors"] == 0
    errors = next(c for c in report.checks if c.name == CHECK_ERRORS)
    assert not errors.passed
    assert "2 still open at its end" in errors.detail and "--soak" in errors.detail


def test_a_steady_soak_at_its_limit_counts_only_what_finished_before_it(
    stack: ResolvedStack, tmp_path: Path
) -> None:
    """Long answers flowing at the limit: the open ones are cut, counted as cut off, and their
    cut (a broken stream in the worker) is no error of the server."""
    report = SmokeReport(stack="ci-mini", image="fake", gpu=False, started_at="now")
    with fake_chat_server(Behaviour(tokens=30, token_delay_s=0.02)) as server:
        result = run_soak(
            _live(url_of(server), report),
            stack,
            SoakSettings(2.5, 2, 5.0, 0.0, None),
            tmp_path / "s",
            log=lambda _: None,
        )
    assert not _soak_threads()
    assert result.passed, report.failed()
    assert result.summary["errors"] == 0 and result.summary["requests"] > 0
    assert 0 <= result.summary["cut_off_at_end"] <= 2


def test_an_answer_or_error_after_the_end_is_left_out(stack: ResolvedStack) -> None:
    """What a worker brings back after the end (the verdict may be being drawn) changes no
    count: not a success, not a failure."""
    report = SmokeReport(stack="ci-mini", image="fake", gpu=False, started_at="now")
    soak = SoakRun(
        _live("http://127.0.0.1:9", report),
        SoakSettings(1.0, 1, 1.0, 0.0, None),
        soak_prompts(stack),
        None,
    )
    late_error, late_answer = _Request("short", 0.0), _Request("short", 0.0)
    late_error.error = "ChunkedEncodingError: connection broken"
    soak.open |= {late_error, late_answer}
    soak.abort.set()
    soak.finish(late_error)
    soak.finish(late_answer)
    assert soak.finished == [] and not soak.buckets
    assert late_error.error == late_answer.error == "ended by the soak"
