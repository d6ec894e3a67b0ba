"""What `test` found: the static checks, the JIT-cache table and the smoke, as one JSON report.

Plain data apart from the code that fills it, so the pytest plugin (run_checks.py) and the
validator share it without importing each other. Its verdicts are image/verdicts.py's
`Verdicts` (`TestReport.verdicts`), the type the record and the registry's document keep.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from builder.image.verdicts import ServedVerdict, Verdicts


@dataclass
class CheckResult:
    name: str
    passed: bool
    skipped: bool = False
    detail: str = ""


#: What a JIT-table row is: a module the image precompiled (status hit, stale, miss,
#: wrong-arch), a kernel family the manifest says is not precompiled (status not-precompiled),
#: one kernel the GPU smoke found in the server's disk cache (status hit, miss, removed), or a
#: library without machine code for a GPU of the stack (verify/device_code.py: status
#: driver-jit, no-code; not-scanned where its scan did not finish).
ROW_KINDS = ("module", "not-precompiled", "cached-kernel", "driver-jit")


@dataclass
class CacheRow:
    module: str
    archs: list[str]
    bytes: int
    status: str
    detail: str = ""
    kind: str = "module"
    #: A cached kernel's shape key, parsed from its file name (kind, sizes, digest).
    shape: dict[str, Any] = field(default_factory=dict)


@dataclass
class TestReport:
    stack: str
    content_hash: str
    image: str
    checks: list[CheckResult] = field(default_factory=list)
    jit_cache: list[CacheRow] = field(default_factory=list)
    smoke: dict[str, Any] | None = None
    smoke_skipped: str | None = None
    #: The image's libraries read for device code (verify/device_code.py's scan); its findings
    #: are the JIT table's driver-jit rows.
    device_code: dict[str, Any] | None = None
    path: str = ""

    @property
    def static_passed(self) -> bool:
        """The image checks, the locked set and the JIT table: what `push` needs (a failed
        smoke is a served verdict, failed, and does not hold the push back)."""
        return all(c.passed or c.skipped for c in self.checks)

    @property
    def served(self) -> str:
        """passed / failed: the image served its own command and was judged; else why not."""
        if self.smoke is None:
            return f"not served ({self.unserved})"
        return "passed" if self.smoke.get("passed") else "failed"

    @property
    def unserved(self) -> str | None:
        """Why this test served nothing; None when its smoke ran."""
        return None if self.smoke is not None else (self.smoke_skipped or "no smoke ran")

    @property
    def passed(self) -> bool:
        """`test`'s exit status: the static checks and the smoke, where one ran."""
        smoke_ok = self.smoke is None or bool(self.smoke.get("passed"))
        return self.static_passed and smoke_ok

    def verdicts(self, served: ServedVerdict | None) -> Verdicts:
        """What this test gives the record (`Record.take`): the static verdict and the served
        verdict of its smoke (verify/served.py makes it: it needs the GPU the server ran on),
        or why none."""
        return Verdicts(
            static="passed" if self.static_passed else "failed",
            served=[] if served is None else [served],
            unserved=self.unserved,
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        data["verdicts"] = {
            "static": "passed" if self.static_passed else "failed",
            "served": self.served,
        }
        return data
