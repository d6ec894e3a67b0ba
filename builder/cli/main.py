"""The `sm120-stacks` entry point: the group and every step's commands, registered by import.

Each command module adds its commands to the group in builder.cli.app; importing them here, and
nowhere else, keeps the modules free of import cycles.
"""

from __future__ import annotations

from builder.cli import hosts, stacks, verify
from builder.cli.app import cli

__all__ = ["cli", "hosts", "main", "stacks", "verify"]


def main() -> None:
    cli(prog_name="sm120-stacks")
