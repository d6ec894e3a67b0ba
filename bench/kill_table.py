"""One table of issue 34's kill sweep over its four slices (bench/FAULTS.md "Kill it anywhere").

Reads each slice's sweep.jsonl (bench/results/kill-sweep/ for the images slice, state/, serve/,
outages/; outages-push-rerun/ and outages-deploy-rerun*/ hold two columns of the outage slice
run again, on a quieter machine and after each fix) and writes bench/results/kill-sweep/all.md: per
command and per thing killed (the tool, the registry or the engine), the kill points, how many
landed before the end, how many next commands exited 0, and the violations; each row names the
file it came from. A slice whose sweep.jsonl is missing is said to be not run, never counted as
zero.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "bench/results/kill-sweep"
SLICES = {
    "images": SWEEP,
    "state": SWEEP / "state",
    "serve": SWEEP / "serve",
    "outages": SWEEP / "outages",
    "outages, registry push again": SWEEP / "outages-push-rerun",
    "outages, engine deploy after the first fix": SWEEP / "outages-deploy-rerun-oea88",
    "outages, engine deploy after the second fix": SWEEP / "outages-deploy-rerun-obd0f",
    "outages, engine deploy after the third fix": SWEEP / "outages-deploy-rerun",
}


def rows_of(name: str, folder: Path) -> list[dict[str, object]]:
    path = folder / "sweep.jsonl"
    if not path.is_file():
        return []
    found = []
    for line in path.read_text().splitlines():
        point = json.loads(line)
        killed = point.get("killed")
        point["part"] = killed if isinstance(killed, str) else "tool"
        point["landed"] = point.get("killed_before_end", killed is True)
        point["slice"] = name
        point["source"] = str(path.relative_to(ROOT))
        found.append(point)
    return found


def one_line(violation: str) -> str:
    """A violation as one line of the list: the tool's table borders and line breaks out."""
    return " ".join(re.sub("[\u2500-\u257f]+", " ", violation).split())[:240]


def table() -> tuple[str, int, int]:
    groups: dict[tuple[str, str, str, str], list[dict[str, object]]] = defaultdict(list)
    missing = []
    for name, folder in SLICES.items():
        points = rows_of(name, folder)
        if not points:
            missing.append(name)
        for point in points:
            key = (
                str(point["slice"]),
                str(point["command"]),
                str(point["part"]),
                str(point["source"]),
            )
            groups[key].append(point)
    lines = [
        "| slice | command | killed | kill points | landed before its end | next exit 0 "
        "| violations | raw |",
        "|---|---|---|---|---|---|---|---|",
    ]
    total = violations = 0
    for (slice_name, command, part, source), points in groups.items():
        bad = sum(len(p["violations"]) for p in points)  # type: ignore[arg-type]
        total += len(points)
        violations += bad
        lines.append(
            f"| {slice_name} | `{command}` | {part} | {len(points)} | "
            f"{sum(bool(p['landed']) for p in points)} | "
            f"{sum(p['next_code'] == 0 for p in points)} | {bad} | `{source}` |"
        )
    lines.append(f"| all | | | {total} | | | {violations} | |")
    if missing:
        lines.append("")
        lines.append(f"Not run (no sweep.jsonl): {', '.join(missing)}: unknown, not zero.")
    found = [
        f"- {slice_name} {p['command']} {p['point']} ({part}): {one_line(v)}"
        for (slice_name, _, part, _), points in groups.items()
        for p in points
        for v in p["violations"]  # type: ignore[attr-defined]
    ]
    text = "\n".join(lines) + "\n\n" + ("\n".join(found) if found else "no violations") + "\n"
    return text, total, violations


def main() -> int:
    text, total, violations = table()
    (SWEEP / "all.md").write_text(text)
    print(text)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
