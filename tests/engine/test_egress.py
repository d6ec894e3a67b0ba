"""The smoke's "no outbound connection" check on ci-mini's real server, in a real container.

ci-mini's pinned server (transformers serve, the model a local folder, HF_HUB_OFFLINE=1) must
pass with every Python process watched; the same server made to reach a documentation-range
address (192.0.2.1, RFC 5737: routed nowhere) from a module of its own must fail the check,
naming the address and that module, and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from builder.manifest.resolve import ResolvedStack
from builder.verify.egress import CHECK_EGRESS, events_path
from tests.engine.test_smoke import failed_names, site_packages, smoke, smoke_stack

__all__ = ["smoke_stack"]  # the fixture, imported for the tests below

pytestmark = [
    pytest.mark.engine,
    pytest.mark.needs_ci_mini("a real transformers server pinned with no network"),
]

#: Loaded by site (a .pth line) in every Python of the container; acts only in the server, as
#: a probe at start would: one TCP connect that nothing answers, from a thread the server starts
#: (site runs .pth lines before sitecustomize, where the watch is: see docs/gpu-host.md).
PHONE_HOME = """
import socket
import sys
import threading


def _probe():
    try:
        socket.create_connection(("192.0.2.1", 9), timeout=0.5).close()
    except OSError:
        pass


if "serve" in sys.argv:
    threading.Timer(1.0, _probe).start()
"""


def egress_check(report: Any) -> Any:
    return next(check for check in report.checks if check.name == CHECK_EGRESS)


def test_the_pinned_server_reaches_nothing(
    api: Any,
    ci_mini: dict[str, str],
    smoke_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
) -> None:
    report = smoke(api, ci_mini, smoke_stack, models["trained"], tmp_path)
    check = egress_check(report)
    assert check.passed, check.detail
    assert check.detail.startswith("0 outbound attempts; ")
    raw = events_path(tmp_path / "smoke.json").read_text().splitlines()
    watched = [json.loads(line) for line in raw]
    # The server itself was watched from its start, not only some helper process.
    assert any("serve" in w["process"] for w in watched if w["event"] == "watching")
    assert report.passed, report.failed()


def test_a_server_that_connects_out_fails_naming_where_and_who(
    api: Any,
    ci_mini: dict[str, str],
    smoke_stack: ResolvedStack,
    models: dict[str, Path],
    tmp_path: Path,
) -> None:
    site = site_packages(api, ci_mini, smoke_stack)
    module = tmp_path / "zz_phone_home.py"
    module.write_text(PHONE_HOME)
    pth = tmp_path / "zz_phone_home.pth"
    pth.write_text("import zz_phone_home\n")
    for path in (module, pth):
        path.chmod(0o644)
    mounts = {str(module): f"{site}/zz_phone_home.py", str(pth): f"{site}/zz_phone_home.pth"}
    report = smoke(api, ci_mini, smoke_stack, models["trained"], tmp_path / "report", mounts)
    assert failed_names(report) == {CHECK_EGRESS}
    detail = egress_check(report).detail
    assert "tcp connect 192.0.2.1:9 by zz_phone_home:" in detail, detail
    assert detail.startswith("1 outbound attempt(s), 1 distinct; "), detail
