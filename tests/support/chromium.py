"""A real headless Chromium (Debian's `chromium`) driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: JSON messages ending in NUL on file descriptors 3 and 4), so a test
asks the page what a person would see: its text, and whether its images decoded."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BINARY = "chromium"


def available() -> bool:
    return shutil.which(BINARY) is not None


class Browser:
    def __init__(self, process: subprocess.Popen[bytes], to_browser: int, from_browser: int):
        self.process = process
        self.to_browser = to_browser
        self.from_browser = from_browser
        self.next_id = 0
        self.buffer = b""

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (events in between are dropped)."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.from_browser, 1 << 16)
                if not chunk:
                    raise AssertionError(f"chromium closed the pipe during {method}")
                self.buffer += chunk
            raw, _, self.buffer = self.buffer.partition(b"\0")
            answer = json.loads(raw)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise AssertionError(f"{method}: {answer['error']}")
                return dict(answer.get("result") or {})

    def open(self, url: str, timeout_s: float = 30) -> str:
        """A new page at url, loaded; its session id."""
        target = self.call("Target.createTarget", url=url)["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        deadline = time.monotonic() + timeout_s
        loaded = f"location.href === {json.dumps(url)} && document.readyState === 'complete'"
        while not self.evaluate(session, loaded):  # not about:blank, which comes first
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not finish loading within {timeout_s} s")
            time.sleep(0.1)
        return str(session)

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")


@contextmanager
def browser() -> Iterator[Browser]:
    """A headless Chromium of its own profile; no sandbox (tests run as root here)."""
    commands_read, commands_write = os.pipe()
    answers_read, answers_write = os.pipe()
    # Above 4, so that putting them on 3 and 4 in the child cannot clobber one another.
    ours = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (commands_read, answers_write)]
    for fd in (commands_read, answers_write):
        os.close(fd)

    def on_3_and_4() -> None:
        os.dup2(ours[0], 3)
        os.dup2(ours[1], 4)

    with tempfile.TemporaryDirectory(prefix="sm120-chromium-") as profile:
        process = subprocess.Popen(
            [
                BINARY,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            pass_fds=(3, 4),  # made by on_3_and_4, which runs before the others close
            preexec_fn=on_3_and_4,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for fd in ours:
            os.close(fd)
        try:
            yield Browser(process, commands_write, answers_read)
        finally:
            os.close(commands_write)
            os.close(answers_read)
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
