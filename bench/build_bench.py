"""Benchmark: sm120-stacks builds against a plain BuildKit build of the same rendered Dockerfile.

Runs in one process, pairing A (the tool) with B (the yardstick) turn by turn, and prints the
median of each and the median of the per-pair ratios A/B, as a Markdown table:

  noop     `sm120-stacks build STACK` with nothing changed  vs  `docker build` of the same context
  serve    the same after a serve-argument change            vs  `docker build` of the new context
  cold     `sm120-stacks build --no-cache`                   vs  `docker build --no-cache`
  pull     remove the image, `sm120-stacks pull`             vs  remove it, `build --no-cache`

The stack is benchmarked through a child manifest (`extends: STACK`, plus a serve port for the
serve rows) under its own name, so its moving tag never moves the real stack's while tests run.

Usage: python bench/build_bench.py [--stack ci-mini] [--stacks-dir stacks] [--name bench-ci-mini]
        [--registry 127.0.0.1:5000] [--pairs 3] [--cold-pairs 1]
        [--ca-bundle /etc/ssl/certs/ca-certificates.crt]

A flagship built by scripts/flagship-local.sh (cold pairs would take hours, so none):
  export SM120_STACKS_BASE_SUBSTITUTE=\
nvidia/cuda:13.0.2-devel-ubuntu24.04=local/cuda:13.0.2-devel-bookworm
  python bench/build_bench.py --stacks-dir build/local-stacks/stacks --stack vllm-0.22-b12x-local \
      --cold-pairs 0
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

from builder import REPO_ROOT
from builder.image.buildclient import detect_build_client
from builder.image.names import local_ref
from builder.manifest.resolve import resolve
from builder.render.context import render

CLI = [sys.executable, "-m", "builder"]


#: CPU seconds (user + system) of each tool run and its children (the docker client), in
#: order: on a shared machine the wall clock also counts the other jobs' turns.
TOOL_CPU: list[float] = []


def sh(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None, cpu: list[float] | None = None
) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        argv,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall


Row = tuple[str, float, float, float, float, float]


def paired(
    a: Callable[[], float],
    b: Callable[[], float],
    pairs: int,
    before: Callable[[], None] = lambda: None,
) -> tuple[float, float, float, float, float]:
    """Medians of A, B, A/B, A - B (what A spends beyond B) and A's CPU seconds."""
    times_a, times_b, ratios, beyond = [], [], [], []
    TOOL_CPU.clear()
    for _ in range(pairs):
        before()
        ta = a()
        before()
        tb = b()
        times_a.append(ta)
        times_b.append(tb)
        ratios.append(ta / tb)
        beyond.append(ta - tb)
    cpu = statistics.median(TOOL_CPU) if TOOL_CPU else float("nan")
    return (
        statistics.median(times_a),
        statistics.median(times_b),
        statistics.median(ratios),
        statistics.median(beyond),
        cpu,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stack", default="ci-mini")
    parser.add_argument("--stacks-dir", type=Path, default=REPO_ROOT / "stacks")
    parser.add_argument("--registry", default="127.0.0.1:5000")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--cold-pairs", type=int, default=1)
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    parser.add_argument(
        "--name", help="the child stack's name (default bench-STACK): unique on a shared engine"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sm120-build-bench-"))
    shutil.copytree(args.stacks_dir, work / "stacks")
    (work / "patches").symlink_to(REPO_ROOT / "patches")
    (work / "build").mkdir()
    (work / "build" / "wheels").symlink_to(REPO_ROOT / "build" / "wheels")
    env = {"SM120_STACKS_CA_BUNDLE": args.ca_bundle}
    client = detect_build_client()
    parent = args.stack
    original = f"extends: {parent}\n"
    args.stack = args.name or f"bench-{args.stack}"
    stack_file = work / "stacks" / f"{args.stack}.yaml"
    stack_file.write_text(original)
    # The child changes only serve settings, which a lock's inputs leave out: the parent's lock,
    # under the child's name, is the child's (without one, a locked stack's child would resolve
    # its packages at build time and build another image).
    parent_lock = work / "stacks" / f"{parent}.lock"
    if parent_lock.is_file():
        text = parent_lock.read_text()
        text = text.replace(f"stack: {parent}\n", f"stack: {args.stack}\n", 1)
        (work / "stacks" / f"{args.stack}.lock").write_text(text)

    def tool(*extra: str, as_b: bool = False) -> Callable[[], float]:
        return lambda: sh([*CLI, *extra], work, env, cpu=None if as_b else TOOL_CPU)

    def plain(*extra: str) -> Callable[[], float]:
        def run() -> float:
            ctx = work / "build" / args.stack / "context"
            argv = [
                *client.argv,
                "--network",
                "host",
                "--target",
                "runtime",
                "--secret",
                f"id=proxy-ca,src={args.ca_bundle}",
                *extra,
                str(ctx),
            ]
            return sh(argv, work, client.env)

        return run

    def set_port(port: int) -> None:
        stack_file.write_text(f"{original}serve:\n  port: {port}\n")
        sh([*CLI, "render", args.stack], work)

    rows: list[Row] = []
    sh([*CLI, "build", args.stack], work, env)
    sh([*CLI, "render", args.stack], work)
    rows.append(("no-op build", *paired(tool("build", args.stack), plain(), args.pairs)))
    ports = iter(range(9100, 9200))
    rows.append(
        (
            "rebuild after a serve-argument change",
            *paired(
                tool("build", args.stack), plain(), args.pairs, before=lambda: set_port(next(ports))
            ),
        )
    )
    stack_file.write_text(original)
    sh([*CLI, "render", args.stack], work)
    if args.cold_pairs == 0:
        _print(args.stack, rows)
        shutil.rmtree(work, ignore_errors=True)
        return
    rows.append(
        (
            "cold build (--no-cache)",
            *paired(tool("build", args.stack, "--no-cache"), plain("--no-cache"), args.cold_pairs),
        )
    )
    sh([*CLI, "push", args.stack, "--registry", args.registry, "--force"], work, env)
    content_hash = render(resolve(args.stack, work / "stacks")).content_hash()

    def remove_image() -> None:
        subprocess.run(
            [
                "docker",
                "rmi",
                "-f",
                local_ref(args.stack, content_hash),
                f"sm120-stacks:{args.stack}",
                f"{args.registry}/sm120-stacks:{args.stack}-{content_hash[:16]}",
            ],
            capture_output=True,
        )

    rows.append(
        (
            "image onto an engine without it: pull vs build --no-cache",
            *paired(
                tool("pull", args.stack, "--registry", args.registry),
                tool("build", args.stack, "--no-cache", as_b=True),
                args.cold_pairs,
                before=remove_image,
            ),
        )
    )
    _print(args.stack, rows)
    shutil.rmtree(work, ignore_errors=True)


def _print(stack: str, rows: list[Row]) -> None:
    print(f"\n{stack}, medians over pairs run A B A B in one session\n")
    print(
        "| measurement | A: sm120-stacks (s) | B (s) | A/B | A - B (s) | A's CPU (s) |\n"
        "|---|---|---|---|---|---|"
    )
    for name, a, b, ratio, beyond, cpu in rows:
        print(f"| {name} | {a:.2f} | {b:.2f} | {ratio:.2f} | {beyond:.2f} | {cpu:.2f} |")
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
