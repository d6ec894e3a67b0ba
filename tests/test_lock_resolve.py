"""`lock` against the real index (uv, PyPI): what a build installs with --no-deps must be whole.

Needs the package index, like test_patches_apply; a small stack keeps it to seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from builder.lock import make_lock
from builder.resolve import resolve


def _small_stack(stacks_dir: Path, write_stack: Callable[..., Path], python: dict) -> Path:
    manifest = yaml.safe_load((stacks_dir / "ci-mini.yaml").read_text())
    manifest["python"] = {"version": "3.11", **python}
    manifest["jit_cache"] = {"modules": []}
    return write_stack("lock-probe", manifest)


def test_an_override_nothing_depends_on_is_locked(
    stacks_dir: Path, write_stack: Callable[..., Path]
) -> None:
    """uv's --override only rewrites requirements; an override no package asks for (the 0.17
    stack's flashinfer-cubin) vanished from the lock, and a locked build then lacked it."""
    _small_stack(
        stacks_dir,
        write_stack,
        {"packages": {"packaging": "24.1"}, "overrides": {"six": "1.16.0"}},
    )
    lock = make_lock(resolve("lock-probe", stacks_dir), api=None)
    locked = {**lock.python.heavy, **lock.python.packages}
    assert locked["six"].version == "1.16.0"
    assert locked["packaging"].version == "24.1"
    assert all(h.startswith("sha256:") for h in locked["six"].hashes)
