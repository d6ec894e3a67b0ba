"""Compatibility rules (knowledge/rules.yaml) evaluated against a resolved stack.

The engine knows only a handful of generic operators; what is known-bad lives in the YAML, with
the error a user would otherwise hit at runtime, its evidence and the working alternative. A
rule may name the package versions it affects (`affects`): it then fires only while the stack's
version of that package is in [introduced, fixed_in), and an upgrade past fixed_in retires it.
A rule may also carry a `remedy` a machine can apply: a pin of one package at the newest release
a specifier allows, or the start switches of knowledge/serve_switches.yaml it names set as that
file says (`propose` applies either where the rule fires on the proposal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BeforeValidator, Discriminator, Tag, model_validator

from builder.knowledge.loader import error_at, parse_document, read_knowledge
from builder.knowledge.strict import Strict
from builder.knowledge.yamlsafe import YamlDocument
from builder.manifest.start_switches import switch_ids

OPERATORS = frozenset(
    {
        "eq",
        "ne",
        "in",
        "not_in",
        "contains",
        "not_contains",
        "contains_any",
        "present",
        "version",
        "differs_from",
    }
)


def _version_text(value: Any) -> Any:
    """YAML reads `13.0` as a float; a version is always text, and must parse."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str):
        try:
            Version(value)
        except InvalidVersion:
            raise ValueError(f"{value!r} is not a version") from None
    return value


VersionText = Annotated[str, BeforeValidator(_version_text)]

#: A distribution name as PEP 508 spells one.
_PACKAGE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


def _package_name(value: Any) -> Any:
    if isinstance(value, str) and not _PACKAGE.match(value):
        raise ValueError(f"{value!r} is not a package name")
    return value


def _specifier_text(value: Any) -> Any:
    """A PEP 440 specifier that parses and bounds something (an empty one allows anything)."""
    if isinstance(value, str):
        try:
            parsed = SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError(f"{value!r} is not a version specifier (PEP 440)") from None
        if not len(parsed):
            raise ValueError("an empty specifier allows every release: give a bound")
    return value


PackageName = Annotated[str, BeforeValidator(_package_name)]
SpecifierText = Annotated[str, BeforeValidator(_specifier_text)]


class Affects(Strict):
    """The versions of one package a rule applies to: [introduced, fixed_in)."""

    #: A pins.<package> name (any spelling PEP 503 normalizes to the same name).
    package: str
    #: First affected version (inclusive); absent: every version before fixed_in.
    introduced: VersionText | None = None
    #: First fixed version (exclusive upper bound); absent: no fix known.
    fixed_in: VersionText | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Affects:
        if self.introduced and self.fixed_in and Version(self.introduced) >= Version(self.fixed_in):
            raise ValueError(f"introduced {self.introduced} is not before fixed_in {self.fixed_in}")
        return self

    def describe(self) -> str:
        """The affected range: `flashinfer-python <0.6.14`, `b >=1.0 (no fix known)`."""
        bounds = ([f">={self.introduced}"] if self.introduced else []) + (
            [f"<{self.fixed_in}"] if self.fixed_in else []
        )
        text = f"{self.package} {','.join(bounds)}" if bounds else f"{self.package} (every version)"
        return text if self.fixed_in else f"{text} (no fix known)".replace(") (", "; ")


class PinRemedy(Strict):
    """What a machine can do about a rule: pin `pin` (python.packages) at the newest release on
    the stack's indexes that `newest` allows (not yanked, no pre-release), then lock again."""

    #: The package to pin; a condition of the rule must read it (pins.<package>).
    pin: PackageName
    #: A PEP 440 specifier: the pin is the newest release it allows.
    newest: SpecifierText
    #: Why that pin clears the rule, for the reviewer (propose prints it).
    why: str

    def describe(self) -> str:
        return f"pin {self.pin} at the newest release {self.newest}"


class SwitchesRemedy(Strict):
    """What a machine can do about a rule on what the server reads at start: set each start
    switch named here that the stack leaves open, as knowledge/serve_switches.yaml says (its
    variables in env, the TRT-LLM attention gate off in serve.extra_args)."""

    #: Switch ids of knowledge/serve_switches.yaml; a condition of the rule must read start.*.
    switches: list[str]
    #: Why setting them clears the rule, for the reviewer (propose prints it).
    why: str

    def describe(self) -> str:
        return f"set the start switches {', '.join(self.switches)}"


