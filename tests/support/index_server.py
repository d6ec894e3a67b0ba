"""A package index on 127.0.0.1 serving tests/fixtures/index/, so the real requests code runs.

/simple/NAME/          the recorded PEP 691 page (application/vnd.pypi.simple.v1+json)
/files/WHEEL.metadata  the recorded core metadata (PEP 658)
/files/WHEEL           a small wheel holding that metadata, with HTTP range requests
/down/...              503, as an index in maintenance answers
/html/simple/NAME/     a PEP 503 HTML page: an index without the JSON API
/garbage/simple/NAME/  JSON of the right type and the wrong shape
"""

from __future__ import annotations

import io
import random
import re
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from packaging.utils import parse_wheel_filename

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "index"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"


@dataclass
class Served:
    """What the server answered: (path, Range header, bytes sent) per request."""

    requests: list[tuple[str, str | None, int]] = field(default_factory=list)

    def bytes_for(self, suffix: str) -> int:
        return sum(sent for path, _, sent in self.requests if path.endswith(suffix))


def wheel_bytes(filename: str, metadata: bytes) -> bytes:
    """A wheel with the metadata and 1 MB of incompressible padding before it, so reading
    METADATA by ranges is visibly cheaper than downloading the wheel."""
    name, version, _, _ = parse_wheel_filename(filename)
    dist_info = f"{str(name).replace('-', '_')}-{version}.dist-info"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        padding = random.Random(0).randbytes(1 << 20)
        wheel.writestr("padding.bin", padding, compress_type=zipfile.ZIP_STORED)
        wheel.writestr(f"{dist_info}/METADATA", metadata, compress_type=zipfile.ZIP_DEFLATED)
        wheel.writestr(f"{dist_info}/RECORD", "", compress_type=zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


def _handler(served: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path.startswith("/down/"):
                return self._send(503, b"maintenance", "text/plain")
            if match := re.fullmatch(r"/(html|garbage)/simple/([a-z0-9-]+)/", path):
                if match.group(1) == "html":
                    return self._send(
                        200, b"<html><body><a href='x'>x</a></body></html>", "text/html"
                    )
                return self._send(200, b'{"meta": {"api-version": "1.1"}, "files": 3}', JSON_TYPE)
            if match := re.fullmatch(r"/simple/([a-z0-9-]+)/", path):
                page = FIXTURES / "simple" / match.group(1) / "index.json"
                if not page.is_file():
                    return self._send(404, b"not found", "text/plain")
                return self._send(200, page.read_bytes(), JSON_TYPE)
            if match := re.fullmatch(r"/files/([A-Za-z0-9_.+-]+)", path):
                return self._file(match.group(1))
            return self._send(404, b"not found", "text/plain")

        def do_HEAD(self) -> None:
            self.do_GET()

        def _file(self, name: str) -> None:
            saved = FIXTURES / "files" / name
            if name.endswith(".metadata") and saved.is_file():
                return self._send(200, saved.read_bytes(), "application/octet-stream")
            metadata = FIXTURES / "files" / f"{name}.metadata"
            if not (name.endswith(".whl") and metadata.is_file()):
                return self._send(404, b"not found", "text/plain")
            body = wheel_bytes(name, metadata.read_bytes())
            wanted = self.headers.get("Range")
            match = re.fullmatch(r"bytes=(\d*)-(\d*)", wanted or "")
            if not match:
                return self._send(200, body, "application/octet-stream")
            first, last = match.groups()
            start = len(body) - int(last) if not first else int(first)
            stop = len(body) - 1 if not first or not last else min(int(last), len(body) - 1)
            start = max(start, 0)
            extra = {"Content-Range": f"bytes {start}-{stop}/{len(body)}"}
            return self._send(206, body[start : stop + 1], "application/octet-stream", extra)

        def _send(
            self, status: int, body: bytes, kind: str, headers: dict[str, str] | None = None
        ) -> None:
            served.requests.append((self.path, self.headers.get("Range"), len(body)))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


@contextmanager
def index_server() -> Iterator[tuple[str, Served]]:
    """(base URL, what was served) of a running fixture index."""
    served = Served()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
