"""Image size by layer: a stack's shipped image against a single-stage build of the same packages.

The single-stage image is the rendered Dockerfile built only up to its `jit-cache` stage: the
same base, apt packages (with the -dev headers the build needs), the same pinned venv in the
same layers and the same JIT cache, everything a one-stage Dockerfile would hold, minus what
our cache mounts keep out of any layer. Those mounts are measured too (pip's cache and the
FlashInfer compile tree with its objects): a naive single-stage build that compiles in place
and installs without --no-cache-dir would carry them in its layers as well.

Everything is built from the BuildKit cache the stack's own build left, so this takes seconds.

Usage: python bench/layer_sizes.py STACK [--build-dir build] [--ca-bundle PEM]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import docker

from builder.image.buildclient import BuildClient, detect_build_client

SINGLE_STAGE_TARGET = "jit-cache"
CACHE_MOUNT = re.compile(r"--mount=type=cache,(?:id=(?P<id>[^,]+),)?target=(?P<target>[^,\s]+)")


def layers(api: Any, ref: str) -> list[tuple[int, str]]:
    """(bytes, instruction) per layer, oldest first, as the engine's history reports them."""
    rows = []
    for entry in reversed(api.api.history(ref)):
        created_by = re.sub(r"^/bin/(ba)?sh -c (#\(nop\) )?", "", entry.get("CreatedBy") or "")
        rows.append((int(entry.get("Size") or 0), " ".join(created_by.split())[:90]))
    return rows


def build_single_stage(client: BuildClient, context: Path, tag: str, ca_bundle: str) -> None:
    argv = [*client.argv, "--network", "host", "--target", SINGLE_STAGE_TARGET]
    argv += ["--secret", f"id=proxy-ca,src={ca_bundle}", "--tag", tag, str(context)]
    subprocess.run(argv, env={**os.environ, **client.env}, check=True, capture_output=True)


def cache_mount_bytes(client: BuildClient, dockerfile: str) -> dict[str, int]:
    """Bytes in each cache mount the Dockerfile uses, read by a throwaway build that runs du."""
    mounts = {
        m.group("id") or m.group("target"): m.group("target")
        for m in CACHE_MOUNT.finditer(dockerfile)
    }
    base = re.search(r"^FROM (\S+) AS toolchain", dockerfile, re.MULTILINE)
    assert base, "the Dockerfile has no toolchain stage"
    flags = " ".join(
        f"--mount=type=cache,id={mount_id},target=/m/{n},sharing=locked"
        for n, mount_id in enumerate(mounts)
    )
    # Fails on purpose after printing: it leaves no image behind and is never cached.
    probe = f"FROM {base.group(1)}\nRUN {flags} du -sb /m/* && false\n"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "Dockerfile").write_text(probe)
        done = subprocess.run(
            # Never --no-cache: BuildKit gives such a build fresh, empty cache mounts, which then
            # shadow the real ones (the next build's compile would start from nothing).
            [*client.argv, "--progress=plain", "--network", "none", tmp],
            env={**os.environ, **client.env},
            capture_output=True,
            text=True,
        )
    sizes = {n: size for size, n in re.findall(r"(\d+)\s+/m/(\d+)\n", done.stderr)}
    return {mount_id: int(sizes.get(str(n), 0)) for n, mount_id in enumerate(mounts)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("stack")
    parser.add_argument("--build-dir", type=Path, default=Path("build"))
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    args = parser.parse_args()
    api, client = docker.from_env(), detect_build_client()
    context = args.build_dir / args.stack / "context"
    single = f"sm120-stacks-bench:{args.stack}-single-stage"
    build_single_stage(client, context, single, args.ca_bundle)
    shipped = layers(api, f"sm120-stacks:{args.stack}")
    one_stage = layers(api, single)
    print(f"\n{args.stack}: layers of the shipped image (A) and of a single-stage build (B)\n")
    print("| image | bytes | layer |\n|---|---|---|")
    for name, rows in (("A shipped", shipped), ("B single-stage", one_stage)):
        for size, what in rows:
            if size:
                print(f"| {name} | {size / 1e9:.3f} GB | `{what.replace('|', '/')}` |")
    total_a, total_b = sum(s for s, _ in shipped), sum(s for s, _ in one_stage)
    print(f"\nA {total_a / 1e9:.2f} GB, B {total_b / 1e9:.2f} GB, A/B {total_a / total_b:.3f}")
    for mount_id, size in cache_mount_bytes(client, (context / "Dockerfile").read_text()).items():
        print(
            f"cache mount {mount_id}: {size / 1e9:.2f} GB (in no layer; in-layer for a naive build)"
        )


if __name__ == "__main__":
    main()
