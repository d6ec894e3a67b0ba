"""One verdict type (image/verdicts.py): the record, a test report and the registry's verdict
document keep the same `Verdicts`, merged in one place, and push gates on its static part."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from builder.errors import StackError
from builder.evidence.documents import VerdictDocument, verdict_document
from builder.image.records import Record, load_record, require_tested, save_record
from builder.image.verdicts import CPU, ServedVerdict, Verdicts, merge, newest_per_kind
from builder.verify import report as reports

H200 = "NVIDIA H200"


def _served(kind: str, passed: bool, at: str) -> ServedVerdict:
    return ServedVerdict(
        gpu_kind=kind,
        gpu_count=1,
        model_id="m",
        serve_args=["vllm", "serve", "m"],
        passed=passed,
        source="test",
        at=at,
    )


def test_the_newest_served_verdict_of_each_gpu_kind_wins_whatever_the_order_given() -> None:
    old = _served(H200, False, "2026-12-01T00:00:00Z")
    new = _served("nvidia  h200", True, "2026-12-02T00:00:00Z")  # the same kind, spelled apart
    cpu = _served(CPU, True, "2026-11-01T00:00:00Z")
    assert newest_per_kind([new, cpu, old]) == [new, cpu]
    assert newest_per_kind([old, cpu, new]) == [new, cpu]
    assert Verdicts(served=[new, old]).served == [new], "one per kind, even as read"


def test_merge_takes_the_newest_static_verdict_and_keeps_served_verdicts_of_other_kinds() -> None:
    tested = Verdicts(static="passed", unserved="no NVIDIA GPU")
    deployed = Verdicts(served=[_served(H200, True, "2026-12-02T00:00:00Z")])  # smoke --url
    retested = Verdicts(static="failed", served=[_served(CPU, True, "2026-12-03T00:00:00Z")])
    merged = merge([tested, deployed])
    assert (merged.static, merged.unserved, len(merged.served)) == ("passed", "no NVIDIA GPU", 1)
    assert merge([Verdicts(unserved="no GPU"), deployed]).unserved == "no GPU"
    again = merge([tested, deployed, retested])
    assert again.static == "failed" and again.unserved is None
    assert [v.gpu_kind for v in again.served] == [H200, CPU]


def test_push_needs_the_static_checks_a_failed_gpu_smoke_does_not_hold_it_back() -> None:
    """docs/evidence.md: static is what push needs; a failed smoke is a served failure."""
    record = Record(stack="s", content_hash="a" * 64, static="passed")
    record.add_served(_served(H200, False, "2026-12-01T00:00:00Z"))
    require_tested(record, "s", "refusing to push", hint="test it")  # no error
    assert record.tests == "failed", "the one-word summary still says a smoke failed"
    record.static = "failed"
    with pytest.raises(StackError, match="static checks of s have failed; refusing to push"):
        require_tested(record, "s", "refusing to push", hint="test it")


def test_a_test_report_gives_the_record_the_same_verdicts(tmp_path: Path) -> None:
    report = reports.TestReport(stack="s", content_hash="a" * 64, image="i")
    report.checks = [
        reports.CheckResult("flags", True),
        reports.CheckResult("gpu", False, skipped=True),
    ]
    report.smoke_skipped = "no NVIDIA GPU"
    record = Record(stack="s", content_hash="a" * 64)
    record.take(report.verdicts(None))
    save_record(tmp_path, record)
    again = load_record(tmp_path, "s", "a" * 64)
    assert again.verdicts() == Verdicts(static="passed", unserved="no NVIDIA GPU")
    report.smoke = {"passed": False}
    record.take(report.verdicts(_served(H200, False, "2026-12-01T00:00:00Z")))
    assert record.unserved is None and record.served_on("nvidia h200") is not None
    assert not report.passed and report.static_passed, "test fails; push may go ahead"


def test_the_verdict_document_is_a_verdicts_and_reads_back_as_one() -> None:
    record = Record(stack="s", content_hash="a" * 64, static="passed", unserved="no GPU")
    record.add_served(_served(CPU, True, "2026-12-01T00:00:00Z"))
    written = verdict_document("sha256:" + "b" * 64, "r/x", record, None, False)
    assert written["schema"].endswith("/verdict/v1") and written["tests"] == "passed"
    document = VerdictDocument.model_validate(written)
    assert document.verdicts() == record.verdicts()
    # A document of an older sm120-stacks (no `unserved`, `tests` beside static) still reads.
    older = {k: v for k, v in written.items() if k != "unserved"}
    assert VerdictDocument.model_validate(older).static == "passed"
    with pytest.raises(ValueError, match="served"):
        VerdictDocument.model_validate({**written, "served": [{"gpu_kind": "x"}]})


def test_a_record_copied_with_only_its_served_verdict_documents_only_that() -> None:
    """evidence/attach.py's attach_served copies the record with served=[verdict], static=None:
    the document it writes must not carry the record's static verdict."""
    record = Record(stack="s", content_hash="a" * 64, static="passed")
    one = record.model_copy(update={"served": [_served(H200, True, "1")], "static": None})
    written = verdict_document("sha256:" + "b" * 64, "r/x", cast(Any, one), None, False)
    assert written["static"] is None and len(written["served"]) == 1
