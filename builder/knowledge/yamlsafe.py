"""Strict YAML reading for manifests: mappings, lists and scalars, with the line of every key.

PyYAML's own loader accepts duplicate keys (last wins), expands aliases (the "billion laughs"
bomb) and reports no lines once data is built. Manifests pin production images, so each of those
is refused here with the file and line, and the line map lets later validation errors point back
to the exact place in the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from builder.errors import StackError

MAX_BYTES = 1_000_000
MAX_DEPTH = 40

KeyPath = tuple[str | int, ...]
STR_TAG = "tag:yaml.org,2002:str"


@dataclass
class YamlDocument:
    """A parsed manifest: plain data plus the line (1-based) where each key path starts."""

    path: Path
    data: dict[str, Any]
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, key_path: KeyPath) -> int | None:
        """The line of the deepest prefix of key_path that the file spells out."""
        for end in range(len(key_path), -1, -1):
            line = self.lines.get(key_path[:end])
            if line is not None:
                return line
        return None


class _NoAliasLoader(yaml.SafeLoader):
    """A SafeLoader whose composer refuses aliases rather than share (and later expand) nodes."""

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise _YamlRefusal(
                "YAML aliases (*name) are not allowed in manifests",
                event.start_mark.line + 1,
                "use `extends: <stack>` to share settings between stacks",
            )
        return super().compose_node(parent, index)


class _YamlRefusal(Exception):
    def __init__(self, message: str, line: int, hint: str | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.hint = hint


#: libyaml's composer, when PyYAML was built with it: about ten times faster than the pure-Python
#: one, which every command paid for reading knowledge/ (0.3 s of a no-op build).
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", None)


def _compose(text: str) -> Node | None:
    """Compose with libyaml; a document it cannot take as is (an error, or an alias: libyaml
    shares the node) is composed again by the strict loader, which names the problem and line."""
    if _FAST_LOADER is not None:
        try:
            node: Node | None = yaml.compose(text, Loader=_FAST_LOADER)
        except (yaml.YAMLError, RecursionError):
            pass
        else:
            return node
    return yaml.compose(text, Loader=_NoAliasLoader)


def load_yaml(path: Path) -> YamlDocument:
    """Read one manifest file; any problem becomes a StackError naming the file and line."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise StackError(f"cannot read file: {exc.strerror}", file=path) from None
    if len(raw) > MAX_BYTES:
        raise StackError(f"file is larger than {MAX_BYTES} bytes", file=path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StackError(
            f"not valid UTF-8 (byte {exc.start})",
            file=path,
            line=raw[: exc.start].count(b"\n") + 1,
            hint="save the file as UTF-8",
        ) from None
    try:
        node = _compose(text)
    except _YamlRefusal as exc:
        raise StackError(str(exc), file=path, line=exc.line, hint=exc.hint) from None
    except RecursionError:
        # PyYAML's composer recurses per level before _build can count them.
        raise StackError(
            f"nesting deeper than {MAX_DEPTH} levels", file=path, hint="flatten the manifest"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        raise StackError(
            f"YAML syntax error: {problem}",
            file=path,
            line=mark.line + 1 if mark is not None else None,
        ) from None
    except yaml.YAMLError as exc:
        raise StackError(f"YAML error: {exc}", file=path) from None
    if node is None:
        raise StackError("the file is empty", file=path, hint="a manifest is a YAML mapping")
    document = YamlDocument(path=path, data={})
    try:
        data = _Builder(document).build(node, (), depth=0)
    except _SharedNode:
        # libyaml composed an alias into a shared node: the strict composer names it and its line.
        try:
            yaml.compose(text, Loader=_NoAliasLoader)
        except _YamlRefusal as exc:
            raise StackError(str(exc), file=path, line=exc.line, hint=exc.hint) from None
        raise StackError("YAML aliases (*name) are not allowed in manifests", file=path) from None
    if not isinstance(data, dict):
        raise StackError("the top level must be a mapping of keys", file=path, line=1)
    document.data = data
    return document


class _SharedNode(Exception):
    """One node reached twice: the mark an alias leaves in a tree libyaml composed."""


class _Builder:
    """Plain data from a composed tree, recording lines; one scalar constructor per document
    (a SafeLoader per scalar was 70% of reading a lock file)."""

    def __init__(self, doc: YamlDocument) -> None:
        self.doc = doc
        self.constructor = yaml.SafeLoader("")
        self.seen: set[int] = set()

    def build(self, node: Node, key_path: KeyPath, depth: int) -> Any:
        doc = self.doc
        if depth > MAX_DEPTH:
            raise StackError(
                f"nesting deeper than {MAX_DEPTH} levels",
                file=doc.path,
                key=_dotted(key_path),
                line=node.start_mark.line + 1,
            )
        doc.lines.setdefault(key_path, node.start_mark.line + 1)
        if id(node) in self.seen:
            raise _SharedNode
        self.seen.add(id(node))
        if isinstance(node, MappingNode):
            return self._mapping(node, key_path, depth)
        if isinstance(node, SequenceNode):
            return [
                self.build(item, (*key_path, i), depth + 1) for i, item in enumerate(node.value)
            ]
        assert isinstance(node, ScalarNode)
        if node.tag == STR_TAG:
            return node.value  # most scalars; what the constructor would return, without it
        try:
            return self.constructor.construct_object(node)
        except yaml.YAMLError as exc:
            raise StackError(
                f"invalid value: {exc}",
                file=doc.path,
                key=_dotted(key_path),
                line=node.start_mark.line + 1,
            ) from None

    def _mapping(self, node: MappingNode, key_path: KeyPath, depth: int) -> dict[str, Any]:
        doc = self.doc
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                raise StackError(
                    "keys must be plain strings (no merge keys or complex keys)",
                    file=doc.path,
                    key=_dotted(key_path),
                    line=line,
                )
            key = str(key_node.value)
            if key in result:
                raise StackError(
                    f"duplicate key {key!r}",
                    file=doc.path,
                    key=_dotted((*key_path, key)),
                    line=line,
                    hint="each key may appear once per mapping; remove one",
                )
            doc.lines[(*key_path, key)] = line
            result[key] = self.build(value_node, (*key_path, key), depth + 1)
        return result


def _dotted(key_path: KeyPath) -> str:
    out = ""
    for part in key_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "(top level)"


dotted = _dotted