class SettingsRemedy(Strict):
    """What a machine can do about a rule on serve settings: set manifest keys (dotted paths
    under serve, e.g. serve.speculative.moe_backend) to the values given. Each key must be one a
    condition of the rule reads, so that setting it can clear the rule."""

    #: Manifest key (dotted, starting with `serve.`) -> the value to set.
    set: dict[str, Any]
    #: Why those settings clear the rule, for the reviewer (propose prints it).
    why: str

    def describe(self) -> str:
        return "set " + ", ".join(f"{k}: {v}" for k, v in self.set.items())


def _remedy_kind(value: Any) -> str:
    """A remedy that names `switches` sets them, one that names `set` sets serve settings; any
    other is a pin (whose errors then name the pin's keys). The tags are bracketed so that an
    error's key leaves them out."""
    if isinstance(value, dict):
        if "switches" in value:
            return "[switches]"
        return "[set]" if "set" in value else "[pin]"
    if isinstance(value, SwitchesRemedy):
        return "[switches]"
    return "[set]" if isinstance(value, SettingsRemedy) else "[pin]"


Remedy = Annotated[
    Annotated[PinRemedy, Tag("[pin]")]
    | Annotated[SwitchesRemedy, Tag("[switches]")]
    | Annotated[SettingsRemedy, Tag("[set]")],
    Discriminator(_remedy_kind),
]


class Rule(Strict):
    id: str
    key: str
    when: dict[str, Any]
    error: str
    evidence: list[str]
    alternative: str
    affects: Affects | None = None
    remedy: Remedy | None = None


class RuleFile(Strict):
    rules: list[Rule]


@dataclass(frozen=True)
class Violation:
    rule: Rule
    #: The stack's version of rule.affects.package, for rules with an `affects` block.
    version: str | None = None

    def describe(self) -> str:
        text = (
            f"[{self.rule.id}] {self.rule.error}\n"
            f"  evidence: {', '.join(self.rule.evidence)}\n"
            f"  instead: {self.rule.alternative}"
        )
        affects = self.rule.affects
        if affects is not None and affects.fixed_in:
            here = f" (this stack: {self.version})" if self.version else ""
            text += f"\n  fixed in: {affects.package} {affects.fixed_in}{here}"
        return text


@cache
def load_rules() -> tuple[Rule, ...]:
    return rules_of(read_knowledge("rules.yaml"))


def rules_of(doc: YamlDocument) -> tuple[Rule, ...]:
    """The rules a rules.yaml document holds, checked when read: the schema, each condition's
    operators, and each remedy against its rule (it pins a package a condition reads). A bad
    entry is a StackError naming the file, key and line."""
    rules = parse_document(doc, RuleFile).rules
    for index, rule in enumerate(rules):
        for path, condition in rule.when.items():
            if isinstance(condition, dict):
                unknown = set(condition) - OPERATORS
                if unknown:
                    raise error_at(
                        [doc],
                        ("rules", index, "when", path),
                        f"rule {rule.id}: unknown operator(s) {sorted(unknown)}",
                        hint=f"one of {', '.join(sorted(OPERATORS))}",
                    )
        if rule.remedy is not None:
            _check_remedy(doc, index, rule, rule.remedy)
    return tuple(rules)


def _check_remedy(
    doc: YamlDocument, index: int, rule: Rule, remedy: PinRemedy | SwitchesRemedy | SettingsRemedy
) -> None:
    """A remedy's pin must be a package the rule's conditions read, its switches ones
    knowledge/serve_switches.yaml records and the rule reads (start.*): anything else cannot
    change whether the rule fires."""
    if isinstance(remedy, SwitchesRemedy):
        _check_switches_remedy(doc, index, rule, remedy)
        return
    if isinstance(remedy, SettingsRemedy):
        _check_settings_remedy(doc, index, rule, remedy)
        return
    read = {normalize(path[5:]) for path in rule.when if path.startswith("pins.")}
    if normalize(remedy.pin) not in read:
        raise error_at(
            [doc],
            ("rules", index, "remedy", "pin"),
            f"rule {rule.id}: the remedy pins {remedy.pin}, which no condition of the rule reads, "
            "so the pin cannot clear it",
            hint="pin a package the rule's `when` names as pins.<package>"
            + (f" ({', '.join(sorted(read))})" if read else ""),
        )


