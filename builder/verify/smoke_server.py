"""The smoke's server and what is asked of it: a container of the image started (labelled, its
driver cache and the egress watch mounted) or a server at a URL, waited on until /health
answers, watched for a death, and put through the manifest's prompts (cold, warm, a batch, the
throughput runs), each answer judged as it comes.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from builder.engine.owner import OWNER_LABEL, owner
from builder.engine.progress import Say
from builder.engine.protocol import Container, ContainerSpec, Engine, Mount, PortBinding
from builder.errors import EngineError
from builder.manifest.resolve import ResolvedStack
from builder.verify.chat import Completion, stream_chat
from builder.verify.compiles import smoke_environment
from builder.verify.egress import EgressWatch
from builder.verify.garbage import answer_matches, garbage_reasons
from builder.verify.health import wait_healthy
from builder.verify.smoke_judge import DRIVER_CACHE, judge_floor, log_text, rounded
from builder.verify.smoke_report import (
    CHECK_ANSWER,
    CHECK_BATCHED,
    CHECK_GARBAGE,
    CHECK_READY,
    CHECK_REQUEST,
    CHECK_SINGLE,
    CHECK_START,
    CHECK_TTFT,
    CHECK_UP,
    SmokeReport,
)

#: Long enough for a decode rate that short factual answers cannot give; not judged for content.
THROUGHPUT_PROMPT = "Write a short essay about the history of the printing press."

THROUGHPUT_MAX_TOKENS = 128

#: After a failed request, how long a container may still read "running" before it counts as
#: alive: a killed server's requests fail at once, while the engine records its exit a moment
#: later (longer on a loaded machine), and a dead server must not pass "server stays up".
DEATH_SETTLE_S = 5.0

LOG_TAIL_LINES = 25

DRIVER_ENV = {"CUDA_CACHE_PATH": DRIVER_CACHE, "CUDA_CACHE_MAXSIZE": "4294967296"}


def start_container(
    engine: Engine,
    image_ref: str,
    stack: ResolvedStack,
    mounts: dict[str, str],
    gpu: bool,
    report: SmokeReport,
    log: Callable[[str], None],
) -> Container | None:
    """The image's own CMD, its serve port on a free loopback port; None (a failed check) if not."""
    serve = stack.manifest.serve
    name = f"sm120-smoke-{stack.name}-{uuid.uuid4().hex[:8]}"
    egress = EgressWatch.for_image(engine, image_ref)  # every Python process records its egress
    spec = ContainerSpec(
        image=image_ref,
        name=name,
        labels={"sm120-stacks.smoke": stack.name, OWNER_LABEL: owner()},
        environment={**smoke_environment(), **DRIVER_ENV, **egress.environment},
        ports=(PortBinding(serve.port, "127.0.0.1"),),
        shm_size=serve.shm_size,
        mounts=(
            *(Mount(host, inside, read_only=True) for host, inside in mounts.items()),
            egress.mount,
        ),
        gpus="all" if gpu else None,
    )
    log(f"smoke: starting {image_ref} ({'GPU' if gpu else 'no GPU'})")
    try:
        container = engine.run(spec)
    except EngineError as exc:
        report.add(CHECK_START, False, f"{exc.__class__.__name__}: {exc.explanation}"[:1000])
        _remove_named(engine, name)  # created, then refused at start (e.g. no GPU)
        return None
    report.add(CHECK_START, True, f"{container.name} ({container.short_id})")
    return container


