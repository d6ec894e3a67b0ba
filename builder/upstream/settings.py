"""A rule's switches remedy as `propose` applies it: start switches set in the proposal.

A proposal that moves a stack onto a vLLM whose start switches knowledge/serve_switches.yaml
records (0.33) inherits none of them from a parent that predates the record, so rule
serve-path-reaches-network (and trtllm-gate-follows-network, where the route reaches FlashInfer
attention) fires on it. Their remedy names the switches; this module reads what closes each open
one from the resolved proposal (start_switches.SwitchFix) and writes it into the manifest: the
variables under env, the gate's argument after the parent's serve.extra_args.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from builder.errors import StackError
from builder.manifest.resolve import ResolvedStack
from builder.manifest.rules import Rule, SettingsRemedy, SwitchesRemedy


@dataclass(frozen=True)
class AppliedSettings:
    """A rule that fired on the proposal, and what its remedy set."""

    rule: str
    #: Variables set in env (name -> value).
    env: dict[str, str]
    #: Arguments added after the parent's serve.extra_args.
    extra_args: list[str]
    why: str
    #: Serve settings set (dotted key under serve, e.g. speculative.moe_backend -> value).
    serve: dict[str, Any] = field(default_factory=dict)

    def what(self) -> str:
        return ", ".join(
            [
                *(f"env {k}={v}" for k, v in self.env.items()),
                *self.extra_args,
                *(f"serve.{k}: {v}" for k, v in self.serve.items()),
            ]
        )

    def describe(self) -> str:
        return f"rule {self.rule} fired on the proposal; its remedy sets {self.what()}: {self.why}"

    def to_json(self) -> dict[str, Any]:
        """As `propose --json` reports it; `serve` only where a `set` remedy set some."""
        data: dict[str, Any] = {
            "rule": self.rule,
            "env": self.env,
            "extra_args": self.extra_args,
            "why": self.why,
        }
        if self.serve:
            data["serve"] = self.serve
        return data


def settings_for(rule: Rule, remedy: SwitchesRemedy, stack: ResolvedStack) -> AppliedSettings:
    """What the remedy sets on this proposal: each switch it names that the stack leaves open.
    None of them open while the rule fires is an error (the remedy cannot clear it)."""
    switches = stack.start_switches
    fixes = [f for f in switches.fixes if f.switch in remedy.switches] if switches else []
    if not fixes:
        raise StackError(
            f"rule {rule.id} fires, and its remedy finds none of {', '.join(remedy.switches)} "
            f"open: {rule.error}",
            key=rule.key,
            hint=f"instead: {rule.alternative}",
        )
    env = {name: value for fix in fixes for name, value in fix.env}
    args = [arg for fix in fixes for arg in fix.args]
    return AppliedSettings(rule.id, env, args, " ".join(remedy.why.split()))


def settings_set(rule: Rule, remedy: SettingsRemedy) -> AppliedSettings:
    """What a `set` remedy writes into the proposal: its serve settings, as given."""
    serve = {key.removeprefix("serve."): value for key, value in remedy.set.items()}
    return AppliedSettings(rule.id, {}, [], " ".join(remedy.why.split()), serve)


def _serve_settings(applied: list[AppliedSettings]) -> dict[str, Any]:
    """The serve settings of every `set` remedy as one nested mapping under serve."""
    nested: dict[str, Any] = {}
    for settings in applied:
        for dotted, value in settings.serve.items():
            *parents, last = dotted.split(".")
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node.setdefault(last, value)
    return nested


def _merged(
    base: ResolvedStack, applied: list[AppliedSettings]
) -> tuple[dict[str, str], list[str]]:
    """(env to set, name -> rule; the parent's extra_args with the new ones after them)."""
    owner: dict[str, str] = {}
    args = list(base.manifest.serve.extra_args)
    for settings in applied:
        for name in settings.env:
            owner.setdefault(name, settings.rule)
        args += [arg for arg in settings.extra_args if arg not in args]
    return owner, args


def _env_values(applied: list[AppliedSettings]) -> dict[str, str]:
    values: dict[str, str] = {}
    for settings in applied:
        for name, value in settings.env.items():
            values.setdefault(name, value)
    return values


def _added_args(base: ResolvedStack, applied: list[AppliedSettings]) -> bool:
    return any(arg not in base.manifest.serve.extra_args for s in applied for arg in s.extra_args)


def _rules(applied: list[AppliedSettings]) -> str:
    """The rules whose remedies added arguments: `rule A` or `rules A, B`."""
    rules = sorted({s.rule for s in applied if s.extra_args})
    return f"rule{'s' if len(rules) > 1 else ''} {', '.join(rules)}"


def settings_lines(base: ResolvedStack, applied: list[AppliedSettings]) -> list[str]:
    """The env and serve blocks of an `extends` proposal, each setting with its rule. The
    child's extra_args replace the parent's (lists are not merged), so they are all written."""
    if not applied:
        return []
    owner, args = _merged(base, applied)
    values = _env_values(applied)
    lines: list[str] = []
    if values:
        lines.append("env:")
        for name, value in values.items():
            was = base.manifest.env.get(name)
            before = f"was {json.dumps(was)}" if was is not None else "unset in the parent"
            lines.append(
                f"  {name}: {json.dumps(value)}  # remedy of rule {owner[name]} ({before})"
            )
    serve = _serve_settings(applied)
    if _added_args(base, applied) or serve:
        lines.append("serve:")
    if _added_args(base, applied):
        lines += [
            f"  # the parent's arguments, then the remedy of {_rules(applied)}",
            f"  extra_args: {json.dumps(args)}",
        ]
    for key, value in serve.items():
        rules = sorted({s.rule for s in applied if s.serve})
        lines.append(f"  # remedy of {', '.join(rules)}")
        lines.append(f"  {key}: {json.dumps(value, sort_keys=True)}")
    return lines


def apply_settings(
    data: dict[str, Any], base: ResolvedStack, applied: list[AppliedSettings]
) -> list[str]:
    """Set them in a full copy's data; the header lines that say what was set and why."""
    if not applied:
        return []
    owner, args = _merged(base, applied)
    data["env"] = {**(data.get("env") or {}), **_env_values(applied)}
    header = [f"#   env.{name}: set by the remedy of rule {rule}" for name, rule in owner.items()]
    for key, value in _serve_settings(applied).items():
        current = data.setdefault("serve", {}).get(key)
        merged = (
            {**current, **value} if isinstance(current, dict) and isinstance(value, dict) else value
        )
        data["serve"][key] = merged
        header.append(f"#   serve.{key}: set by a remedy ({json.dumps(value, sort_keys=True)})")
    if _added_args(base, applied):
        data.setdefault("serve", {})["extra_args"] = args
        added = [arg for arg in args if arg not in base.manifest.serve.extra_args]
        header.append(
            f"#   serve.extra_args: {' '.join(added)} added by the remedy of {_rules(applied)}"
        )
    return header