def _check_settings_remedy(
    doc: YamlDocument, index: int, rule: Rule, remedy: SettingsRemedy
) -> None:
    """Each key the remedy sets must be a serve setting a condition of the rule reads."""
    if not remedy.set:
        raise error_at(
            [doc],
            ("rules", index, "remedy", "set"),
            f"rule {rule.id}: the remedy sets nothing",
            hint="name the serve settings it sets (serve.KEY: VALUE)",
        )
    for key in remedy.set:
        if not key.startswith("serve.") or key not in rule.when:
            raise error_at(
                [doc],
                ("rules", index, "remedy", "set", key),
                f"rule {rule.id}: the remedy sets {key}, which no condition of the rule reads "
                "(or which is not a serve setting), so setting it cannot clear it",
                hint="set a serve.* key the rule's `when` names",
            )


def _check_switches_remedy(
    doc: YamlDocument, index: int, rule: Rule, remedy: SwitchesRemedy
) -> None:
    if not any(path.startswith("start.") for path in rule.when):
        raise error_at(
            [doc],
            ("rules", index, "remedy", "switches"),
            f"rule {rule.id}: the remedy sets start switches, and no condition of the rule reads "
            "them, so setting them cannot clear it",
            hint="give the rule a start.* condition (start.open_switches, start.trtllm_gate)",
        )
    known = switch_ids()
    for position, switch in enumerate(remedy.switches):
        if switch not in known:
            raise error_at(
                [doc],
                ("rules", index, "remedy", "switches", position),
                f"rule {rule.id}: the remedy sets {switch!r}, which knowledge/serve_switches.yaml "
                "does not record",
                hint=f"one of {', '.join(sorted(known))}",
            )
    if not remedy.switches:
        raise error_at(
            [doc],
            ("rules", index, "remedy", "switches"),
            f"rule {rule.id}: the remedy sets no switch",
            hint="name the switches of knowledge/serve_switches.yaml it sets",
        )


def normalize(name: str) -> str:
    """PEP 503 name: pins may spell a package Flashinfer_Python, affects flashinfer-python."""
    return re.sub(r"[-_.]+", "-", name).lower()


def affected(rule: Rule, version: str) -> bool:
    """Whether that version of the rule's affects.package is in [introduced, fixed_in).

    A rule without `affects` has no version bounds: every version is affected. A version that
    does not parse is not.
    """
    affects = rule.affects
    if affects is None:
        return True
    try:
        v = Version(str(version))
    except InvalidVersion:
        return False
    if affects.introduced is not None and v < Version(affects.introduced):
        return False
    return affects.fixed_in is None or v < Version(affects.fixed_in)


def retired_by(rule: Rule, package: str, version: str) -> bool:
    """Whether that version of that package is at or past the rule's fixed_in: upgrading to it
    retires the rule (and any mitigation a stack carries for it)."""
    affects = rule.affects
    if affects is None or affects.fixed_in is None:
        return False
    if normalize(package) != normalize(affects.package):
        return False
    try:
        return Version(str(version)) >= Version(affects.fixed_in)
    except InvalidVersion:
        return False


def package_version(facts: dict[str, Any], package: str) -> str | None:
    """The stack's version of package in a fact table: pins.<package> under any spelling."""
    wanted = normalize(package)
    exact = facts.get(f"pins.{package}")
    if exact is not None:
        return str(exact)
    for key, value in facts.items():
        if key.startswith("pins.") and normalize(key[5:]) == wanted and value is not None:
            return str(value)
    return None


def evaluate(facts: dict[str, Any], rules: tuple[Rule, ...] | None = None) -> list[Violation]:
    """Every rule whose conditions all hold for these facts and, with `affects`, whose package
    version (pins.<package>) is in the affected range."""
    violations = []
    for rule in load_rules() if rules is None else rules:
        if not all(_holds(facts.get(path), cond, facts) for path, cond in rule.when.items()):
            continue
        if rule.affects is None:
            violations.append(Violation(rule))
            continue
        version = package_version(facts, rule.affects.package)
        if version is not None and affected(rule, version):
            violations.append(Violation(rule, version))
    return violations


def _holds(value: Any, condition: Any, facts: dict[str, Any]) -> bool:
    if not isinstance(condition, dict):
        return bool(value == condition)
    return all(_check(op, value, arg, facts) for op, arg in condition.items())


def _check(op: str, value: Any, arg: Any, facts: dict[str, Any]) -> bool:
    if op == "present":
        return (value is not None) == bool(arg)
    if op == "ne":
        return bool(value != arg)  # an absent value differs too (unset env: not "0")
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
    if op == "differs_from":
        other = facts.get(str(arg))
        return other is not None and str(value) != str(other)
    raise ValueError(f"unknown rule operator {op!r}")
