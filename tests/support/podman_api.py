"""A stand-in for podman's Docker-compatible API (podman 4.3, the field report of 2026-12-06:
shared/reference/hosts_registries_2026-12-06.md, F3) on a unix socket of the test's own: it
answers what a client asks to connect (/_ping, /version, /info) as podman does, and 404 to
everything else, the BuildKit session endpoint (/session) included, which podman has not. The
real docker CLI then fails its BuildKit build with the words podman gives it."""

from __future__ import annotations

import contextlib
import json
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

VERSION = {
    "Version": "4.3.1",
    "ApiVersion": "1.41",
    "MinAPIVersion": "1.24",
    "Os": "linux",
    "Arch": "amd64",
    "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}],
}
INFO = {"NCPU": 2, "MemTotal": 8 << 30, "ServerVersion": "4.3.1", "Name": "podman-host"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    asked: list[str]

    def _answer(self, status: int, body: Any) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        kind = "text/plain" if isinstance(body, bytes) else "application/json"
        self.send_header("Content-Type", kind)
        self.send_header("Api-Version", "1.41")
        self.send_header("Libpod-Api-Version", "4.3.1")
        self.send_header("Server", "Libpod/4.3.1 (linux)")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_HEAD(self) -> None:
        self._answer(200, b"")

    def _route(self) -> None:
        path = self.path.split("?")[0]
        words = path.split("/")
        if len(words) > 1 and words[1].startswith("v1."):
            path = "/" + "/".join(words[2:])
        self.asked.append(f"{self.command} {path}")
        if length := int(self.headers.get("Content-Length") or 0):
            self.rfile.read(length)
        known: dict[str, Any] = {"/_ping": b"OK", "/version": VERSION, "/info": INFO}
        if path in known:
            self._answer(200, known[path])
        else:
            self._answer(404, {"cause": "no such endpoint", "message": path, "response": 404})

    do_GET = do_POST = do_PUT = do_DELETE = _route

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[Any, Any]:
        request, _ = super().get_request()
        return request, ("podman", 0)  # BaseHTTPRequestHandler logs a (host, port) pair


@contextlib.contextmanager
def podman_api(socket_path: Path) -> Iterator[list[str]]:
    """Serve the stand-in at socket_path; yields the requests it was asked, as `METHOD /path`."""
    asked: list[str] = []
    handler = type("Handler", (_Handler,), {"asked": asked})
    server = _Server(str(socket_path), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield asked
    finally:
        server.shutdown()
        server.server_close()
        socket_path.unlink(missing_ok=True)
