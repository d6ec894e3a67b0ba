"""The `sm120-stacks` entry point. Commands live beside their step (stacks.py, images.py,
verify.py, hosts.py, ...) and register on the group in app.py when their module is imported;
the group imports a command's module only when that command runs (app.COMMAND_MODULES).

`build STACK` with nothing to do is answered before any of that is imported
(builder.image.uptodate): it is the command a Makefile or a CI job runs most; so is `list` with
nothing changed since the last one (builder.cli.list_memo), the command people look around with.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from builder.cli import DEFAULT_BUILD_DIR, DEFAULT_STACKS_DIR
from builder.engine.address import ENV, local_socket

__all__ = ["main"]


def main() -> None:
    if _noop_build(sys.argv[1:]) or _kept_listing(sys.argv[1:]):
        return
    from builder.cli.app import cli

    cli(prog_name="sm120-stacks")


def _noop_build(args: list[str]) -> bool:
    """True when `build STACK`, with no option, was found up to date from file metadata."""
    if len(args) != 2 or args[0] != "build" or args[1].startswith("-"):
        return False
    socket_path = local_socket(os.environ.get(ENV) or None)
    if socket_path is None:
        return False
    from builder.image.uptodate import still_built

    ref = still_built(DEFAULT_BUILD_DIR, DEFAULT_STACKS_DIR, args[1], socket_path)
    if ref is None:
        return False
    print(f"up to date: {ref}")
    return True


def _kept_listing(args: list[str]) -> bool:
    """True when `list` was answered from what the last one printed (builder.cli.list_memo)."""
    from builder.cli.list_memo import kept_listing, listing_folders

    folders = listing_folders(args)
    listing = None if folders is None else kept_listing(folders[1], folders[0])
    if listing is None:
        return False
    sys.stdout.write(listing)
    return True


def __getattr__(name: str) -> Any:
    """`cli` on first use: importing this module must stay cheap for the no-op build."""
    if name == "cli":
        from builder.cli.app import cli

        return cli
    raise AttributeError(name)