class Endpoint:
    """The server under test and what is asked of it over HTTP; results go into the report.

    Subclasses say whether it still runs, how it stopped, and where it listens: a container
    the smoke started (`ContainerServer`) or a server it did not start (`UrlServer`).
    """

    def __init__(
        self,
        stack: ResolvedStack,
        report: SmokeReport,
        log: Callable[[str], None],
        progress: Say | None = None,
    ) -> None:
        self.stack = stack
        self.report = report
        self.log = log
        self.progress = progress
        serve = stack.manifest.serve
        self.model = serve.served_model_name or serve.model.id
        self.base_url: str | None = None
        self.died = False
        #: Sent with every chat request (the API key of a server that wants one).
        self.headers: dict[str, str] = {}

    # -- lifecycle --

    def wait_ready(self) -> bool:
        """Poll /health until 2xx (verify/health.py's one rule); a container that exits
        meanwhile died, it did not time out."""
        timeout = self.stack.manifest.smoke.health_timeout_s

        def describe(waited: float, last: str) -> str:
            return (
                f"smoke: waiting for /health, {waited:.0f} s of {timeout} s; the server last "
                f"logged: {self._last_log_line() or '(nothing yet)'}"
            )

        health = wait_healthy(
            lambda: self._url("/health"),
            timeout,
            lambda: None if self._running() else "stopped",
            self.progress,
            describe,
        )
        if health.stopped is not None:
            self._record_death("during startup")
            return False
        if health.ok:
            said = f"/health {health.status} after {health.waited_s:.1f} s"
            self.report.add(CHECK_READY, True, said)
            self.log(f"smoke: server ready after {health.waited_s:.1f} s")
            return True
        self.report.add(CHECK_READY, False, f"no 2xx from /health within {timeout} s")
        return False

    def check_alive(self) -> None:
        if self.died:
            return
        failed = any(c.error for c in self.report.completions)
        if self._still_running(DEATH_SETTLE_S if failed else 0.0):
            self.report.add(CHECK_UP, True, "still running after the smoke requests")
        else:
            self._record_death("while serving")

    def _still_running(self, settle_s: float) -> bool:
        """Running now and for settle_s more (see DEATH_SETTLE_S)."""
        deadline = time.monotonic() + settle_s
        while self._running():
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.2)
        return False

    def _running(self) -> bool:
        raise NotImplementedError

    def _record_death(self, when: str) -> None:
        raise NotImplementedError

    def _url(self, path: str) -> str | None:
        raise NotImplementedError

    def _last_log_line(self) -> str:
        """What the server logged last (a model loading, a kernel compiling): the health
        wait's lines say it, so a 15-minute start is seen moving or seen stuck."""
        raise NotImplementedError

    # -- requests --

    def exercise(self) -> None:
        """Cold and warm single requests, a concurrent batch, then the throughput runs."""
        smoke = self.stack.manifest.smoke
        prompts = [(p.prompt, p.max_tokens, p.expect) for p in smoke.prompts]
        cold = [self._judged("cold", *p) for p in prompts]
        if self._gave_up(cold):
            return
        warm = [self._judged("warm", *p) for p in prompts]
        batch_prompts = [prompts[i % len(prompts)] for i in range(smoke.concurrency)]
        batch, _ = self._concurrent("batch", batch_prompts) if prompts else ([], 0.0)
        for completion, (_, _, expect) in zip(batch, batch_prompts, strict=True):
            self._judge(completion, expect)
        if self._gave_up(warm + batch):
            return
        self._throughput(smoke.concurrency)
        self._numbers(cold, warm)

    def _gave_up(self, completions: list[Completion]) -> bool:
        """A failed request may mean a dead server: stop asking, say so once."""
        if any(c.error for c in completions) and not self._still_running(DEATH_SETTLE_S):
            self._record_death("while serving")
            return True
        return False

    def _judged(self, phase: str, prompt: str, max_tokens: int, expect: str) -> Completion:
        completion = self._chat(phase, prompt, max_tokens)
        self._judge(completion, expect)
        return completion

    def _judge(self, completion: Completion, expect: str) -> None:
        label = f"[{completion.phase}] {completion.prompt[:60]}"
        if completion.error:
            self.report.add(CHECK_REQUEST, False, f"{label}: {completion.error}")
            return
        self.report.add(CHECK_REQUEST, True, label)
        answer = f"{label} -> {completion.text[:200]!r}"
        matched = answer_matches(completion.text, expect)
        self.report.add(CHECK_ANSWER, matched, answer + ("" if matched else f" !~ /{expect}/i"))
        reasons = garbage_reasons(completion.text)
        self.report.add(CHECK_GARBAGE, not reasons, "; ".join(reasons) or answer)

    def _concurrent(
        self, phase: str, prompts: list[tuple[str, int, str]]
    ) -> tuple[list[Completion], float]:
        """All at once from threads; returns the completions and the wall time of the batch."""
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            futures = [pool.submit(self._chat, phase, p, n) for p, n, _ in prompts]
            completions = [f.result() for f in futures]
        return completions, time.monotonic() - began

    def _throughput(self, concurrency: int) -> None:
        single = self._chat("throughput", THROUGHPUT_PROMPT, THROUGHPUT_MAX_TOKENS)
        self._require_success(single)
        self.report.single_stream_tok_s = rounded(single.decode_tok_s)
        runs = [(THROUGHPUT_PROMPT, THROUGHPUT_MAX_TOKENS, "")] * concurrency
        batch, wall = self._concurrent("throughput-batch", runs)
        for completion in batch:
            self._require_success(completion)
        if wall > 0 and not any(c.error for c in batch):
            self.report.batched_tok_s = rounded(sum(c.tokens for c in batch) / wall)

    def _require_success(self, completion: Completion) -> None:
        label = f"[{completion.phase}] throughput prompt"
        detail = completion.error or f"{completion.tokens} tokens in {completion.total_s:.2f} s"
        self.report.add(CHECK_REQUEST, completion.error is None, f"{label}: {detail}")

    def _numbers(self, cold: list[Completion], warm: list[Completion]) -> None:
        report, floors = self.report, self.stack.manifest.smoke.floors
        cold_ttft = [c.ttft_s for c in cold if c.ttft_s is not None]
        warm_ttft = [c.ttft_s for c in warm if c.ttft_s is not None]
        report.ttft_cold_s = rounded(cold_ttft[0]) if cold_ttft else None
        report.ttft_s = rounded(max(warm_ttft)) if warm_ttft else None
        if floors.max_ttft_s is not None:
            ok = report.ttft_s is not None and report.ttft_s <= floors.max_ttft_s
            report.add(CHECK_TTFT, ok, f"{report.ttft_s} s (at most {floors.max_ttft_s} s)")
        judge_floor(report, CHECK_SINGLE, report.single_stream_tok_s, floors.single_stream_tok_s)
        judge_floor(report, CHECK_BATCHED, report.batched_tok_s, floors.batched_tok_s)

    def _chat(self, phase: str, prompt: str, max_tokens: int) -> Completion:
        url = self._url("/v1/chat/completions")
        if url is None:
            completion = Completion(
                phase, prompt, error="ValueError: the serve port is not published"
            )
        else:
            completion = stream_chat(
                url, self.model, prompt, max_tokens, phase=phase, headers=self.headers
            )
        self.report.completions.append(completion)
        if completion.error is None and self.report.mode is None:
            self.report.mode = "streaming" if completion.streamed else "non-streaming"
        return completion


