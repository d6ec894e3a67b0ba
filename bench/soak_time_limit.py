"""A soak that reaches its time limit (issue 34 item 3), against the stand-in chat server
(tests/support/fake_chat.py): what the soak counts and what it leaves running when its time
is up while streams are open.

    PYTHONPATH=. .venv/bin/python bench/soak_time_limit.py OUT_DIR

Three cases, each a 3 s soak of 2 streams: a steady server (short answers, many finish);
streams longer than the soak (tokens flowing at the limit, none finished); streams gone quiet
at the limit (below stall_s: no stall, no byte). One JSON line per case: how long run_soak
took to return, its verdict and counts, and the soak's worker threads and this process's
sockets still open when it returned and 2 s later.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

from builder import REPO_ROOT
from builder.manifest.resolve import resolve
from builder.verify.smoke import LiveServer
from builder.verify.smoke_report import SmokeReport
from builder.verify.soak import run_soak
from builder.verify.soak_load import SoakSettings
from tests.support.fake_chat import Behaviour, fake_chat_server, url_of

LIMIT_S = 3.0

CASES = {
    "steady": (Behaviour(tokens=8, token_delay_s=0.01), 5.0),
    "longer than the soak": (Behaviour(tokens=100_000, token_delay_s=0.05), 5.0),
    "quiet at the limit": (Behaviour(tokens=100_000, token_delay_s=0.01, stall_after=1), 30.0),
}


def sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def soak_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("soak-")]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stack = resolve("ci-mini", REPO_ROOT / "stacks")
    for name, (behaviour, stall_s) in CASES.items():
        report = SmokeReport(stack="ci-mini", image="fake", gpu=False, started_at="now")
        before = sockets()
        with fake_chat_server(behaviour) as server:
            live = LiveServer(url_of(server), "tiny", lambda: True, None, report)
            settings = SoakSettings(LIMIT_S, 2, stall_s, 0.0, None)
            began = time.monotonic()
            result = run_soak(
                live, stack, settings, out / name.replace(" ", "-"), log=lambda line: None
            )
            took = time.monotonic() - began
            at_return = (soak_threads(), sockets() - before)
            time.sleep(2)
            later = (soak_threads(), sockets() - before)
        summary = result.summary
        line = {
            "case": name,
            "limit_s": LIMIT_S,
            "stall_s": stall_s,
            "returned_after_s": round(took, 2),
            "passed": result.passed,
            "requests": summary.get("requests"),
            "errors": summary.get("errors"),
            "cut_off_at_end": summary.get("cut_off_at_end", "not counted"),
            "soak threads at return": at_return[0],
            "sockets beyond before at return (the stand-in's own included)": at_return[1],
            "soak threads 2 s later": later[0],
            "sockets 2 s later": later[1],
            "checks": {c["name"]: [c["passed"], c["detail"]] for c in summary["checks"]},
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
