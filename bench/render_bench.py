"""Benchmark: resolve + check + render, for the real stacks and for generated ones.

Measures per-stack time as the number of stacks grows (flat stacks extending one parent) and as
the depth of `extends` grows, all in one process and one run, so the numbers compare as ratios.
The real (locked) stacks are timed twice: cold (each lock parsed from YAML: a fresh parse cache
and no in-process one) and warm (the parse cache filled by an earlier command). With
`--against DIR` (a checkout of an earlier commit, e.g. `git worktree add DIR COMMIT`), the
whole-process `sm120-stacks list` of this tree and of DIR run in turn, pair by pair, and the
median of the per-pair ratios is printed.
Usage: python bench/render_bench.py [--stacks 1000] [--repeat 3] [--against DIR [--pairs 7]]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

from builder import REPO_ROOT
from builder.cli.main import cli
from builder.lock import reading
from builder.manifest.check import check_stack
from builder.manifest.resolve import resolve, stack_names
from builder.render.context import render

REAL = REPO_ROOT / "stacks"


def pipeline(name: str, stacks_dir: Path) -> None:
    stack = resolve(name, stacks_dir)
    assert check_stack(stack).ok
    render(stack).content_hash()


def timed(action: Callable[[], None], repeat: int) -> float:
    return timed_both(action, repeat)[0]


def timed_both(action: Callable[[], None], repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of this process: on a shared machine the wall clock also
    counts the other jobs' turns, the CPU time only this one's."""
    walls, cpus = [], []
    for _ in range(repeat):
        started, cpu = time.perf_counter(), time.process_time()
        action()
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def cold(name: str, stacks_dir: Path) -> None:
    """The pipeline with every lock parsed from its YAML (no parse cache of any kind)."""
    reading._parsed_lock.cache_clear()
    os.environ["SM120_STACKS_CACHE_DIR"] = tempfile.mkdtemp(prefix="sm120-bench-cache-")
    try:
        pipeline(name, stacks_dir)
    finally:
        shutil.rmtree(os.environ.pop("SM120_STACKS_CACHE_DIR"))


def warm(name: str, stacks_dir: Path) -> None:
    """A later command: the in-process cache is gone, the parse cache on disk is not."""
    reading._parsed_lock.cache_clear()
    pipeline(name, stacks_dir)


def list_seconds(tree: Path) -> float:
    """Wall seconds of one whole `sm120-stacks list` process run from tree's sources."""
    return list_times(tree)[0]


def list_times(tree: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one whole `sm120-stacks list` process run from
    tree's sources."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "builder", "--stacks-dir", str(REAL), "list"],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compare_list(against: Path, pairs: int) -> None:
    list_seconds(REPO_ROOT), list_seconds(against)  # warm-up: imports compiled, caches filled
    runs = [(list_times(REPO_ROOT), list_times(against)) for _ in range(pairs)]
    ours = statistics.median(a[0] for a, _ in runs)
    theirs = statistics.median(b[0] for _, b in runs)
    ratio = statistics.median(a[0] / b[0] for a, b in runs)
    ours_cpu = statistics.median(a[1] for a, _ in runs)
    theirs_cpu = statistics.median(b[1] for _, b in runs)
    print(f"\n`list` of every stack, whole process, {pairs} pairs (median):")
    print(f"this tree {ours:.3f} s, {against} {theirs:.3f} s, ratio {ratio:.2f}x")
    print(f"CPU: this tree {ours_cpu:.3f} s, {against} {theirs_cpu:.3f} s")


def scratch_repo() -> Path:
    root = Path(tempfile.mkdtemp(prefix="sm120-bench-"))
    shutil.copytree(REAL, root / "stacks", ignore=shutil.ignore_patterns("ci-mini*"))
    (root / "patches").symlink_to(REPO_ROOT / "patches")
    return root


def generate_flat(stacks_dir: Path, count: int) -> list[str]:
    names = []
    for i in range(count):
        name = f"gen-{i:05d}"
        (stacks_dir / f"{name}.yaml").write_text(
            f"extends: vllm-0.22-marlin\nserve:\n  max_model_len: {1024 + i}\n"
            f"env:\n  BENCH_INDEX: '{i}'\n"
        )
        names.append(name)
    return names


def generate_chain(stacks_dir: Path, depth: int) -> str:
    parent = "vllm-0.22-marlin"
    for level in range(depth):
        name = f"chain-{depth}-{level:03d}"
        (stacks_dir / f"{name}.yaml").write_text(
            f"extends: {parent}\nserve:\n  max_model_len: {2048 + level}\n"
        )
        parent = name
    return parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stacks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", type=Path)
    parser.add_argument("--pairs", type=int, default=7)
    args = parser.parse_args()
    root = scratch_repo()
    stacks_dir = root / "stacks"
    try:
        real = [n for n in stack_names(REAL) if not n.startswith("ci-")]
        wall, cpu = timed_both(lambda: [cold(n, stacks_dir) for n in real], args.repeat)
        base, base_cpu = wall / len(real), cpu / len(real)
        print(
            f"real stacks ({len(real)}), cold: {base * 1e3:.2f} ms per stack (baseline 1.00x; "
            f"CPU {base_cpu * 1e3:.2f} ms)"
        )
        wall, cpu = timed_both(lambda: [warm(n, stacks_dir) for n in real], args.repeat)
        hot, hot_cpu = wall / len(real), cpu / len(real)
        print(
            f"real stacks ({len(real)}), warm: {hot * 1e3:.2f} ms per stack ({hot / base:.2f}x; "
            f"CPU {hot_cpu * 1e3:.2f} ms)"
        )
        started, began_cpu = time.perf_counter(), time.process_time()
        CliRunner().invoke(cli, ["--stacks-dir", str(REAL), "list"], catch_exceptions=False)
        print(
            f"`list` of every stack, in process, warm: {time.perf_counter() - started:.3f} s "
            f"(CPU {time.process_time() - began_cpu:.3f} s)"
        )
        print("\n| stacks | total s | ms per stack | vs real stacks |\n|---|---|---|---|")
        names = generate_flat(stacks_dir, args.stacks)
        for count in (10, 100, args.stacks):
            subset = names[:count]
            total = timed(lambda s=subset: [pipeline(n, stacks_dir) for n in s], 1)
            per_stack = total / count
            print(f"| {count} | {total:.2f} | {per_stack * 1e3:.2f} | {per_stack / base:.2f}x |")
        print("\n| extends depth | ms per stack | vs depth 1 |\n|---|---|---|")
        depth_one = None
        for depth in (1, 4, 16, 30):
            leaf = generate_chain(stacks_dir, depth)
            seconds = timed(lambda leaf=leaf: pipeline(leaf, stacks_dir), args.repeat)
            depth_one = depth_one or seconds
            print(f"| {depth} | {seconds * 1e3:.2f} | {seconds / depth_one:.2f}x |")
        if args.against is not None:
            compare_list(args.against, args.pairs)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
