"""docs/commands.md names every command of the CLI (each command of a group, e.g. `cache
capture`, by its full name) in its table: a command added without its row fails here, as a
module added without its line fails tests/test_architecture_doc.py."""

from __future__ import annotations

import re

import click

from builder import REPO_ROOT
from builder.cli.main import cli

DOC = REPO_ROOT / "docs" / "commands.md"


def command_names() -> list[str]:
    """Every leaf command, a group's as `GROUP SUB`."""
    root = click.Context(cli)
    names = []
    for name in cli.list_commands(root):
        command = cli.get_command(root, name)
        if isinstance(command, click.Group):
            names += [f"{name} {sub}" for sub in command.list_commands(root)]
        else:
            names.append(name)
    return names


def documented(text: str) -> str:
    """The first column of the commands table: where each command is written out."""
    table = text.split("| command | does |", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line.split(" | ")[0] for line in table.splitlines() if line.startswith("| "))


def missing(text: str) -> list[str]:
    column = documented(text)
    return [name for name in command_names() if not re.search(rf"`{re.escape(name)}[\s`]", column)]


def test_every_command_has_its_row_in_docs_commands_md() -> None:
    assert missing(DOC.read_text()) == []


def test_a_command_without_its_row_is_found() -> None:
    text = DOC.read_text()
    without = "\n".join(line for line in text.splitlines() if not line.startswith("| `diff "))
    assert missing(without) == ["diff"]
