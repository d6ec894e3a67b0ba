"""The `sm120-stacks` entry point. Commands live beside their step (stacks.py, verify.py,
hosts.py, ...) and register on the group in app.py when their module is imported; the group
imports a command's module only when that command runs (app.COMMAND_MODULES)."""

from __future__ import annotations

from builder.cli.app import cli

__all__ = ["cli", "main"]


def main() -> None:
    cli(prog_name="sm120-stacks")
