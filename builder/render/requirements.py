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


#: The packages stage's installer (templates/stages/packages.j2), pinned by hash: uv installs a
#: package set from its cache mount in seconds where pip unpacks every wheel again, so a child
#: that adds one package downloads one (issue 46). The wheels of this version for the stacks'
#: platforms (linux/amd64, linux/arm64), from https://pypi.org/simple/uv/.
UV_VERSION = "0.13.9"
UV_HASHES = (
    "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",  # manylinux2014 x86_64
    "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",  # manylinux2014 aarch64
    "ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375",  # manylinux_2_28 aarch64
)


def uv_requirements(index_url: str) -> str:
    """requirements/uv.txt: the installer itself, hash-pinned (pip installs it, --no-deps)."""
    hashes = " \\\n    ".join(f"--hash=sha256:{h}" for h in UV_HASHES)
    return f"--index-url {index_url}\nuv=={UV_VERSION} \\\n    {hashes}\n"
