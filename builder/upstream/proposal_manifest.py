"""The proposed stack's manifest, as `propose` writes it to stacks/NEW.yaml: `extends` the
parent and overrides only the pins that move, each with why, and what the remedies set; a full
copy of the parent as resolved where a pin is dropped (a child stack cannot remove a pin its
parent has).
"""

from __future__ import annotations

from typing import Any

import yaml

from builder.knowledge.yamlsafe import load_yaml
from builder.manifest.chain import deep_merge
from builder.manifest.resolve import ResolvedStack
from builder.upstream.moves import Move
from builder.upstream.settings import AppliedSettings, apply_settings, settings_lines


def manifest_text(
    name: str,
    base: ResolvedStack,
    moves: list[Move],
    command: str,
    settings: list[AppliedSettings] | None = None,
) -> str:
    """`extends` the old stack and overrides only what moved, each pin with why, and what the
    remedies set; a full copy when a pin is dropped."""
    explicit = [m for m in moves if m.explicit and m.new is not None]
    headline = ", ".join(f"{m.package} {m.new}" for m in explicit) or "new pins"
    description = (
        f"{base.name} moved to {headline} (proposed from the package index; "
        "not yet built or tested)."
    )
    header = [
        f"# Proposed by `{command or f'sm120-stacks propose {name} --from {base.name}'}`.",
        "# Not built or tested: review the moves, build, test, and set status once it passed.",
    ]
    if any(m.new is None for m in moves):
        return _full_copy(base, moves, header, description, settings or [])
    lines = [
        *header,
        "# The pins below override the parent's; everything else is inherited from it (its",
        "# notes describe the parent's versions).",
        f"description: {description}",
        f"extends: {base.name}",
        "status: experimental",
        "python:",
    ]
    py = base.manifest.python
    for section in ("packages", "overrides"):
        chosen = [m for m in moves if m.section == section]
        if chosen:
            lines.append(f"  {section}:")
        table = py.packages if section == "packages" else py.overrides
        for move in chosen:
            pin = table.get(move.package)
            value = f'"{move.new}"'
            if pin is not None and pin.extras:
                value = f"{{version: {value}, extras: [{', '.join(pin.extras)}]}}"
            was = f"was {move.old}" if move.old else "new"
            lines.append(f"    {move.package}: {value}  # {move.why} ({was})")
    lines += settings_lines(base, settings or [])
    return "\n".join(lines) + "\n"


def _full_copy(
    base: ResolvedStack,
    moves: list[Move],
    header: list[str],
    description: str,
    settings: list[AppliedSettings],
) -> str:
    data: dict[str, Any] = {}
    for path in reversed(base.sources):
        data = deep_merge(data, load_yaml(path).data)
    data.pop("extends", None)
    for move in moves:
        table = data["python"].setdefault(move.section, {})
        if move.new is None:
            table.pop(move.package, None)
        elif isinstance(table.get(move.package), dict):
            table[move.package] = {**table[move.package], "version": move.new}
        else:
            table[move.package] = move.new
    data["description"] = description
    data["status"] = "experimental"
    lines = [
        *header,
        f"# A full copy of {base.name} as resolved (comments and `extends` dropped): a child",
        "# stack cannot remove a pin its parent has. What moved:",
        *(
            f"#   {m.package}: {m.old or '(new)'} -> {m.new or '(dropped)'}  ({m.why})"
            for m in moves
        ),
        *apply_settings(data, base, settings),
    ]
    body = yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)
    return "\n".join(lines) + "\n" + body
