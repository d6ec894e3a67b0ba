"""`sm120-stacks report`: its refusals (exit 2) and the page's escaping, without an engine
(tests/engine/test_report_page.py loads a real test run's page in Chromium)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from click.testing import Result

from builder.image.records import Record, save_record
from builder.report.gather import find_tested
from builder.report.page import render_page

HASH = "ab" * 32


def test_an_unknown_stack_and_a_stack_never_tested_exit_2(
    run_cli: Callable[..., Result], tmp_path: Path
) -> None:
    unknown = run_cli("report", "no-such-stack")
    assert unknown.exit_code == 2 and "no stack named 'no-such-stack'" in unknown.output
    never = run_cli("report", "ci-mini")
    assert never.exit_code == 2
    assert "ci-mini was never built or tested" in never.output
    assert "sm120-stacks test ci-mini" in never.output
    save_record(tmp_path / "build", Record(stack="ci-mini", content_hash=HASH))  # built only
    untested = run_cli("report", "ci-mini")
    assert untested.exit_code == 2 and "ci-mini has no image tested" in untested.output
    assert not list((tmp_path / "build").rglob("*.html"))


def test_what_servers_and_logs_said_is_text_on_the_page(tmp_path: Path) -> None:
    """Answers, details and reasons are escaped (autoescape), and what was not run says so."""
    report_path = tmp_path / "build" / "ci-mini" / "reports" / "r.json"
    report_path.parent.mkdir(parents=True)
    report = {
        "stack": "ci-mini",
        "content_hash": HASH,
        "image": "sm120-stacks:ci-mini-x",
        "passed": False,
        "verdicts": {"static": "failed", "served": "not served (no GPU <here>)"},
        "checks": [
            {"name": "pin<b>", "passed": False, "skipped": False, "detail": "<script>x()</script>"}
        ],
        "jit_cache": [],
        "smoke": None,
        "smoke_skipped": "no GPU <here>",
    }
    report_path.write_text(json.dumps(report))
    save_record(
        tmp_path / "build",
        Record(stack="ci-mini", content_hash=HASH, tests="failed", report=str(report_path)),
    )
    [tested] = find_tested(tmp_path / "build", "ci-mini")
    html = render_page(tested)
    assert "<script>" not in html and "&lt;script&gt;x()&lt;/script&gt;" in html
    assert 'id="verdict" class="verdict failed">FAILED<' in html
    assert "Skipped: no GPU &lt;here&gt;" in html
    assert "No soak ran" in html and "Not judged: no server log was read." in html
    assert "Not pushed" in html
