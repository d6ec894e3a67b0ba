"""Which rules concern a stack, and which a package move would retire.

Rules read the stack's facts with its lock's versions where it has a current lock (what `check`
sees), so a rule on an unpinned package (nvidia-nvvm beside a pinned nvcc) counts too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from builder.lock.reading import locked_versions
from builder.manifest.resolve import ResolvedStack, rule_facts
from builder.manifest.rules import Rule, evaluate, load_rules, retired_by

#: Fact paths a stack sets to mitigate a bug without changing versions (VLLM_USE_FLASHINFER_
#: SAMPLER=0): a rule kept quiet only by them still concerns the stack.
MITIGATIONS = ("env.", "image_env.")


@dataclass(frozen=True)
class StackRules:
    facts: dict[str, Any]
    #: Rules that fire on the stack as it is (a stack that passes `check` has none).
    firing: tuple[Rule, ...]
    #: Rules with `affects` that hold for the stack's pins but do not fire because the stack
    #: carries their mitigation (a setting under env).
    quiet: tuple[Rule, ...]

    @property
    def all(self) -> tuple[Rule, ...]:
        return self.firing + self.quiet


def facts(stack: ResolvedStack, locked: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The rules' facts; locked: the lock's versions (default: the stack's current lock)."""
    return rule_facts(stack, locked if locked is not None else locked_versions(stack))


def firing(stack: ResolvedStack, locked: Mapping[str, str] | None = None) -> list[str]:
    return [violation.rule.id for violation in evaluate(facts(stack, locked))]


def stack_rules(stack: ResolvedStack) -> StackRules:
    known = facts(stack)
    fired = tuple(violation.rule for violation in evaluate(known))
    quiet = tuple(
        rule
        for rule in load_rules()
        if rule not in fired and rule.affects is not None and evaluate(known, (unmitigated(rule),))
    )
    return StackRules(known, fired, quiet)


def unmitigated(rule: Rule) -> Rule:
    """The rule without its conditions on settings a stack mitigates with."""
    when = {k: v for k, v in rule.when.items() if not k.startswith(MITIGATIONS)}
    return rule.model_copy(update={"when": when})


def mitigations(rule: Rule) -> list[str]:
    """The settings (env.X) the rule's conditions read."""
    return ["env." + key.split(".", 1)[1] for key in rule.when if key.startswith(MITIGATIONS)]


def retired(rules: StackRules, package: str, version: str) -> list[str]:
    """The ids of the stack's rules that the package at version retires: its version is at or
    past the rule's fixed_in, or (for a rule that fires now) the rule no longer holds."""
    moved = {**rules.facts, f"pins.{package}": version}
    return [
        rule.id
        for rule in rules.all
        if retired_by(rule, package, version)
        or (rule in rules.firing and not evaluate(moved, (rule,)))
    ]
