"""Compatibility rules (knowledge/rules.yaml) evaluated against a resolved stack.

The engine knows only a handful of generic operators; what is known-bad lives in the YAML, with
the error a user would otherwise hit at runtime, its evidence and the working alternative.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict

from builder.spec.knowledge import parse_document, read_knowledge

OPERATORS = frozenset(
    {"eq", "in", "not_in", "contains", "not_contains", "contains_any", "present", "version"}
)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    key: str
    when: dict[str, Any]
    error: str
    evidence: list[str]
    alternative: str


class RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: list[Rule]


@dataclass(frozen=True)
class Violation:
    rule: Rule

    def describe(self) -> str:
        return (
            f"[{self.rule.id}] {self.rule.error}\n"
            f"  evidence: {', '.join(self.rule.evidence)}\n"
            f"  instead: {self.rule.alternative}"
        )


@cache
def load_rules() -> tuple[Rule, ...]:
    doc = read_knowledge("rules.yaml")
    rules = parse_document(doc, RuleFile).rules
    for rule in rules:
        for condition in rule.when.values():
            if isinstance(condition, dict):
                unknown = set(condition) - OPERATORS
                if unknown:
                    raise ValueError(f"rule {rule.id}: unknown operator(s) {sorted(unknown)}")
    return tuple(rules)


def evaluate(facts: dict[str, Any], rules: tuple[Rule, ...] | None = None) -> list[Violation]:
    """Every rule whose conditions all hold for these facts."""
    return [
        Violation(rule)
        for rule in (load_rules() if rules is None else rules)
        if all(_holds(facts.get(path), cond) for path, cond in rule.when.items())
    ]


def _holds(value: Any, condition: Any) -> bool:
    if not isinstance(condition, dict):
        return bool(value == condition)
    return all(_check(op, value, arg) for op, arg in condition.items())


def _check(op: str, value: Any, arg: Any) -> bool:
    if op == "present":
        return (value is not None) == bool(arg)
    if value is None:
        return False
    if op == "eq":
        return bool(value == arg)
    if op == "in":
        return value in arg
    if op == "not_in":
        return value not in arg
    if op == "contains":
        return arg in value
    if op == "not_contains":
        return arg not in value
    if op == "contains_any":
        return any(item in value for item in arg)
    if op == "version":
        try:
            return Version(str(value)) in SpecifierSet(str(arg))
        except (InvalidVersion, InvalidSpecifier):
            return False
    raise ValueError(f"unknown rule operator {op!r}")
