"""The soak's load and what it measures while it runs: `concurrency` workers streaming chat
through prompts of mixed lengths, every token's time kept per time bucket, the server's memory
sampled, and the run ended at once by a stall, growth past its bound or a server that stopped
(builder/verify/soak.py runs it and judges it).
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from builder.engine.progress import Say, Throttle
from builder.manifest.resolve import ResolvedStack
from builder.verify.chat import stream_chat
from builder.verify.smoke import LiveServer
from builder.verify.smoke_server import THROUGHPUT_MAX_TOKENS, THROUGHPUT_PROMPT

#: Every soak request says what it is: a server's access log (or a test's hook in the server)
#: tells the soak's requests from the smoke's.
USER_AGENT = "sm120-stacks-soak"

TICK_S = 0.2

MEMORY_EVERY_S = 1.0

ALIVE_EVERY_S = 1.0

CONNECT_TIMEOUT_S = 10.0

#: After the soak ends (or fails), how long workers get to notice; a request still open then
#: (cut off by the end, or held by a stalled server) counts neither as done nor as failed.
GRACE_S = 1.0

#: Buckets of the time series: at least one second, at most this many rows.
MAX_BUCKETS = 720

#: Inter-token gaps kept for percentiles (a uniform sample beyond that: hours of streaming).
GAP_SAMPLE = 200_000

LONG_PROMPT = (
    "Read the following notes and then summarize them in a few sentences.\n\n"
    + "\n".join(
        f"Note {i}: the build of stack {i} took {7 * i + 3} minutes on two cores; its "
        f"FlashInfer cache held {i % 5 + 1} modules and its smoke answered in {i % 3 + 1} "
        "seconds. The serving host ran it for a week without a restart."
        for i in range(1, 6)
    )
)

LONG_MAX_TOKENS = 128

#: A progress line per this many seconds of soak (streams, tokens/s, TTFT, memory).
PROGRESS_EVERY_S = 10.0


#: The warm-up (first allocations, caches filling): this share of the soak, within bounds.
WARMUP_FRACTION, WARMUP_MIN_S, WARMUP_MAX_S = 0.1, 2.0, 120.0


@dataclass(frozen=True)
class SoakSettings:
    seconds: float
    concurrency: int
    stall_s: float
    max_error_rate: float
    max_memory_growth_mb: float | None

    @classmethod
    def for_stack(cls, stack: ResolvedStack, seconds: float | None = None) -> SoakSettings:
        """The manifest's smoke.soak; `seconds` (the command line's --soak) overrides its own."""
        smoke = stack.manifest.smoke
        soak = smoke.soak
        return cls(
            seconds=float(soak.seconds if seconds is None else seconds),
            concurrency=soak.concurrency or smoke.concurrency,
            stall_s=soak.stall_s,
            max_error_rate=soak.max_error_rate,
            max_memory_growth_mb=soak.max_memory_growth_mb,
        )


@dataclass(frozen=True)
class SoakPrompt:
    kind: str
    prompt: str
    max_tokens: int


def soak_prompts(stack: ResolvedStack) -> list[SoakPrompt]:
    """Mixed lengths: the manifest's smoke prompts (short), an essay (medium), a long context."""
    short = [SoakPrompt("short", p.prompt, p.max_tokens) for p in stack.manifest.smoke.prompts]
    return [
        *(short or [SoakPrompt("short", "Say hello in one sentence.", 32)]),
        SoakPrompt("medium", THROUGHPUT_PROMPT, THROUGHPUT_MAX_TOKENS),
        SoakPrompt("long", LONG_PROMPT, LONG_MAX_TOKENS),
    ]


#: Bytes the server uses now, or None when that cannot be said this time.
MemoryProbe = Callable[[], int | None]


