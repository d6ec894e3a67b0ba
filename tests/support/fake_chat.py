"""A stand-in OpenAI-compatible chat server for the soak's own tests: streams a few tokens per
request, and on demand stops sending (a stall) or answers 500. The real server (ci-mini's
`transformers serve`) is what the engine tests soak; this one only proves the judge, in seconds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Behaviour:
    tokens: int = 8
    token_delay_s: float = 0.01
    #: After this many chat requests, every stream (open ones too) stops sending.
    stall_after: int | None = None
    #: Every n-th chat request answers 500.
    fail_every: int | None = None
    #: Answer the vLLM stacks' smoke questions right (a word per chunk), for `smoke --url`.
    answers: bool = False
    #: Answer one JSON body instead of a stream (a server without SSE).
    json_only: bool = False
    #: Send the words as reasoning deltas instead of content.
    reasoning: bool = False
    #: End the stream with a usage chunk of this many completion tokens.
    usage_tokens: int | None = None
    #: Send an error event after this many words.
    error_after: int | None = None
    #: A slow start: /health answers 503 for this long after the server starts.
    healthy_after_s: float = 0.0
    #: Where the starting server logs a line every 0.2 s ("loading weights: shard N") until it
    #: is healthy, then "ready" (a log the health wait's lines quote).
    startup_log: Path | None = None


#: What a question containing the key is answered, as the vLLM stacks' smoke expects.
ANSWERS = {"France": "Paris.", "17 + 25": "42", "Kentucky": "The capital of Kentucky is Frankfort."}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    behaviour: Behaviour
    requests = 0
    closing = False
    user_agents: list[str]
    #: Every chat request's JSON body and headers, in arrival order.
    bodies: list[dict[str, object]]
    headers: list[dict[str, str]]
    lock: threading.Lock
    started = 0.0

    def healthy(self) -> bool:
        return time.monotonic() - self.started >= self.behaviour.healthy_after_s

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hung up (the soak ending) is no error of the test


class _Handler(BaseHTTPRequestHandler):
    #: Chunked streams, as uvicorn sends them: each event reaches the client when it is sent.
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/health" and not self.server.healthy():
            self._answer(503, b'{"status": "starting"}', "application/json")
            return
        self._answer(200, b"{}", "application/json")

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        question = str(request["messages"][-1]["content"])
        with self.server.lock:
            self.server.requests += 1
            number = self.server.requests
            self.server.user_agents.append(self.headers.get("user-agent", ""))
            self.server.bodies.append(request)
            self.server.headers.append({k.lower(): v for k, v in self.headers.items()})
        behaviour = self.server.behaviour
        if behaviour.fail_every and number % behaviour.fail_every == 0:
            self._answer(500, b'{"error": "injected"}', "application/json")
            return
        if behaviour.json_only:
            message = {"role": "assistant", "content": "t0 t1 t2"}
            body = {"choices": [{"message": message, "finish_reason": "stop"}]}
            self._answer(200, json.dumps(body).encode(), "application/json")
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        stall_after = behaviour.stall_after
        words = [f"t{index} " for index in range(behaviour.tokens)]
        if behaviour.answers:
            answer = next((a for k, a in ANSWERS.items() if k in question), "A short essay.")
            words = [f"{word} " for word in answer.split()]
        field = "reasoning_content" if behaviour.reasoning else "content"
        for sent, word in enumerate(words):
            while stall_after is not None and self.server.requests > stall_after:
                if self.server.closing:
                    return
                time.sleep(0.05)
            if behaviour.error_after is not None and sent == behaviour.error_after:
                self._chunk(b'data: {"error": {"message": "injected mid-stream"}}\n\n')
                break
            chunk = {"choices": [{"delta": {field: word}, "finish_reason": None}]}
            self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
            time.sleep(behaviour.token_delay_s)
        if behaviour.usage_tokens is not None:
            usage = {"choices": [], "usage": {"completion_tokens": behaviour.usage_tokens}}
            self._chunk(f"data: {json.dumps(usage)}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _answer(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def fake_chat_server(behaviour: Behaviour) -> Iterator[_Server]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.behaviour = behaviour
    server.user_agents = []
    server.bodies = []
    server.headers = []
    server.lock = threading.Lock()
    server.started = time.monotonic()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    if behaviour.startup_log is not None:
        threading.Thread(
            target=_log_startup, args=(server, behaviour.startup_log), daemon=True
        ).start()
    try:
        yield server
    finally:
        server.closing = True
        server.shutdown()
        server.server_close()


def _log_startup(server: _Server, log: Path) -> None:
    with log.open("a") as out:
        shard = 0
        while not server.healthy() and not server.closing:
            shard += 1
            out.write(f"INFO loading weights: shard {shard}\n")
            out.flush()
            time.sleep(0.2)
        out.write("INFO ready\n")


def url_of(server: _Server) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


def main() -> None:
    """Serve the stand-in on a port until killed: `python -m tests.support.fake_chat PORT`."""
    import sys

    server = _Server(("127.0.0.1", int(sys.argv[1])), _Handler)
    server.behaviour = Behaviour(answers=True)
    server.user_agents, server.bodies, server.headers = [], [], []
    server.lock = threading.Lock()
    server.serve_forever()


if __name__ == "__main__":
    main()
