"""What a report page shows, read from the files `test` and `push` left: the record of each
tested content hash (build/STACK/records/), its test report (build/STACK/reports/), the smoke's
and the soak's reports named in it, and the evidence the registry holds for a pushed image.

Everything a page shows comes from those files as they are; what they do not say is shown as
"unknown" or "not run", never as a zero.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from builder.errors import EngineError, StackError
from builder.evidence.reader import read_evidence
from builder.image.names import HASH_CHARS, REPOSITORY
from builder.image.records import Record, load_record
from builder.image.registry import Registry
from builder.knowledge.runtime_compiles import compile_kinds


@dataclass
class Evidence:
    """One registry's evidence of the image, or why it could not be read."""

    ref: str
    found_by: str | None = None
    artifacts: list[tuple[str, str]] = field(default_factory=list)
    sbom: dict[str, int] | None = None
    provenance: dict[str, Any] | None = None
    problem: str | None = None


@dataclass
class Tested:
    """One tested image: its record, its test report and what hangs off them."""

    record: Record
    report_path: Path
    report: dict[str, Any]
    #: The soak's CSV rows (strings, as csv reads them) and summary; None: no soak ran.
    soak_rows: list[dict[str, str]] | None = None
    soak_csv: Path | None = None
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def smoke(self) -> dict[str, Any] | None:
        smoke = self.report.get("smoke")
        return smoke if isinstance(smoke, dict) else None

    @property
    def soak(self) -> dict[str, Any] | None:
        soak = (self.smoke or {}).get("soak")
        return soak if isinstance(soak, dict) else None

    def compiles(self) -> list[dict[str, Any]] | None:
        """Every kind of runtime compile the knowledge names, found in the log or not; None
        when no server log was judged."""
        found = (self.smoke or {}).get("runtime_compiles")
        if not isinstance(found, dict):
            return None
        kinds = {item["kind"]: item for item in found.get("kinds", [])}
        none = {"compiles": 0, "loads": 0, "names": [], "failing": False, "total_seconds": None}
        return [
            {**none, **kinds.get(kind, {}), "kind": kind, "title": entry.title}
            for kind, entry in compile_kinds().items()
        ]


def find_tested(build_dir: Path, stack: str) -> list[Tested]:
    """Every content hash of stack with a test report, newest first. StackError (exit 2) when
    the stack was never built here or none of its images was tested."""
    records_dir = build_dir / stack / "records"
    hashes = sorted(records_dir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    found = []
    for path in hashes:
        data = _json(path)
        content_hash = data.get("content_hash") if isinstance(data, dict) else None
        if not isinstance(content_hash, str) or content_hash[:HASH_CHARS] != path.stem:
            raise StackError(
                "not a record of this stack (no content_hash naming its file)",
                file=path,
                key="content_hash",
                hint=f"delete it and run `sm120-stacks test {stack}` again",
            )
        record = load_record(build_dir, stack, content_hash)
        if record.tests is None or record.report is None:
            continue
        report_path = Path(record.report)
        if not report_path.is_file():
            raise StackError(
                f"the record names a test report that is not there ({report_path})",
                file=path,
                key="report",
                hint=f"run `sm120-stacks test {stack}` again to write it",
            )
        report = _json(report_path)
        if not isinstance(report, dict) or report.get("content_hash") != content_hash:
            raise StackError(
                f"the test report is not of content hash {content_hash[:HASH_CHARS]}",
                file=report_path,
                key="content_hash",
                hint=f"run `sm120-stacks test {stack}` again",
            )
        found.append(Tested(record, report_path, report))
    if not found:
        where = build_dir / stack
        state = "has no image tested" if hashes else "was never built or tested"
        raise StackError(
            f"{stack} {state} in {where}: there is nothing to report",
            hint=f"sm120-stacks build {stack} && sm120-stacks test {stack} (or give the "
            "--build-dir the test wrote to)",
        )
    for tested in found:
        _add_soak(tested)
    return found


def add_evidence(tested: Tested, stack: str) -> None:
    """The evidence each registry the image was pushed to holds (checked as `pull` checks it),
    or why it could not be read there."""
    for repository, ref in sorted(tested.record.pushed.items()):
        entry = Evidence(ref)
        tested.evidence.append(entry)
        try:
            registry = Registry.parse(repository.removesuffix(f"/{REPOSITORY}"))
            found = read_evidence(registry, stack, tested.record.content_hash)
        except (StackError, EngineError, requests.RequestException, OSError) as exc:
            entry.problem = " ".join(str(exc).split())[:300]
            continue
        entry.found_by = found.found_by
        entry.artifacts = [
            (a.annotation("dev.sm120-stacks.kind") or a.artifact_type or "?", a.digest)
            for a in found.artifacts
        ]
        entry.sbom = found.sbom
        entry.provenance = _provenance(found.provenance) if found.provenance else None


def _provenance(statement: dict[str, Any]) -> dict[str, Any]:
    """What a person asks of a provenance statement: who built it where, from which commit."""
    definition = statement.get("predicate", {}).get("buildDefinition", {})
    internal = definition.get("internalParameters", {})
    commits = [
        d["digest"]["gitCommit"]
        for d in definition.get("resolvedDependencies", [])
        if "gitCommit" in d.get("digest", {})
    ]
    return {
        "build_client": internal.get("build_client") or "unknown",
        "engine": internal.get("engine") or "unknown",
        "commit": commits[0] if commits else "unknown",
        "files": len(definition.get("externalParameters", {}).get("files", {})),
    }


def _add_soak(tested: Tested) -> None:
    soak = tested.soak
    if soak is None:
        return
    csv_path = Path(str((soak.get("files") or {}).get("csv", "")))
    if csv_path.is_file():
        with csv_path.open(newline="") as handle:
            tested.soak_rows = list(csv.DictReader(handle))
        tested.soak_csv = csv_path


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise StackError(f"not valid JSON: {exc.msg}", file=path, line=exc.lineno) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StackError(f"cannot read it: {exc}", file=path) from None
