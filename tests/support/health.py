"""Waiting for a server the test started to answer its health path."""

from __future__ import annotations

import time

import requests


def wait_healthy(url: str, timeout_s: float, poll_s: float = 0.5) -> None:
    """Until GET url/health answers 200; an AssertionError naming the URL after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health", timeout=3).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(poll_s)
    raise AssertionError(f"{url}/health did not answer 200 within {timeout_s:.0f} s")
