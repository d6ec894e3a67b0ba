"""The `sm120-stacks` command line: thin commands over the steps (entry point: main.py)."""

import os
import shutil
import sys
from pathlib import Path

#: The group's defaults for --stacks-dir and --build-dir, shared with main.py's no-op path,
#: which reads the same folders without importing the group.
DEFAULT_STACKS_DIR = Path("stacks")
DEFAULT_BUILD_DIR = Path("build")
#: Columns of the tables when stdout is not a terminal (a log, a pipe, CI): wide enough that a
#: row of a digest and a detail stays on one line for grep, narrower than any log viewer's.
PIPE_WIDTH = 160


def console_width() -> int:
    """How wide the tables are drawn: COLUMNS when set, else the terminal's width, else
    PIPE_WIDTH. Shared with the kept listing (list_memo), whose text depends on it."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((PIPE_WIDTH, 24)).columns
    return PIPE_WIDTH
