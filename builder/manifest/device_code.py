"""Which libraries `test` reads for device code, and what a library without machine code for a
stack's GPUs means: knowledge/device_code.yaml, its schema and loader.

Field knowledge like the other knowledge files (manifest/); the scan that uses it is
verify/device_code.py.
"""

from __future__ import annotations

from functools import cache

from pydantic import Field

from builder.knowledge.archflags import arch_table
from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict
from builder.manifest.resolve import ResolvedStack

KNOWLEDGE_FILE = "device_code.yaml"


class Scan(Strict):
    roots: list[str] = Field(min_length=1)
    patterns: list[str] = Field(min_length=1)
    budget_s: float = Field(gt=0, le=3600)


class DeviceCodeKnowledge(Strict):
    kind: str
    title: str
    notes: str = ""
    evidence: list[str] = Field(default_factory=list)
    scan: Scan
    #: Library path under site-packages -> why a finding there matters.
    known: dict[str, str] = Field(default_factory=dict)


@cache
def device_code_knowledge() -> DeviceCodeKnowledge:
    """knowledge/device_code.yaml, checked (read once per process)."""
    return parse_document(read_knowledge(KNOWLEDGE_FILE), DeviceCodeKnowledge)


def gpu_targets(stack: ResolvedStack) -> dict[str, list[int]]:
    """The stack's GPUs as machine code names them, with their capability: sm120 -> sm_120:
    [12, 0] (knowledge/arch.yaml); a GPU the arch table lacks is refused when the manifest is
    read, so every one is here."""
    table = arch_table().gpus
    targets = {}
    for gpu in stack.manifest.gpus:
        major, minor = (int(part) for part in table[gpu].capability.split("."))
        targets[f"sm_{major}{minor}"] = [major, minor]
    return targets
