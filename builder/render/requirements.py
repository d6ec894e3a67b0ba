"""pip requirements files the build context installs from the lock, every line hash-pinned.

Writing a file of the context is render's job: the lock (lock/) only says what is pinned.
"""

from __future__ import annotations

from typing import Literal

from builder.lock.lockfile import Lock


def lock_requirements(lock: Lock, part: Literal["heavy", "packages"]) -> str:
    """A pip requirements file of one part of the lock, every line hash-pinned."""
    py = lock.python
    lines = [
        # No stack name here: stacks that lock the same set (b12x and marlin differ only in
        # serve settings) must render the same bytes, or their package layers are not shared.
        f"# From the stack's lock ({part}); install with --require-hashes --no-deps.",
        f"--index-url {py.index_url}",
        *(f"--extra-index-url {url}" for url in py.extra_index_urls),
    ]
    # One join per package: a lock has thousands of hashes, and this runs at every render.
    for name, pin in sorted((py.heavy if part == "heavy" else py.packages).items()):
        hashes = " \\\n    --hash=".join(pin.hashes)
        lines.append(f"{name}=={pin.version} \\\n    --hash={hashes}")
    return "\n".join(lines) + "\n"
