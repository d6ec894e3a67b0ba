"""The `sm120-stacks` command line: thin commands over the steps (entry point: main.py)."""
