"""Progress of long work. The build: a live one-line status on a terminal, BuildKit's plain
lines otherwise; both read the same `--progress=plain` stream, which also goes whole into the
build log, and the step table they keep names the failing step when a build breaks. Pushes,
pulls, health waits and soaks: a line every few seconds at most (`Throttle`, `LayerProgress`).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from builder.engine.protocol import LayerEvent

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


# --- long work: throttled progress lines -------------------------------------------------------

#: Long work (a push or pull of an 11-14 GB image, a health wait, a soak) says it is alive at
#: most this often: enough to see it move, few enough to keep a CI log readable.
EVERY_S = 5.0

#: Where progress lines go (the command line: stderr); None: nowhere (--json asked).
Say = Callable[[str], None]


class Throttle:
    """Lets a line through at most once every `every_s` seconds (default EVERY_S), unless
    forced: a push sends thousands of events, a soak ticks five times a second."""

    def __init__(
        self,
        say: Say | None,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.say = say
        self.every_s = EVERY_S if every_s is None else every_s
        self.clock = clock
        self.last = clock()

    def due(self) -> bool:
        """Whether a line would go out now (so its text is worth making)."""
        return self.say is not None and self.clock() - self.last >= self.every_s

    def line(self, text: str, *, force: bool = False) -> None:
        if self.say is None or not (force or self.due()):
            return
        self.last = self.clock()
        self.say(text)


#: A layer the engine has no more to do for, by the status it ends with (push, then pull).
_LAYER_DONE = ("Pushed", "Layer already exists", "Mounted from", "Pull complete", "Already exists")
#: Statuses that carry byte counts, and the phase a line names for them.
_LAYER_PHASES = {"Pushing": "pushing", "Downloading": "downloading", "Extracting": "extracting"}
#: At most this many layers named in one line (the rest counted).
_LAYERS_SHOWN = 4


@dataclass
class _Layer:
    phase: str = "waiting"
    current: int = 0
    total: int = 0
    done: bool = False


class LayerProgress:
    """A push or pull as lines a person reads: every few seconds, how many layers are done and
    each moving layer's bytes and percent; a last line when it ends. Fed the engine's layer
    events (builder.engine.protocol.LayerEvent) as they stream in."""

    def __init__(
        self,
        action: str,
        ref: str,
        say: Say | None,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.action = action
        self.ref = ref
        self.throttle = Throttle(say, every_s, clock)
        self.clock = clock
        self.started = clock()
        self.layers: dict[str, _Layer] = {}

    def __call__(self, event: LayerEvent) -> None:
        if not event.layer or event.status.startswith("Pulling from"):
            return  # the stream's own lines (the repository, the tag, the digest)
        layer = self.layers.setdefault(event.layer, _Layer())
        if event.status.startswith(_LAYER_DONE):
            layer.done, layer.phase = True, "done"
            layer.current = max(layer.current, layer.total)
        elif event.status in _LAYER_PHASES:
            layer.phase = _LAYER_PHASES[event.status]
            layer.current = event.current or 0
            layer.total = event.total or layer.total
        if self.throttle.due():
            self.throttle.line(self.status())

    def status(self) -> str:
        done = sum(layer.done for layer in self.layers.values())
        moving = [
            (key, layer) for key, layer in self.layers.items() if layer.total and not layer.done
        ]
        parts = [f"{self.action} {self.ref}: {done} of {len(self.layers)} layers done"]
        for key, layer in moving[:_LAYERS_SHOWN]:
            percent = min(100, 100 * layer.current // layer.total)
            parts.append(
                f"{key[:12]} {layer.phase} {_size(layer.current)} of {_size(layer.total)} "
                f"({percent}%)"
            )
        if len(moving) > _LAYERS_SHOWN:
            parts.append(f"{len(moving) - _LAYERS_SHOWN} more moving")
        return "; ".join(parts)

    def finish(self) -> None:
        """The last line: every layer, and how long it took."""
        moved = sum(layer.total for layer in self.layers.values() if layer.total)
        self.throttle.line(
            f"{self.action} {self.ref}: {len(self.layers)} layers done "
            f"({_size(moved)} moved) in {self.clock() - self.started:.0f} s",
            force=True,
        )


def _size(count: int) -> str:
    """Bytes as a person reads them: 812 MB, 2.10 GB."""
    if count >= 1e9:
        return f"{count / 1e9:.2f} GB"
    if count >= 1e6:
        return f"{count / 1e6:.0f} MB"
    return f"{count / 1e3:.0f} kB"
