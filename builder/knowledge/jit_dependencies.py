"""FlashInfer's JIT closure beyond torch's (knowledge/jit_dependencies.yaml): the packages its
kernels import when they compile, which the image's jit-deps stage installs."""

from __future__ import annotations

from functools import cache
from typing import Annotated

from pydantic import StringConstraints

from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict


class _JitDependencies(Strict):
    packages: list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")]]


@cache
def jit_dependency_names() -> frozenset[str]:
    """FlashInfer's JIT closure beyond torch's, by PEP 503 name (the knowledge file)."""
    doc = read_knowledge("jit_dependencies.yaml")
    return frozenset(parse_document(doc, _JitDependencies).packages)
