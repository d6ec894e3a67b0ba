"""Benchmark: resolve + check + render, for the real stacks and for generated ones.

Measures per-stack time as the number of stacks grows (flat stacks extending one parent) and as
the depth of `extends` grows, all in one process and one run, so the numbers compare as ratios.
Usage: python bench/render_bench.py [--stacks 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from builder import REPO_ROOT
from builder.render.context import render
from builder.spec.check import check_stack
from builder.spec.resolve import resolve, stack_names

REAL = REPO_ROOT / "stacks"


def pipeline(name: str, stacks_dir: Path) -> None:
    stack = resolve(name, stacks_dir)
    assert check_stack(stack).ok
    render(stack).content_hash()


def timed(action: Callable[[], None], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


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
    args = parser.parse_args()
    root = scratch_repo()
    stacks_dir = root / "stacks"
    try:
        real = [n for n in stack_names(REAL) if not n.startswith("ci-mini")]
        base = timed(lambda: [pipeline(n, stacks_dir) for n in real], args.repeat) / len(real)
        print(f"real stacks ({len(real)}): {base * 1e3:.2f} ms per stack (baseline 1.00x)")
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
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
