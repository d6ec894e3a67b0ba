"""What happened to each content hash of a stack: built, tested, pushed.

A small JSON file per (stack, content hash) under build/STACK/records/, written atomically, so
`list`, `push` (refuses untested images) and `pin` (refuses unpushed ones) agree on the facts.
Each file says its schema version; one that does not validate is an error naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, ValidationError

from builder.errors import StackError
from builder.files import write_atomic
from builder.image.names import HASH_CHARS
from builder.spec import imageref
from builder.spec.manifest import Sha256, Slug
from builder.spec.strict import Strict

#: repo@sha256:...: what `pin` copies into a pin; a hand-edited record is refused on reading.
PushedRef = Annotated[str, StringConstraints(pattern=imageref.PINNED)]

#: Records written before the field existed have schema 1's fields and are read as schema 1.
RECORD_SCHEMA: Literal[1] = 1
#: The GPU kind of a server without a GPU (a CPU stack's smoke).
CPU = "cpu"


def gpu_kind_key(kind: str) -> str:
    """GPU kinds compare as nvidia-smi names them, case and spacing aside."""
    return " ".join(kind.lower().split())


class ServedVerdict(Strict):
    """The image served its own serve command and was judged: on what, with what, how well.

    One per GPU kind the image served on: a host of that kind may be pinned to it. From
    `test` (the tool started the server) or `smoke --url --record` (a deployed host's server).
    """

    #: The GPU's product name as nvidia-smi prints it (e.g. "NVIDIA RTX PRO 6000 Blackwell
    #: Server Edition"), or "cpu".
    gpu_kind: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    gpu_count: int = Field(ge=0)
    #: Compute capability ("12.0"); None for cpu or where it could not be read.
    capability: str | None = None
    #: Streaming multiprocessors; None: not read (nvidia-smi does not print it).
    sm_count: int | None = None
    driver: str | None = None
    #: The CUDA version of the image (its stack's); the driver's own is implied by `driver`.
    cuda: str | None = None
    model_id: str
    model_revision: str | None = None
    serve_args: list[str]
    #: Runtime compiles the server's log showed, per kind (knowledge/runtime_compiles.yaml).
    compiles: dict[str, int] = Field(default_factory=dict)
    ttft_s: float | None = None
    single_stream_tok_s: float | None = None
    batched_tok_s: float | None = None
    passed: bool
    source: Literal["test", "smoke --url"]
    at: str

    def on(self, kind: str) -> bool:
        return gpu_kind_key(self.gpu_kind) == gpu_kind_key(kind)


class Record(Strict):
    #: Changed by the steps that record what they did (build, test, push); every change checked.
    model_config = ConfigDict(frozen=False, validate_assignment=True)

    schema_version: Literal[1] = RECORD_SCHEMA
    stack: Slug
    content_hash: Sha256
    image_id: str | None = None
    #: "passed" / "failed" / None (never tested), and where the report is.
    tests: Literal["passed", "failed"] | None = None
    report: str | None = None
    #: The smoke prompt's part of that verdict: "passed", "failed", or "skipped: why" (no GPU
    #: here); a static pass with a skipped GPU smoke is still a pass, but says so.
    smoke: str | None = None
    #: The static verdict alone (image checks, locked set, JIT table): what `push` needs.
    static: Literal["passed", "failed"] | None = None
    #: Each served verdict, one per GPU kind (the last one judged on that kind).
    served: list[ServedVerdict] = Field(default_factory=list)
    #: registry repository -> pushed digest (repo@sha256:...).
    pushed: dict[str, PushedRef] = Field(default_factory=dict)

    def attach_image(self, image_id: str) -> None:
        """A rebuild of the same content hash (a moved base, --no-cache) or a pull can give a
        different image: what was tested or pushed was the old one, so that is forgotten."""
        if self.image_id is not None and self.image_id != image_id:
            self.tests = None
            self.report = None
            self.smoke = None
            self.static = None
            self.served = []
            self.pushed = {}
        self.image_id = image_id

    def add_served(self, verdict: ServedVerdict) -> None:
        """The newest verdict on a GPU kind replaces the one before it."""
        self.served = [v for v in self.served if not v.on(verdict.gpu_kind)] + [verdict]

    def served_on(self, kind: str) -> ServedVerdict | None:
        return next((v for v in self.served if v.on(kind)), None)

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
    version = data.get("schema_version", RECORD_SCHEMA) if isinstance(data, dict) else None
    if version is not None and not (type(version) is int and version == RECORD_SCHEMA):
        raise StackError(
            f"schema_version {version!r}: this sm120-stacks reads records of schema "
            f"{RECORD_SCHEMA}",
            file=path,
            key="schema_version",
            hint=again,
        )
    try:
        record = Record.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        unknown = first["type"] == "extra_forbidden"
        raise StackError(
            "unknown key" if unknown else first["msg"],
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
    """The one gate push and pin share: only an image whose tests passed goes further."""
    if record.tests != "passed":
        state = "failed" if record.tests == "failed" else "not been run"
        raise StackError(f"the tests of {ref} have {state}; {action}", hint=hint)
