"""Writing a lock file: atomically, as YAML with one hash per line (a review's diff shows what
moved), its locked_hash sealing what it pins, refused whole when over the file-size limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from builder.errors import (
    StackError,
)
from builder.files import write_atomic
from builder.knowledge.yamlsafe import MAX_BYTES
from builder.lock.lockfile import Lock

HEADER = (
    "# Written by `sm120-stacks lock {stack}`: the complete, hash-checked input set of its image.\n"
    "# Do not edit; change stacks/{stack}.yaml and lock again. Builds refuse a stale lock.\n"
)


def write_lock(path: Path, lock: Lock) -> None:
    """Atomically, as YAML with one hash per line (diffs in review show exactly what moved)."""
    lock = lock.model_copy(update={"locked_hash": lock.pinned_hash()})
    data = lock.model_dump(mode="json")
    if lock.python.versions_from is None:
        del data["python"]["versions_from"]  # locks made without a preference stay as they were
    text = HEADER.format(stack=lock.stack) + yaml.dump(
        data, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=200
    )
    if len(text.encode()) > MAX_BYTES:
        raise StackError(
            f"the lock would be {len(text.encode())} bytes, over the {MAX_BYTES}-byte file limit",
            file=path,
            hint="fewer packages or indexes with fewer wheels per release",
        )
    write_atomic(path, text)


class _NoAliasDumper(yaml.SafeDumper):
    """Equal lists must be written out each time: the strict reader refuses YAML aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