def process_tree_rss(pid: int, proc: Path = Path("/proc")) -> int | None:
    """Resident bytes of pid and every process under it (vLLM's engine core is a child of its
    API server); None once pid is gone. Pages two processes share are counted in each."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            status = (entry / "status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            ppid = int(fields["PPid"].strip())
            kib = int(fields.get("VmRSS", "0 kB").split()[0])
            children.setdefault(ppid, []).append(int(entry.name))
            rss[int(entry.name)] = kib * 1024
    if pid not in rss:
        return None
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += rss.get(current, 0)
        todo.extend(children.get(current, []))
    return total


@dataclass(eq=False)
class _Request:
    kind: str
    opened: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    done: float | None = None
    error: str | None = None

    @property
    def quiet_since(self) -> float:
        return self.last if self.last is not None else self.opened


@dataclass
class TimeBucket:
    tokens: int = 0
    completed: int = 0
    errors: int = 0
    open_streams: int = 0
    ttfts: list[float] = field(default_factory=list)
    memory_mb: float | None = None


class SoakRun:
    def __init__(
        self,
        server: LiveServer,
        settings: SoakSettings,
        prompts: list[SoakPrompt],
        memory: MemoryProbe | None,
        progress: Say | None = None,
    ) -> None:
        self.server = server
        self.progress = Throttle(progress, PROGRESS_EVERY_S)
        #: Tokens counted at the last progress line (its rate is over the interval since).
        self.said_tokens = (0.0, 0)
        self.settings = settings
        self.prompts = prompts
        self.memory = memory
        self.lock = threading.Lock()
        self.drain = threading.Event()  # no new requests
        self.abort = threading.Event()  # stop reading: requests still open are left out
        self.open: set[_Request] = set()
        self.finished: list[_Request] = []
        self.width = max(1.0, math.ceil(settings.seconds / MAX_BUCKETS))
        self.buckets: dict[int, TimeBucket] = {}
        self.gaps: list[float] = []
        self.gaps_seen = 0
        self.sampler = random.Random(0)
        self.longest_quiet = 0.0
        self.memory_samples: list[tuple[float, float]] = []
        self.baseline_mb: float | None = None
        self.stopped: str | None = None
        self.stall: tuple[float, float, int] | None = None
        self.started = time.monotonic()
        self.ran_s = 0.0
        self.read_timeout = max(30.0, 2 * settings.stall_s)
        #: The response each worker is reading (by thread), so the end can cut it off.
        self.reading: dict[int, requests.Response] = {}
        #: Requests still open when the soak ended (left out of the counts).
        self.cut_off = 0

    def now(self) -> float:
        return time.monotonic() - self.started

    def bucket(self, at: float) -> TimeBucket:
        return self.buckets.setdefault(int(at // self.width), TimeBucket())

    # -- workers --

    def worker(self, index: int) -> None:
        session = requests.Session()
        session.headers.update(self.server.headers)
        session.headers["User-Agent"] = USER_AGENT
        session.hooks["response"].append(self.reading_now)
        turn = 0
        while not self.drain.is_set():
            self.request(session, self.prompts[(index + turn) % len(self.prompts)])
            turn += 1

    def request(self, session: requests.Session, prompt: SoakPrompt) -> None:
        request = _Request(prompt.kind, self.now())
        with self.lock:
            self.open.add(request)

        def on_text() -> bool:
            if self.abort.is_set():
                return False
            self.token(request)
            return True

        try:
            completion = stream_chat(
                self.server.base_url + "/v1/chat/completions",
                self.server.model,
                prompt.prompt,
                prompt.max_tokens,
                session=session,
                timeout=(CONNECT_TIMEOUT_S, self.read_timeout),
                require_stream=True,
                on_text=on_text,
            )
            request.error = None if completion.stopped else completion.error
        finally:
            with self.lock:
                self.reading.pop(threading.get_ident(), None)
            self.finish(request)

    def reading_now(self, response: requests.Response, *args: object, **kwargs: object) -> None:
        """The session's response hook: the answer this worker reads (its headers are in)."""
        with self.lock:
            self.reading[threading.get_ident()] = response

    def token(self, request: _Request) -> None:
        at = self.now()
        with self.lock:
            if request.last is None:
                request.first = at
                self.bucket(at).ttfts.append(at - request.opened)
            else:
                self.keep_gap(at - request.last)
            request.last = at
            request.tokens += 1
            self.bucket(at).tokens += 1

    def keep_gap(self, gap: float) -> None:
        """A uniform sample of every gap (reservoir sampling), bounded for long soaks."""
        self.gaps_seen += 1
        if len(self.gaps) < GAP_SAMPLE:
            self.gaps.append(gap)
        else:
            slot = self.sampler.randrange(self.gaps_seen)
            if slot < GAP_SAMPLE:
                self.gaps[slot] = gap

    def finish(self, request: _Request) -> None:
        at = self.now()
        with self.lock:
            self.open.discard(request)
            if self.abort.is_set():
                # Open when the soak ended (its reader cut off, or an answer or error that came
                # after): neither a success nor the server's failure, and the verdict may be
                # being drawn now.
                request.error = "ended by the soak"
                return
            request.done = at
            self.finished.append(request)
            bucket = self.bucket(at)
            if request.error is None:
                bucket.completed += 1
            else:
                bucket.errors += 1

    # -- the monitor --

    def run(self) -> None:
        threads = [
            threading.Thread(target=self.worker, args=(i,), daemon=True, name=f"soak-{i}")
            for i in range(self.settings.concurrency)
        ]
        for thread in threads:
            thread.start()
        next_memory = next_alive = 0.0
        while True:
            at = self.now()
            if at >= self.settings.seconds:
                break
            if at >= next_alive:
                next_alive = at + ALIVE_EVERY_S
                if not self.server.running():
                    self.stopped = f"the server stopped {at:.1f} s into the soak"
                    break
            if self.stalled(at):
                break
            if self.memory is not None and at >= next_memory:
                next_memory = at + MEMORY_EVERY_S
                if self.grew_too_much(at):
                    break
            if self.progress.due():
                self.progress.line(self.status(at))
            time.sleep(TICK_S)
        self.drain.set()
        with self.lock:
            self.abort.set()
            self.cut_off = len(self.open)
            cut = list(self.reading.values())
        for response in cut:
            _cut_off(response)
        for thread in threads:
            thread.join(timeout=GRACE_S / max(1, len(threads)))
        self.ran_s = self.now()

    def status(self, at: float) -> str:
        """The progress line: the soak's streams, its rate since the last line, TTFT so far
        (p50, p99 of the requests that have a first token) and the server's memory."""
        with self.lock:
            streams = len(self.open)
            tokens = sum(bucket.tokens for bucket in self.buckets.values())
            ttfts = sorted(r.first - r.opened for r in self.finished if r.first is not None)
            ttfts += [r.first - r.opened for r in self.open if r.first is not None]
        ttfts.sort()
        since, counted = self.said_tokens
        self.said_tokens = (at, tokens)
        rate = (tokens - counted) / (at - since) if at > since else 0.0
        memory = "not measured"
        if self.memory_samples:
            mb = self.memory_samples[-1][1]
            grown = f" ({mb - self.baseline_mb:+.0f} MB)" if self.baseline_mb is not None else ""
            memory = f"{mb:.0f} MB{grown}"
        return (
            f"soak: {at:.0f} s of {self.settings.seconds:.0f} s: {streams} streams open, "
            f"{rate:.1f} tok/s, ttft p50 {_ms(percentile(ttfts, 50))} "
            f"p99 {_ms(percentile(ttfts, 99))}, memory {memory}, "
            f"{len(self.finished)} requests done"
        )

    def stalled(self, at: float) -> bool:
        with self.lock:
            open_now = list(self.open)
            self.bucket(at).open_streams = max(self.bucket(at).open_streams, len(open_now))
        if not open_now:
            return False
        quiet = at - max(r.quiet_since for r in open_now)
        self.longest_quiet = max(self.longest_quiet, quiet)
        if quiet < self.settings.stall_s:
            return False
        if not self.server.running():
            self.stopped = f"the server stopped {at:.1f} s into the soak"
            return True
        self.stall = (at, quiet, len(open_now))
        self.stopped = f"stalled {at:.1f} s into the soak"
        return True

    def grew_too_much(self, at: float) -> bool:
        assert self.memory is not None
        try:
            value = self.memory()
        except Exception:  # a probe that fails once (the engine busy) is a missing sample
            value = None
        if value is None:
            return False
        mb = value / 1e6
        self.memory_samples.append((at, mb))
        self.bucket(at).memory_mb = mb
        warmup = min(WARMUP_MAX_S, max(WARMUP_MIN_S, WARMUP_FRACTION * self.settings.seconds))
        if at <= warmup or self.baseline_mb is None:
            self.baseline_mb = mb
            return False
        limit = self.settings.max_memory_growth_mb
        if limit is not None and mb - self.baseline_mb > limit:
            self.stopped = f"memory past its bound {at:.1f} s into the soak"
            return True
        return False


def _cut_off(response: requests.Response) -> None:
    """End a worker's read now: a stream the server keeps quiet would hold its thread and
    socket (and the server's work on it) for up to the read timeout after the soak ended.
    urllib3 2.3+ shuts the socket down, which wakes a read blocked in another thread; an older
    one only closes the response."""
    shutdown = getattr(response.raw, "shutdown", None)
    with contextlib.suppress(Exception):
        if callable(shutdown):
            shutdown()
        else:
            response.close()


def percentile(ordered: list[float], pct: float) -> float | None:
    """Nearest rank over sorted values."""
    if not ordered:
        return None
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"
