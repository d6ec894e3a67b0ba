"""Build progress: a live one-line status on a terminal, BuildKit's plain lines otherwise.

Both read the same `--progress=plain` stream, which also goes whole into the build log; the
step table they keep is what names the failing step when a build breaks.
"""

from __future__ import annotations

import re
import sys
import time
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

STEP = re.compile(r"^#(\d+) (\[[^\]]+\].*)$")
ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")
#: The client was stopped (Ctrl-C, SIGTERM, a killed client): BuildKit cancels the running step.
CANCELED = re.compile(r"^#(\d+) CANCELED$")
DONE = re.compile(r"^#(\d+) (DONE|CACHED)")
#: Importing a --cache-from source: a source the registry lacks fails this step alone, and the
#: build goes on without it (builder.image.buildcache).
CACHE_IMPORT = re.compile(r"^#(\d+) importing cache manifest from (\S+)")
#: Inside a long step: the precompile tool's module lines and ninja's [n/N] counter.
DETAIL = re.compile(r"^#\d+ [\d.]+ (flashinfer_jit: .*|\[\d+/\d+\] \S+)")


class StepTracker:
    """Remembers what each BuildKit step is, and which one failed."""

    def __init__(self) -> None:
        self.titles: dict[str, str] = {}
        self.current: str | None = None
        self.failed: tuple[str, str] | None = None
        self.finished = 0
        self.detail = ""
        self.cache_imports: dict[str, str] = {}
        #: Cache sources that could not be imported, with the reason: not a build failure.
        self.cache_misses: dict[str, str] = {}

    def feed(self, line: str) -> None:
        if match := STEP.match(line):
            self.titles[match.group(1)] = match.group(2)
            self.current = match.group(2)
            self.detail = ""
        elif match := DETAIL.match(line):
            self.detail = match.group(1)
        elif match := CACHE_IMPORT.match(line):
            self.cache_imports[match.group(1)] = match.group(2)
        elif match := ERROR.match(line):
            source = self.cache_imports.get(match.group(1))
            if source is not None:
                self.cache_misses[source] = match.group(2)
            else:
                self._fail(match.group(1), match.group(2))
        elif match := CANCELED.match(line):
            self._fail(
                match.group(1), f"canceled (last: {self.detail})" if self.detail else "canceled"
            )
        elif DONE.match(line):
            self.finished += 1

    def _fail(self, step_id: str, reason: str) -> None:
        """Keep the first failure: later ones are BuildKit cancelling the steps beside it."""
        if self.failed is None:
            self.failed = (self.titles.get(step_id, f"step #{step_id}"), reason)


class Progress:
    """Shows the build as it runs; `live` picks the terminal display."""

    def __init__(self, stack: str, live: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.tracker = StepTracker()
        self.stack = stack
        self.started = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> Progress:
        if self.live:
            self._live = Live(self._status(), console=Console(file=self.stream), transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def line(self, line: str) -> None:
        self.tracker.feed(line)
        if self._live is not None:
            self._live.update(self._status())
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def _status(self) -> Text:
        elapsed = time.monotonic() - self.started
        step = (self.tracker.current or "starting")[:90]
        detail = f"\n  {self.tracker.detail[:120]}" if self.tracker.detail else ""
        return Text(
            f"building {self.stack}  {elapsed:5.0f}s  steps done {self.tracker.finished}  "
            f"{step}{detail}"
        )
