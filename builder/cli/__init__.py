"""The `sm120-stacks` command line: thin commands over the steps (entry point: main.py)."""

from pathlib import Path

#: The group's defaults for --stacks-dir and --build-dir, shared with main.py's no-op path,
#: which reads the same folders without importing the group.
DEFAULT_STACKS_DIR = Path("stacks")
DEFAULT_BUILD_DIR = Path("build")
