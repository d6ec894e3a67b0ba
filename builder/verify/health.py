"""The one wait for a server's health path: poll it until it answers 2xx, while watching that
the server still runs and saying, every few seconds, how long it has been waited for and what
the server last logged (a 15-minute start is then seen moving or seen stuck).

`test`'s smoke (verify/smoke_server.py) and `deploy`'s health gate (hosts/fleet.py) both wait
here, so they hold a server to one rule: any 2xx is healthy (vLLM's /health answers 200; a
proxy in front of it may answer 204), anything else, or no answer, is not yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

from builder.engine.progress import Say, Throttle

#: Seconds between two asks of the health path.
POLL_S = 1.0
#: Seconds one ask may take: a server busy compiling answers slowly, not never.
ASK_TIMEOUT_S = 5


def healthy(status: int) -> bool:
    """The one rule: a 2xx answer is healthy."""
    return 200 <= status < 300


@dataclass(frozen=True)
class Health:
    """How the wait ended: healthy after waited_s, stopped (why), or out of time."""

    ok: bool
    waited_s: float
    #: The last answer: "HTTP 200", "HTTP 503", an exception's name, or "no answer yet".
    last: str
    #: Why the server can no longer answer (gone, exited, restarted); None when it still could.
    stopped: str | None = None
    #: The last HTTP status (None: no answer).
    status: int | None = None


def wait_healthy(
    url_of: Callable[[], str | None],
    limit_s: float,
    stopped: Callable[[], str | None],
    progress: Say | None = None,
    describe: Callable[[float, str], str] | None = None,
) -> Health:
    """Ask url_of() (None: not known yet) until it answers 2xx or limit_s passes; stopped()
    says why the server can no longer answer (None: it still runs), checked before each ask.
    progress gets describe(waited_s, last) every few seconds."""
    began = time.monotonic()
    last = "no answer yet"
    waiting = Throttle(progress)
    while (waited := time.monotonic() - began) < limit_s:
        why = stopped()
        if why is not None:
            return Health(False, waited, last, why)
        if describe is not None and waiting.due():
            waiting.line(describe(waited, last))
        url = url_of()
        if url is not None:
            try:
                status = requests.get(url, timeout=ASK_TIMEOUT_S).status_code
            except requests.RequestException as exc:
                last = exc.__class__.__name__
            else:
                last = f"HTTP {status}"
                if healthy(status):
                    return Health(True, time.monotonic() - began, last, status=status)
        time.sleep(POLL_S)
    return Health(False, time.monotonic() - began, last)
