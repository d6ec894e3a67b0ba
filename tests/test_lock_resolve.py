"""`lock` against the real index (uv, PyPI): what a build installs with --no-deps must be whole.

Needs the package index, like test_patches_apply; a small stack keeps it to seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from builder.lock.uv_compile import make_lock
from builder.manifest.resolve import resolve

#: Asks the real package index (PyPI): skipped loudly where it does not answer.
pytestmark = pytest.mark.network


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
    lock = make_lock(resolve("lock-probe", stacks_dir), engine=None)
    locked = {**lock.python.heavy, **lock.python.packages}
    assert locked["six"].version == "1.16.0"
    assert locked["packaging"].version == "24.1"
    assert all(h.startswith("sha256:") for h in locked["six"].hashes)


def test_versions_from_another_lock_are_kept_where_the_stack_allows(
    stacks_dir: Path, write_stack: Callable[..., Path]
) -> None:
    """A flagship's local variant resolves to the flagship's locked set, not to today's releases
    (unlocked, the local b12x image got transformers 5.24.0 where the lock has 4.57.6); what the
    variant's own pins force is recorded."""
    manifest = yaml.safe_load((stacks_dir / "ci-mini.yaml").read_text())
    manifest["jit_cache"] = {"modules": []}
    python = {"version": "3.12", "packages": {"requests": "2.32.3"}}
    manifest["python"] = {**python, "packages": {"requests": "2.32.3", "urllib3": "2.2.0"}}
    write_stack("flagship", manifest)
    flagship = make_lock(resolve("flagship", stacks_dir), engine=None)
    manifest["python"] = {**python, "version": "3.11", "packages": {"requests": "2.32.3"}}
    manifest["python"]["packages"]["idna"] = "3.7"  # older than the flagship resolves
    write_stack("variant", manifest)
    variant = resolve("variant", stacks_dir)

    fresh = make_lock(variant, engine=None)
    assert fresh.python.versions()["urllib3"] != "2.2.0", "nothing to prefer: today's urllib3"
    assert fresh.python.versions_from is None

    kept = make_lock(variant, engine=None, prefer=flagship)
    assert kept.python.versions()["urllib3"] == "2.2.0"
    assert kept.python.versions_from is not None
    assert kept.python.versions_from.stack == "flagship"
    theirs = flagship.python.versions()["idna"]
    assert kept.python.versions_from.differs == {"idna": f"{theirs} -> 3.7"}
