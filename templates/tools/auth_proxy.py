"""An API-key gate in front of a serving engine that has none (`transformers serve`).

vLLM checks `Authorization: Bearer KEY` itself (VLLM_API_KEY); `transformers serve` answers
anyone. A pin that publishes such a server beyond loopback with a key runs this in front of
it, in the same container: it listens on the serve port, starts the server on a private
loopback port, and forwards a request only when it carries the key read from KEY_FILE (a
secret mounted read-only: the key is in no argv, env or image). /health stays open, as it is
in vLLM, so the engine's health check and the deploy gate need no key. Streams (SSE) pass
through chunk by chunk. Standard library only: it runs in every image's Python.

    python auth_proxy.py --listen 8000 --upstream 18080 --key-file /run/secrets/api-key \\
        -- transformers serve /models/tiny --host 127.0.0.1 --port 18080
"""

from __future__ import annotations

import argparse
import hmac
import http.client
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OPEN_PATHS = ("/health",)
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"}


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True
    key: bytes
    upstream: int


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Proxy

    def log_message(self, *args: Any) -> None:
        pass  # the server's own log says what it served; keys never reach a log

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def _authorized(self) -> bool:
        if self.path.split("?", 1)[0] in OPEN_PATHS:
            return True
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.server.key
        )

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if not self._authorized():
            self._answer(401, b'{"error": "a valid API key is required"}')
            return
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in HOP_HEADERS and k.lower() != "authorization"
        }
        connection = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=600)
        try:
            connection.request(self.command, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
        except OSError:
            self._answer(502, b'{"error": "the server behind the key gate is not answering"}')
            return
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in HOP_HEADERS and key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while chunk := response.read1(65536):
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        connection.close()

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    parser.add_argument("--key-file", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with open(args.key_file, "rb") as handle:
        key = handle.read().strip()
    if not key or not command:
        print("auth_proxy: an empty key file or no server command", file=sys.stderr)
        return 2
    child = subprocess.Popen(command)
    proxy = _Proxy(("0.0.0.0", args.listen), _Handler)
    proxy.key, proxy.upstream = key, args.upstream

    def stop(signum: int, frame: object) -> None:
        child.terminate()
        threading.Thread(target=proxy.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def server_gone() -> None:
        child.wait()
        proxy.shutdown()  # the server exited: so does the gate, and the container with it

    threading.Thread(target=server_gone, daemon=True).start()
    proxy.serve_forever()
    child.wait()
    return child.returncode or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
