"""Modules over 500 lines and functions over 60 in builder/ (the charter's limits).

A module or function may stay over its limit with a one-line reason beside it: a comment
`# long: WHY` on the line above the `def` (or among a module's first ten lines). Those are
listed with their reason and not counted as over.

    .venv/bin/python bench/house_sizes.py [ROOT]   # prints the table; exit 0
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MODULE_LIMIT = 500
FUNCTION_LIMIT = 60
REASON = "# long:"


def _reason_above(lines: list[str], index: int) -> str | None:
    """The `# long:` reason on the line above lines[index] (0-based: the first decorator's
    line, or the def's)."""
    i = index - 1
    if i >= 0 and lines[i].strip().startswith(REASON):
        return lines[i].strip().removeprefix(REASON).strip()
    return None


def measure(root: Path) -> tuple[list[str], int, int]:
    """Report lines, the count of modules over and of functions over (without a reason)."""
    rows: list[str] = []
    modules_over = functions_over = 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        name = path.as_posix()
        if len(lines) > MODULE_LIMIT:
            why = next(
                (
                    line.strip().removeprefix(REASON).strip()
                    for line in lines[:10]
                    if line.strip().startswith(REASON)
                ),
                None,
            )
            modules_over += why is None
            said = f"  (reason: {why})" if why else ""
            rows.append(f"module   {len(lines):4d}  {name}{said}")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            # From `def` to its last line: a click command's option decorators are not its body.
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LIMIT:
                top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                why = _reason_above(lines, top - 1)
                functions_over += why is None
                where = f"{name}:{node.lineno} {node.name}"
                said = f"  (reason: {why})" if why else ""
                rows.append(f"function {length:4d}  {where}{said}")
    return rows, modules_over, functions_over


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "builder")
    rows, modules_over, functions_over = measure(root)
    print(f"# {root}: modules over {MODULE_LIMIT} lines, functions over {FUNCTION_LIMIT}")
    print(*rows, sep="\n")
    print(f"modules over without a reason: {modules_over}")
    print(f"functions over without a reason: {functions_over}")


if __name__ == "__main__":
    main()
