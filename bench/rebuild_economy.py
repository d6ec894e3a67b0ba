"""The FlashInfer compile step of two builds side by side, read from their BuildKit plain logs.

Usage: python bench/rebuild_economy.py NAME=LOG NAME=LOG ...  -> a Markdown table: per build,
the jit-cache compile step (CACHED, or its seconds), the jit-deps, jit-cache and packages stages'
seconds (CACHED steps count 0), every stage's sum, and the modules the log shows compiled
(flashinfer_jit's own lines). Issue 37: a child that changes a package FlashInfer does not
import must show CACHED and no module.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from stage_times import MODULE, stage_seconds

COMPILE_HEADER = re.compile(r"^(#\d+) \[jit-cache \d+/\d+\] RUN .*flashinfer_jit\.py", re.M)


def compile_step(log: str) -> str:
    """'CACHED', 'N.N s', or 'absent' for the step that runs flashinfer_jit.py precompile."""
    header = COMPILE_HEADER.search(log)
    if header is None:
        return "absent"
    step = re.escape(header.group(1))
    outcomes = re.findall(rf"^{step} (CACHED|DONE ([\d.]+)s)$", log, flags=re.M)
    if not outcomes:
        return "unfinished"
    whole, seconds = outcomes[-1]
    return "CACHED" if whole == "CACHED" else f"{float(seconds):.1f} s"


UV_LINE = re.compile(r"^#\d+ [\d.]+ ((?:Prepared|Installed|Uninstalled) \d+ packages?) in", re.M)
STEP = re.compile(r"^(#\d+) \[(?!internal)[^\]]+\] ", re.M)


def steps(arguments: list[str]) -> int:
    """Issue 46's table: per build, its steps CACHED and run, its nvcc lines, and what uv said
    it prepared (downloaded or built) and installed."""
    print("| build | steps CACHED | steps run | nvcc lines | uv says |")
    print("|---|---|---|---|---|")
    for argument in arguments:
        name, _, path = argument.partition("=")
        log = Path(path).read_text(errors="replace")
        ids = set(STEP.findall(log))
        cached = {i for i in ids if re.search(rf"^{re.escape(i)} CACHED$", log, re.M)}
        # BuildKit's own lines only: the client's command line names the manifest's nvcc_threads.
        nvcc = sum(1 for line in log.splitlines() if line.startswith("#") and "bin/nvcc " in line)
        uv = "; ".join(UV_LINE.findall(log)) or "not run"
        print(f"| {name} | {len(cached)} | {len(ids - cached)} | {nvcc} | {uv} |")
    return 0


def main(arguments: list[str]) -> int:
    if arguments[:1] == ["--steps"]:
        return steps(arguments[1:])
    print(
        "| build | compile step | jit-deps s | jit-cache s | packages s | all stages s "
        "| modules compiled |"
    )
    print("|---|---|---|---|---|---|---|")
    for argument in arguments:
        name, _, path = argument.partition("=")
        log = Path(path).read_text(errors="replace")
        stages = stage_seconds(log)
        modules = ", ".join(f"{m} {s}s" for m, s, _ in MODULE.findall(log)) or "none"
        print(
            f"| {name} | {compile_step(log)} | {stages.get('jit-deps', 0):.1f} "
            f"| {stages.get('jit-cache', 0):.1f} | {stages.get('packages', 0):.1f} "
            f"| {sum(stages.values()):.1f} | {modules} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
