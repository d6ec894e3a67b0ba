"""`check`: a stack resolves, its patches verify and no compatibility rule fires."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from builder.errors import StackError
from builder.knowledge.loader import locate
from builder.knowledge.yamlsafe import load_yaml
from builder.manifest.resolve import ResolvedStack, rule_facts
from builder.manifest.rules import Violation, evaluate


@dataclass(frozen=True)
class CheckResult:
    stack: ResolvedStack
    violations: list[Violation]

    @property
    def ok(self) -> bool:
        return not self.violations


def check_stack(stack: ResolvedStack, locked: Mapping[str, str] | None = None) -> CheckResult:
    """Every rule against the stack; with its lock's versions (name -> version), rules on an
    unpinned package (nvidia-nvvm beside a pinned nvcc) see what the image installs."""
    return CheckResult(stack=stack, violations=evaluate(rule_facts(stack, locked)))


def violation_error(result: CheckResult) -> StackError:
    """The first violation as a StackError pointing at the manifest key the rule names."""
    violation = result.violations[0]
    docs = [load_yaml(path) for path in result.stack.sources]
    source, line = locate(tuple(violation.rule.key.split(".")), docs)
    rest = len(result.violations) - 1
    more = f" (and {rest} more rule(s))" if rest else ""
    return StackError(
        f"known-bad combination{more}: {violation.describe()}",
        file=source.path,
        key=violation.rule.key,
        line=line,
    )
