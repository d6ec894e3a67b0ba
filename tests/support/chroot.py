"""A throwaway Debian 12 machine for scripts/host-setup.sh: a debootstrapped chroot run in its own
network, mount and PID namespaces, with stand-in packages carrying Docker CE's real control fields.

Why a chroot and not a container: the script's job is to install (or refuse to install) engine
packages, so it must meet a real dpkg/apt with real conflicts, and it must never see this
machine's engine or its registry on 127.0.0.1:5000. The namespaces give it a loopback of its own
(nothing it starts can reach or be reached from here) and take every process it starts down with
them when the case ends.

The debootstrapped tree (minbase bookworm, curl, up-to-date apt lists and the .debs that a bare
host's set-up installs already in apt's cache) is made once, with the network, and kept as a
tarball under build/; each case then runs offline in a fresh copy of it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from builder import REPO_ROOT

MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
#: What the bare host's set-up installs (scripts/host-setup.sh --registry), fetched into the
#: tree's apt cache so that the cases need no network.
PREFETCH = ("docker.io", "docker-registry", "debootstrap", "openssl")
CACHE = REPO_ROOT / "build" / "host-setup-chroot" / f"{SUITE}-minbase-v1.tar"


def mirror_unreachable() -> str | None:
    """Why the tree cannot be made here (None when it is cached or the mirror answers)."""
    if CACHE.exists():
        return None
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (scripts/host-setup.sh --registry installs it)"
    try:
        urllib.request.urlopen(f"{MIRROR}/dists/{SUITE}/Release", timeout=10).close()
    except OSError as error:
        return f"{MIRROR} is unreachable ({error}): cannot debootstrap the throwaway host"
    return None


def in_namespaces(root: Path, script: str, *, timeout: int) -> subprocess.CompletedProcess[str]:
    """Run a shell script in fresh network, mount and PID namespaces, with root's /proc and /dev
    mounted (privately: they vanish with the namespace) and the loopback up. The script runs
    with this machine's tools; `chroot "$ROOT" ...` enters the throwaway host."""
    prologue = (
        "set -eu\n"
        f"ROOT={root}\n"
        "ip link set lo up\n"
        'mount -t proc proc "$ROOT/proc"\n'
        'mount --rbind /dev "$ROOT/dev"\n'
    )
    return subprocess.run(
        [
            "unshare",
            "--net",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "bash",
            "-c",
            prologue + script,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def build_cache() -> Path:
    """debootstrap the tree (a few minutes, once) and keep it as the tarball CACHE."""
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tree-", dir=CACHE.parent))
    try:
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=curl,ca-certificates",
                SUITE,
                str(work),
                MIRROR,
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
        fetch = (
            f'mount -t proc proc "{work}/proc"; mount --rbind /dev "{work}/dev"; '
            f'chroot "{work}" apt-get update -q && '
            f'chroot "{work}" apt-get install -d -y -q {" ".join(PREFETCH)}'
        )
        subprocess.run(
            ["unshare", "--mount", "bash", "-c", fetch],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
        partial = CACHE.with_name(f"{CACHE.name}.{os.getpid()}.partial")  # two runs at once
        subprocess.run(["tar", "-C", str(work), "-cf", str(partial), "."], check=True)
        partial.replace(CACHE)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return CACHE


def fresh_host(into: Path) -> Path:
    """A fresh copy of the cached tree under into/root."""
    if not CACHE.exists():
        build_cache()
    root = into / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(CACHE)], check=True)
    return root


@contextmanager
def fake_engine_socket(root: Path) -> Iterator[Path]:
    """A socket at root/run/fake-engine.sock that answers the engine's /_ping as dockerd does.
    The stand-in systemctl links /run/docker.sock to it on `start docker`; the real engine's
    other API is not needed by the script."""
    path = root / "run" / "fake-engine.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: 2\r\nConnection: close\r\n\r\nOK"
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        server.close()
        thread.join(timeout=5)


def remove_host(root: Path) -> None:
    """Delete a throwaway host; refuse if anything is still mounted in it (a /dev bind mount
    seen from here would make rmtree delete this machine's device nodes)."""
    for sub in ("dev", "proc"):
        if (root / sub).is_mount():
            raise RuntimeError(f"{root / sub} is still mounted; not deleting {root}")
    subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)
