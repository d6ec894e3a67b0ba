"""A stack's manifest files: its own and each parent it `extends`, read and merged.

The chain is read child first (cycles, missing parents and a chain deeper than
MAX_EXTENDS_DEPTH are errors at the `extends` key that caused them), and merged parent first:
maps merge, lists replace, the child wins. resolve.py validates what this returns; the files
are kept so that an error found later is placed at the file and line that spell its key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from builder.errors import StackError
from builder.knowledge.yamlsafe import YamlDocument, load_yaml

STACK_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
MAX_EXTENDS_DEPTH = 32


def load_chain(name: str, stacks_dir: Path) -> list[YamlDocument]:
    """The stack's document and its ancestors, child first; cycles and gaps are errors."""
    chain: list[YamlDocument] = []
    seen: list[str] = []
    current: str | None = name
    child: YamlDocument | None = None
    while current is not None:
        path = stacks_dir / f"{current}.yaml"
        if current in seen:
            cycle = " -> ".join([*seen, current])
            raise StackError(
                f"extends cycle: {cycle}",
                file=chain[-1].path,
                key="extends",
                line=chain[-1].lines.get(("extends",)),
                hint="remove `extends` from one of these stacks",
            )
        if not STACK_NAME.match(current) or not path.is_file():
            if child is None:
                raise StackError(
                    f"no stack named {current!r} in {stacks_dir}",
                    hint="`sm120-stacks list` shows the stacks",
                )
            raise StackError(
                f"parent stack {current!r} does not exist",
                file=child.path,
                key="extends",
                line=child.lines.get(("extends",)),
                hint=f"create {path} or fix the name",
            )
        if len(seen) >= MAX_EXTENDS_DEPTH:
            raise StackError(f"extends chain deeper than {MAX_EXTENDS_DEPTH}", file=path)
        doc = load_yaml(path)
        chain.append(doc)
        seen.append(current)
        parent = doc.data.get("extends")
        if parent is not None and not isinstance(parent, str):
            raise StackError(
                "extends must be a stack name",
                file=path,
                key="extends",
                line=doc.lines.get(("extends",)),
            )
        current, child = parent, doc
    return chain


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Maps merge recursively, everything else (lists included) is replaced by the child."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
