"""Load the field-knowledge files in knowledge/ (arch table, CUDA facts, rules, JIT presets).

They are data so that a new GPU, rule or preset is a reviewed YAML change, not a code change.
Each file goes through the same strict reader as manifests, so a typo there is reported with a
file and line too.
"""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from builder import REPO_ROOT
from builder.errors import StackError
from builder.knowledge.yamlsafe import YamlDocument, dotted, load_yaml

KNOWLEDGE_DIR = REPO_ROOT / "knowledge"

Model = TypeVar("Model", bound=BaseModel)


@cache
def read_knowledge(name: str) -> YamlDocument:
    return load_yaml(KNOWLEDGE_DIR / name)


def parse_document(doc: YamlDocument, model: type[Model], data: Any = None) -> Model:
    """Validate data (default: the whole document) against model, errors pointing into doc."""
    try:
        return model.model_validate(doc.data if data is None else data)
    except ValidationError as exc:
        raise validation_error(exc, [doc]) from None


def validation_error(exc: ValidationError, docs: list[YamlDocument]) -> StackError:
    """The first pydantic error as a StackError at the file and line that set the value.

    docs is ordered child first: with `extends`, the value may come from a parent file.
    """
    first = exc.errors()[0]
    key_path = tuple(
        part
        for part in first["loc"]
        if not (isinstance(part, str) and part.startswith("["))
        and not (isinstance(part, str) and "[" in part and "]" in part)
    )
    doc, line = locate(key_path, docs)
    message = first["msg"]
    hint: str | None
    if first["type"] == "extra_forbidden":
        message = "unknown key"
        hint = "check the spelling against `sm120-stacks schema`"
    elif first["type"] == "missing":
        hint = "add this key"
    else:
        value = first.get("input")
        hint = f"got {value!r}" if isinstance(value, str | int | float | bool) else None
    return StackError(message, file=doc.path, key=dotted(key_path), line=line, hint=hint)


def locate(key_path: tuple[Any, ...], docs: list[YamlDocument]) -> tuple[YamlDocument, int | None]:
    for doc in docs:
        if key_path in doc.lines:
            return doc, doc.lines[key_path]
    for end in range(len(key_path) - 1, -1, -1):
        for doc in docs:
            if key_path[:end] in doc.lines:
                return doc, doc.lines[key_path[:end]]
    return docs[0], None


class ManifestKeyError(Exception):
    """What is wrong with the manifest's value at key_path, said where the value is judged.

    The checks of manifest/ read the typed manifest, not its YAML: they raise this, and resolve()
    places it once, at the file and line that spell the key (error_at), so the YAML documents are
    not handed through every check for the sake of its error messages.
    """

    def __init__(
        self, key_path: tuple[str | int, ...], message: str, hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.key_path, self.message, self.hint = key_path, message, hint


def error_at(
    docs: list[YamlDocument],
    key_path: tuple[str | int, ...],
    message: str,
    hint: str | None = None,
) -> StackError:
    """An error at the manifest (child first) that spells out key_path, with its line."""
    doc, line = locate(key_path, docs)
    return StackError(message, file=doc.path, key=dotted(key_path), line=line, hint=hint)
