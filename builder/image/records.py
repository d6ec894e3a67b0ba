"""What happened to each content hash of a stack: built, tested, pushed.

A small JSON file per (stack, content hash) under build/STACK/records/, written atomically, so
`list`, `push` (refuses an image whose static checks did not pass) and `pin` (refuses unpushed
ones) agree on the facts. A record is a `Verdicts` (image/verdicts.py) with the image, the
report and the pushes. Each file says its schema version; one that does not validate is an
error naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from builder.engine import imageref
from builder.errors import StackError
from builder.files import write_atomic
from builder.image.names import HASH_CHARS
from builder.image.verdicts import CPU, ServedVerdict, Verdict, Verdicts, gpu_kind_key, merge
from builder.knowledge.text import Sha256, Slug

#: repo@sha256:...: what `pin` copies into a pin; a hand-edited record is refused on reading.
PushedRef = Annotated[str, StringConstraints(pattern=imageref.PINNED)]

#: Schema 2 keeps the verdicts as `Verdicts` (static, served, unserved). Schema 1 (and records
#: written before the field existed) also had `tests` and `smoke`: still read (`_schema_1`).
RECORD_SCHEMA: Literal[2] = 2
READ_SCHEMAS = (1, RECORD_SCHEMA)


class Schema1Words(BaseModel):
    """The two fields schema 1 had and schema 2 has not, checked (the rest are schema 2's)."""

    model_config = ConfigDict(extra="ignore")

    tests: Verdict | None = None
    smoke: str | None = None


def from_schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 had `tests` (static and smoke together: now `Verdicts.tests`, derived) and
    `smoke` ("passed" or "failed", which the served verdict says, or "skipped: why", now
    `unserved`). Records from before `static` existed passed their static checks where their
    tests passed; where they failed, which part failed is not known, so static is taken as
    failed: `push` refuses it and asks for `test` again."""
    words = Schema1Words.model_validate(data)
    tests, smoke = words.tests, words.smoke
    kept = {k: v for k, v in data.items() if k not in ("tests", "smoke")}
    if "static" not in kept and tests is not None:
        kept["static"] = tests
    if "unserved" not in kept:
        kept["unserved"] = _unserved(smoke)
    return kept | {"schema_version": RECORD_SCHEMA}


def _unserved(smoke: str | None) -> str | None:
    """Why no server ran, out of schema 1's smoke word ("skipped: no NVIDIA GPU")."""
    if smoke is None or not smoke.startswith("skipped"):
        return None
    return smoke.partition(":")[2].strip() or smoke


class Record(Verdicts):
    """What happened to one content hash here: its image, its verdicts, where it was pushed."""

    #: Changed by the steps that record what they did (build, test, push); every change checked.
    model_config = ConfigDict(frozen=False, validate_assignment=True)

    schema_version: Literal[2] = RECORD_SCHEMA
    stack: Slug
    content_hash: Sha256
    image_id: str | None = None
    #: Where the report of the test that gave the verdicts is.
    report: str | None = None
    #: registry repository -> pushed digest (repo@sha256:...).
    pushed: dict[str, PushedRef] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _schema_1(cls, data: Any) -> Any:
        """A schema-1 record, read as schema 2 (see `from_schema_1`)."""
        if not isinstance(data, dict) or data.get("schema_version", 1) != 1:
            return data
        return from_schema_1(data)

    def attach_image(self, image_id: str) -> None:
        """A rebuild of the same content hash (a moved base, --no-cache) or a pull can give a
        different image: what was tested or pushed was the old one, so that is forgotten."""
        if self.image_id is not None and self.image_id != image_id:
            self.take(Verdicts(), replace=True)
            self.report = None
            self.pushed = {}
        self.image_id = image_id

    def take(self, verdicts: Verdicts, replace: bool = False) -> None:
        """Verdicts from a test run or the registry, merged with these (verdicts.merge: the
        given static wins where it has one, the newest served verdict per GPU kind)."""
        merged = verdicts if replace else merge([self, verdicts])
        self.static, self.unserved = merged.static, merged.unserved
        self.served = merged.served

    def add_served(self, verdict: ServedVerdict) -> None:
        """One more served verdict (a test's smoke, or `smoke --url --record`)."""
        self.take(Verdicts(served=[verdict]))

    # --- schema 1's names, for callers not moved to `take` yet ----------------------------------

    @property
    def smoke(self) -> str | None:
        """Schema 1's smoke word: "skipped: why", or what the served verdicts say."""
        if self.unserved is not None:
            return f"skipped: {self.unserved}"
        if not self.served:
            return None
        return "passed" if all(v.passed for v in self.served) else "failed"

    @smoke.setter
    def smoke(self, value: str | None) -> None:
        """ "skipped: why" records why no server ran; "passed"/"failed" are the served
        verdict's word, which `add_served` records."""
        self.unserved = _unserved(value)

    @property
    def tests(self) -> Verdict | None:
        return super().tests

    @tests.setter
    def tests(self, value: Verdict | None) -> None:
        """Schema 1's word, read from static and served (`Verdicts.tests`): "passed" means the
        static checks passed, None that nothing was tested; "failed" adds nothing to what
        static and served say. Here until verify/validate.py records a test with
        `take(report.verdicts(served))`."""
        if value != "failed":
            self.static = value

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def record_path(build_dir: Path, stack: str, content_hash: str) -> Path:
    return build_dir / stack / "records" / f"{content_hash[:HASH_CHARS]}.json"


def load_record(build_dir: Path, stack: str, content_hash: str) -> Record:
    path = record_path(build_dir, stack, content_hash)
    if not path.is_file():
        return Record(stack=stack, content_hash=content_hash)
    again = (
        f"delete it and run `sm120-stacks test {stack}` to test and record the image again "
        "(then push it again)"
    )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise StackError(
            f"not valid JSON: {exc.msg}", file=path, line=exc.lineno, hint=again
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StackError(f"cannot read the record: {exc}", file=path, hint=again) from None
    version = data.get("schema_version", 1) if isinstance(data, dict) else None
    if version is not None and not (type(version) is int and version in READ_SCHEMAS):
        raise StackError(
            f"schema_version {version!r}: this sm120-stacks reads records of schema "
            f"{' and '.join(map(str, READ_SCHEMAS))}",
            file=path,
            key="schema_version",
            hint=again,
        )
    try:
        record = Record.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        unknown = first["type"] == "extra_forbidden"
        said = str(first.get("ctx", {}).get("error", first["msg"]))  # no "Value error, "
        raise StackError(
            "unknown key" if unknown else said,
            file=path,
            key=".".join(str(part) for part in first["loc"]) or None,
            hint=again,
        ) from None
    for key, value, expected in (
        ("stack", record.stack, stack),
        ("content_hash", record.content_hash, content_hash),
    ):
        if value != expected:
            raise StackError(
                f"the record is of {key} {value!r}, not {expected!r}",
                file=path,
                key=key,
                hint=again,
            )
    return record


def save_record(build_dir: Path, record: Record) -> Path:
    path = record_path(build_dir, record.stack, record.content_hash)
    write_atomic(path, json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")
    return path


def require_tested(record: Record, ref: str, action: str, hint: str) -> None:
    """The one gate push and pin share: only an image whose static checks passed goes further.

    A failed GPU smoke is a served verdict (failed) on that GPU kind: recorded, pushed with the
    evidence, and no reason to hold back the image; `pin` then needs a passing served verdict
    on the host's kind (hosts/pins.py)."""
    if record.static != "passed":
        state = "failed" if record.static == "failed" else "not been run"
        raise StackError(f"the static checks of {ref} have {state}; {action}", hint=hint)


__all__ = [
    "CPU",
    "RECORD_SCHEMA",
    "Record",
    "ServedVerdict",
    "gpu_kind_key",
    "load_record",
    "record_path",
    "require_tested",
    "save_record",
]
