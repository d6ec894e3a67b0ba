"""An ssh engine's connection closes cleanly when its ssh client has already exited.

Over ssh the docker SDK talks through an ssh process, and closing a connection writes to its
stdin. After a hijacked stream (an exec's output) the remote end and then ssh exit first, and
that write was a BrokenPipeError after the output was read: every exec on an ssh engine failed,
and `deploy --apply` with a warm cache on a namespace host exited 1 without a word
(bench/results/warm-fleet/). Here the SDK's own socket class with a real process that exited.
"""

from __future__ import annotations

import subprocess

import pytest

pytest.importorskip("docker")


def _socket_of_an_exited_client() -> object:
    from docker.transport.sshconn import SSHSocket

    sock = SSHSocket("root@10.0.0.1")
    sock.proc = subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    sock.proc.wait()
    return sock


def test_closing_after_the_ssh_client_exited_is_quiet() -> None:
    from builder.engine.docker_adapter import _close_ssh_quietly

    _close_ssh_quietly()
    sock = _socket_of_an_exited_client()
    sock.close()  # type: ignore[attr-defined]
    assert sock.proc.stdin.closed  # type: ignore[attr-defined]
    _close_ssh_quietly()  # installed once: the second call wraps nothing again
    sock = _socket_of_an_exited_client()
    sock.close()  # type: ignore[attr-defined]
