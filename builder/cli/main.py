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
from typing import Any, NoReturn

from builder.cli import DEFAULT_BUILD_DIR, DEFAULT_STACKS_DIR
from builder.engine.address import ENV, local_socket

__all__ = ["main"]


#: The status of a process the shell's SIGPIPE ended (128 + 13): what `git log | head -1`,
#: `cat | head` and `grep | head` end with, so `set -o pipefail` scripts treat this tool as
#: they treat those. Not 0: the caller did not get everything the command had to say; not 1:
#: nothing failed. Not SIGPIPE itself: its default action would also end this process at a
#: write to a dropped engine socket or ssh pipe, skipping every cleanup (locks, containers,
#: temporary files) on the way out.
EXIT_READER_GONE = 128 + 13


def main() -> None:
    """Run the command; its stdout's reader gone (`| head`) ends it quietly (EXIT_READER_GONE)."""
    stdout_before = sys.stdout
    try:
        _run()
        sys.stdout.flush()  # here, not at interpreter exit, so a closed pipe is caught below
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        _leave_quietly()
    except SystemExit as exc:
        # click ends any EPIPE it meets with status 1 and no word, after it swapped sys.stdout
        # for a wrapper that drops the final flush: tell the reader gone from any other pipe.
        if exc.code == 1 and sys.stdout is not stdout_before:
            if _stdout_reader_gone():
                _leave_quietly()
            print(
                "failed: a pipe or connection this command wrote to was closed (broken "
                "pipe); run it again",
                file=sys.stderr,
            )
        raise


def _run() -> None:
    if _noop_build(sys.argv[1:]) or _kept_listing(sys.argv[1:]):
        return
    from builder.cli.app import cli
    from builder.engine.scratch import use_run_tempdir

    use_run_tempdir()  # a SIGKILLed run's temporary files are removed by the next run
    cli(prog_name="sm120-stacks")


def _stdout_reader_gone() -> bool:
    """True when stdout is a pipe (or socket) whose reading end was closed: poll says POLLERR
    there, and never on a terminal or file, so an EPIPE of an engine or ssh pipe is not this."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.__stdout__.fileno() if sys.__stdout__ else 1, select.POLLOUT)
        events = poller.poll(0)
    except (OSError, ValueError):
        return False
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events)


def _leave_quietly() -> NoReturn:
    """Exit EXIT_READER_GONE with no traceback and no 'Exception ignored' at shutdown: what is
    still buffered for stdout goes to /dev/null. finally blocks and atexit hooks already ran or
    still run (sys.exit, not os._exit)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
    os.close(devnull)
    sys.exit(EXIT_READER_GONE)


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
