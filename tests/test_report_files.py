"""Smoke reports and server logs are replaced whole: a reader (a `list`, a CI job collecting
artifacts) sees the old file or the new one, never a truncated one. No engine needed."""

from __future__ import annotations

from pathlib import Path

from builder.verify import smoke_judge
from builder.verify.smoke_report import SmokeReport


def _report() -> SmokeReport:
    report = SmokeReport(stack="s", image="sm120-stacks:s-1", gpu=False, started_at="now")
    report.add("correct answer", True, "Frankfort")
    return report


def test_the_smoke_report_replaces_the_old_one_whole(tmp_path: Path) -> None:
    path = tmp_path / "reports" / "s-smoke.json"
    path.parent.mkdir()
    path.write_text('{"old": true}\n')
    with path.open() as reader:  # opened before the new report is written
        smoke_judge.write_report(_report(), path)
        assert reader.read() == '{"old": true}\n', "written in place: the reader saw it change"
    assert '"correct answer"' in path.read_text()
    assert sorted(p.name for p in path.parent.iterdir()) == ["s-smoke.json"]


def test_the_server_log_replaces_the_old_one_whole(tmp_path: Path) -> None:
    class Container:
        def logs(self, stdout: bool, stderr: bool) -> bytes:
            return b"INFO: serving\n"

    report_path = tmp_path / "s-smoke.json"
    log = smoke_judge.server_log_path(report_path)
    log.write_text("old log\n")
    with log.open() as reader:
        smoke_judge.collect_log(Container(), _report(), report_path)
        assert reader.read() == "old log\n"
    assert log.read_text() == "INFO: serving\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [log.name]