class ContainerServer(Endpoint):
    """A smoke container the tool started from the image."""

    def __init__(
        self,
        container: Container,
        stack: ResolvedStack,
        report: SmokeReport,
        log: Callable[[str], None],
        progress: Say | None = None,
    ) -> None:
        super().__init__(stack, report, log, progress)
        self.container = container

    def _running(self) -> bool:
        self.container.reload()
        state = self.container.attrs.get("State", {})
        return bool(state.get("Running")) and not state.get("Restarting")

    def _record_death(self, when: str) -> None:
        self.died = True
        state = self.container.attrs.get("State", {})
        self.report.exit_code = state.get("ExitCode")
        tail = [line for line in log_text(self.container).splitlines() if line.strip()]
        detail = (
            f"server died {when}: exit code {state.get('ExitCode')}"
            f"{' (OOM killed)' if state.get('OOMKilled') else ''}"
            f"{', ' + state['Error'] if state.get('Error') else ''}"
            f"; last log line: {tail[-1][:200] if tail else '(empty log)'}\n"
            + "\n".join(tail[-LOG_TAIL_LINES:])
        )
        self.report.add(CHECK_UP, False, detail)
        self.log(f"smoke: server died {when} (exit code {state.get('ExitCode')})")

    def _url(self, path: str) -> str | None:
        if self.base_url is None:
            ports = self.container.attrs.get("NetworkSettings", {}).get("Ports") or {}
            bound = ports.get(f"{self.stack.manifest.serve.port}/tcp") or []
            if not bound:
                return None
            self.base_url = f"http://127.0.0.1:{bound[0]['HostPort']}"
        return self.base_url + path

    def _last_log_line(self) -> str:
        return _last_line(log_text(self.container).splitlines())


class UrlServer(Endpoint):
    """A server the tool did not start: it runs while it answers HTTP at all (any status).

    While it starts, not answering is waiting, not dying: the caller may start the server and
    the smoke together. The health timeout is the manifest's.
    """

    def __init__(
        self,
        base_url: str,
        stack: ResolvedStack,
        report: SmokeReport,
        log: Callable[[str], None],
        server_log: Path | None,
        progress: Say | None = None,
    ) -> None:
        super().__init__(stack, report, log, progress)
        self.root = base_url.rstrip("/")
        self.base_url = self.root
        self.server_log = server_log
        self.ready = False
        self.last_error = ""

    def wait_ready(self) -> bool:
        self.ready = super().wait_ready()
        return self.ready

    def check_alive(self) -> None:
        if self.ready:  # never answered: "server ready" failed, nothing to say about staying up
            super().check_alive()

    def _running(self) -> bool:
        if not self.ready:
            return True
        try:
            requests.get(self.root + "/health", timeout=5)
        except requests.RequestException as exc:
            self.last_error = f"{exc.__class__.__name__}: {exc}"[:300]
            return False
        return True

    def _record_death(self, when: str) -> None:
        self.died = True
        tail = _file_tail(self.server_log)
        detail = f"server stopped answering {when}: {self.last_error or 'no HTTP answer'}"
        if tail:
            detail += f"; last log line: {tail[-1][:200]}\n" + "\n".join(tail)
        self.report.add(CHECK_UP, False, detail)
        self.log(f"smoke: server at {self.root} stopped answering {when}")

    def _url(self, path: str) -> str | None:
        return self.root + path

    def _last_log_line(self) -> str:
        if self.server_log is None:
            return "(no server log given)"
        return _last_line(_file_tail(self.server_log))


def _last_line(lines: list[str]) -> str:
    """The last line with text, cut to a line's width."""
    text = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return text[:200]


def _file_tail(path: Path | None) -> list[str]:
    if path is None or not path.is_file():
        return []
    lines = path.read_text(errors="replace").splitlines()
    return [line for line in lines if line.strip()][-LOG_TAIL_LINES:]


def remove_container(container: Container) -> None:
    with contextlib.suppress(EngineError):  # already gone: nothing left to clean up
        container.remove(force=True)


def _remove_named(engine: Engine, name: str) -> None:
    with contextlib.suppress(EngineError):
        container = engine.container(name)
        if container is not None:
            remove_container(container)
