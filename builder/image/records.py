"""What happened to each content hash of a stack: built, tested, pushed.

A small JSON file per (stack, content hash) under build/STACK/records/, written atomically, so
`list`, `push` (refuses untested images) and `pin` (refuses unpushed ones) agree on the facts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.files import write_atomic
from builder.image.names import HASH_CHARS


@dataclass
class Record:
    stack: str
    content_hash: str
    image_id: str | None = None
    #: "passed" / "failed" / None (never tested), and where the report is.
    tests: str | None = None
    report: str | None = None
    #: The smoke prompt's part of that verdict: "passed", "failed", or "skipped: why" (no GPU
    #: here); a static pass with a skipped GPU smoke is still a pass, but says so.
    smoke: str | None = None
    #: registry repository -> pushed digest (repo@sha256:...).
    pushed: dict[str, str] = field(default_factory=dict)

    def attach_image(self, image_id: str) -> None:
        """A rebuild of the same content hash (a moved base, --no-cache) or a pull can give a
        different image: what was tested or pushed was the old one, so that is forgotten."""
        if self.image_id is not None and self.image_id != image_id:
            self.tests = None
            self.report = None
            self.smoke = None
            self.pushed = {}
        self.image_id = image_id

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def record_path(build_dir: Path, stack: str, content_hash: str) -> Path:
    return build_dir / stack / "records" / f"{content_hash[:HASH_CHARS]}.json"


def load_record(build_dir: Path, stack: str, content_hash: str) -> Record:
    path = record_path(build_dir, stack, content_hash)
    if not path.is_file():
        return Record(stack=stack, content_hash=content_hash)
    data = json.loads(path.read_text())
    return Record(**data)


def save_record(build_dir: Path, record: Record) -> Path:
    path = record_path(build_dir, record.stack, record.content_hash)
    write_atomic(path, json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")
    return path
