"""The host check is `drift`; `verify` is only its deprecated old name, kept for one release.
Nothing the tool says (help, hints, messages, the header of every pin file it writes) or its
docs name `verify` as a command but the alias itself: once the alias goes, a pin file must not
send its reader to a command that no longer exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
from click.testing import CliRunner

from builder import REPO_ROOT
from builder.cli.main import cli

#: `verify` named as a command: quoted, after the tool's name, with its options, or as the
#: subject of what the host check does.
AS_COMMAND = re.compile(
    r"sm120-stacks verify\b|`verify`|`verify [-A-Za-z{]|\bverify --all\b"
    r"|\bverify (reports|shows|says)\b"
)
#: Text that describes the alias itself may name it.
ABOUT_THE_ALIAS = re.compile(r"old name|deprecated", re.I)


def _said(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if AS_COMMAND.search(line) and not ABOUT_THE_ALIAS.search(line)
    ]


def _strings(path: Path) -> list[str]:
    """Every string constant of a module (docstrings too: a command's is its help)."""
    return [
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_no_string_of_the_tool_names_verify_as_a_command() -> None:
    found = {
        f"{path.relative_to(REPO_ROOT)}: {line.strip()}"
        for path in (REPO_ROOT / "builder").rglob("*.py")
        for text in _strings(path)
        for line in _said(text)
    }
    assert not found, sorted(found)


def test_no_help_text_names_verify_but_the_alias() -> None:
    runner = CliRunner()
    commands: list[list[str]] = []
    root = click.Context(cli)
    for name in cli.list_commands(root):
        command = cli.get_command(root, name)
        if name == "verify" or command is None:
            continue
        commands.append([name])
        if isinstance(command, click.Group):
            commands += [[name, sub] for sub in command.list_commands(root)]
    found = []
    for words in [[], *commands]:
        helped = runner.invoke(cli, [*words, "--help"])
        assert helped.exit_code == 0, (words, helped.output)
        found += [f"{' '.join(words)}: {line}" for line in _said(helped.output)]
    assert not found, found


def test_no_doc_names_verify_as_a_command_but_where_it_says_it_is_the_old_name() -> None:
    docs = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    found = [f"{doc.name}: {line}" for doc in docs for line in _said(doc.read_text())]
    assert not found, found


def test_the_check_finds_what_it_looks_for() -> None:
    assert _said("# check the host with `sm120-stacks verify h1`. Commit this file.")
    assert _said("`verify --all` shows what runs where")
    assert not _said("`verify`, its old name, still works for one release")
    assert not _said("builder/verify/smoke.py: `verify/compiles.compile_vocabulary`")
