"""`check`: a stack resolves, its patches verify and no compatibility rule fires."""

from __future__ import annotations

from dataclasses import dataclass

from builder.errors import StackError
from builder.resolve import ResolvedStack, rule_facts
from builder.rules import Violation, evaluate
from builder.yamlsafe import load_yaml


@dataclass(frozen=True)
class CheckResult:
    stack: ResolvedStack
    violations: list[Violation]

    @property
    def ok(self) -> bool:
        return not self.violations


def check_stack(stack: ResolvedStack) -> CheckResult:
    return CheckResult(stack=stack, violations=evaluate(rule_facts(stack)))


def violation_error(result: CheckResult) -> StackError:
    """The first violation as a StackError pointing at the manifest key the rule names."""
    violation = result.violations[0]
    key_path = tuple(violation.rule.key.split("."))
    source = result.stack.sources[0]
    for path in result.stack.sources:
        if key_path in load_yaml(path).lines:
            source = path
            break
    line = load_yaml(source).line_of(key_path)
    rest = len(result.violations) - 1
    more = f" (and {rest} more rule(s))" if rest else ""
    return StackError(
        f"known-bad combination{more}: {violation.describe()}",
        file=source,
        key=violation.rule.key,
        line=line,
    )
