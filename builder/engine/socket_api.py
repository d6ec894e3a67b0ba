"""The engine API's three calls a no-op build makes (ping, inspect, tag), straight over the
local unix socket with the standard library.

A `build` with nothing to do asks the engine whether the image of its content hash exists and
moves one tag: importing the docker SDK for that (requests, urllib3, paramiko) cost more than
the rest of the command. Everything else goes through the SDK, imported when first needed.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any
from urllib.parse import quote, urlencode

from builder.engine.protocol import Image
from builder.errors import EngineError, EngineNotFound, EngineUnreachable

#: The oldest API version the tool supports (Debian 12's engine 20.10 speaks 1.41).
API_VERSION = "v1.41"
TIMEOUT_S = 30


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=TIMEOUT_S)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_S)
        sock.connect(self._path)
        self.sock = sock


class SocketApi:
    """GET and POST on the engine's API at a unix socket path; errors as EngineError."""

    def __init__(self, path: str) -> None:
        self.path = path

    def request(self, method: str, endpoint: str) -> Any:
        connection = _UnixConnection(self.path)
        try:
            connection.request(method, f"/{API_VERSION}{endpoint}")
            response = connection.getresponse()
            body = response.read()
        except OSError as exc:
            raise EngineUnreachable(f"engine at {self.path}: {exc}") from None
        finally:
            connection.close()
        if response.status == 404:
            raise EngineNotFound(_message(body), status_code=404)
        if response.status >= 400:
            raise EngineError(_message(body), status_code=response.status)
        if not body or response.getheader("Content-Type", "").split(";")[0] != "application/json":
            return body.decode(errors="replace")
        return json.loads(body)

    def ping(self) -> None:
        self.request("GET", "/_ping")

    def image(self, ref: str) -> Image | None:
        try:
            attrs = self.request("GET", f"/images/{quote(ref, safe='')}/json")
        except EngineNotFound:
            return None
        return Image(str(attrs["Id"]), dict(attrs))

    def tag(self, image: str, repository: str, tag: str | None) -> None:
        query = urlencode({"repo": repository, **({"tag": tag} if tag else {})})
        self.request("POST", f"/images/{quote(image, safe='')}/tag?{query}")


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("message") or body.decode(errors="replace"))
    except (ValueError, AttributeError):
        return body.decode(errors="replace").strip()
