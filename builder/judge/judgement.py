"""One judgement of a stack and its lock, in one written order, for every command.

The rules of knowledge/rules.yaml read `pins.<package>`, which for a package the manifest does
not pin is the version its lock installs: judging a stack needs the manifest and the lock.
Before this module, `check`, `list` and the commands that build each wrote that judgement
themselves, in two orders, so `check` said "lock stale" where `render` said a rule fired. Now
every command asks judge() and reports its first error, in this order:

1. the rules on the manifest alone (a rule firing here fires whatever the lock holds);
2. the lock's freshness (a lock made from another manifest pins nothing worth judging);
3. the rules on the lock's pins (what the image installs);
4. a base that follows its tag, unless the command allows it (--allow-floating-base).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from builder.errors import StackError
from builder.lock.locked import LockedStack, require_pinned_bases
from builder.manifest.check import CheckResult, check_stack, violation_error
from builder.manifest.resolve import ResolvedStack
from builder.manifest.rules import Violation


def rules_on_manifest(stack: ResolvedStack) -> CheckResult:
    """Step 1: every rule against the manifest alone (no lock read)."""
    return check_stack(stack)


def rules_on_pins(stack: ResolvedStack, versions: Mapping[str, str]) -> CheckResult:
    """Step 3: every rule against the manifest and the versions a lock installs (name ->
    version): the lock's, or the one `propose` just made."""
    return check_stack(stack, versions)


@dataclass(frozen=True)
class Judgement:
    """What judge() found, each step kept, so a command that shows more than the first error
    (`list`'s columns) reads the same judgement as one that stops at it."""

    locked: LockedStack
    on_manifest: CheckResult
    #: None where step 3 was not reached: no lock, a stale one, or step 1 failed.
    on_pins: CheckResult | None
    allow_floating: bool

    @property
    def violations(self) -> list[Violation]:
        """The rules that fire, from the first step where any does."""
        if self.on_manifest.violations or self.on_pins is None:
            return self.on_manifest.violations
        return self.on_pins.violations

    def errors(self) -> Iterator[StackError]:
        """Every step's error, in the written order (none: the stack may be built)."""
        if not self.on_manifest.ok:
            yield violation_error(self.on_manifest)
        if self.locked.stale is not None:
            yield self.locked.stale
        if self.on_pins is not None and not self.on_pins.ok:
            yield violation_error(self.on_pins)
        try:
            require_pinned_bases(self.locked, self.allow_floating)
        except StackError as exc:
            yield exc

    def first_error(self) -> StackError | None:
        return next(self.errors(), None)

    def passed(self) -> LockedStack:
        """The locked stack, when every step passed; else the first error, raised."""
        error = self.first_error()
        if error is not None:
            raise error
        return self.locked


def judge(locked: LockedStack, allow_floating: bool = False) -> Judgement:
    """The stack and its lock judged in the order of this module's docstring."""
    on_manifest = rules_on_manifest(locked.stack)
    on_pins = None
    if on_manifest.ok and locked.versions is not None:  # versions: None when missing or stale
        on_pins = rules_on_pins(locked.stack, locked.versions)
    return Judgement(locked, on_manifest, on_pins, allow_floating)
