"""Seconds per stage of one build, read from its BuildKit plain log (build/STACK/logs/*.log).

Usage: python bench/stage_times.py LOG  -> a Markdown table of stages and their steps' time
(CACHED steps count 0), then one row per FlashInfer module the jit-cache stage compiled.
Stages overlap where BuildKit runs them in parallel, so the sum can exceed the wall time.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

STEP = re.compile(r"^#(\d+) \[([\w.-]+) \d+/\d+\]")
DONE = re.compile(r"^#(\d+) DONE ([\d.]+)s")
MODULE = re.compile(r"flashinfer_jit: (\S+) done in (\d+)s, (.*)$", re.MULTILINE)


def stage_seconds(log: str) -> dict[str, float]:
    stage_of: dict[str, str] = {}
    seconds: dict[str, float] = defaultdict(float)
    for line in log.splitlines():
        if match := STEP.match(line):
            stage_of[match.group(1)] = match.group(2)
        elif (match := DONE.match(line)) and match.group(1) in stage_of:
            seconds[stage_of[match.group(1)]] += float(match.group(2))
    return dict(seconds)


def main() -> None:
    table = stage_seconds(Path(sys.argv[1]).read_text(errors="replace"))
    print("| stage | seconds |\n|---|---|")
    for stage, seconds in table.items():
        print(f"| {stage} | {seconds:.0f} |")
    for name, seconds, rest in MODULE.findall(Path(sys.argv[1]).read_text(errors="replace")):
        print(f"| jit-cache: `{name}` | {seconds} ({rest}) |")


if __name__ == "__main__":
    main()
