"""`deploy --apply` when the pinned digest is not on the engine and its registry cannot be
reached: the roll stops at the pull, before any container, so the host's running server is not
touched and the rollback line says nothing was rolled back (it once "removed its failed
container", the very server that was running). The engine's error is said as one readable
line, not two run together."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from builder.hosts.fleet import FAILED, Fleet, GateResult, roll
from builder.hosts.pins import LABEL_HOST, PIN_SCHEMA, Pin
from tests.engine.conftest import LOCAL_BASE, unique
from tests.support.net import free_port

pytestmark = pytest.mark.engine


def test_an_unreachable_registry_stops_the_roll_before_any_container(engine: Any, api: Any) -> None:
    from docker.errors import ImageNotFound

    try:
        api.images.get(LOCAL_BASE)
    except ImageNotFound:
        pytest.skip(f"{LOCAL_BASE} is not here (scripts/make-base-local.sh makes it)")
    host = unique("deploy-outage")
    gone = f"127.0.0.1:{free_port()}/sm120-outage/server@sha256:" + "e" * 64
    pin = Pin.model_validate(
        {
            "schema_version": PIN_SCHEMA,
            "host": host,
            "stack": "deploy-outage-test",
            "content_hash": "0" * 64,
            "image": gone,
            "pinned_at": "2026-12-01T00:00:00Z",
            "container": f"sm120-stacks-{host}",
            "command": ["sleep", "600"],
            "serve_port": 8000,
            "gpus": "none",
            "shm_size": "64m",
            "health": {"interval_s": 600, "start_period_s": 60},
            "needs": {"cuda": "13.0.2", "min_driver": None, "targets": {"sm120": "12.0"}},
        }
    )
    running = api.containers.run(
        LOCAL_BASE, ["sleep", "600"], name=pin.container, detach=True,
        labels={LABEL_HOST: host},
    )  # fmt: skip
    said: list[str] = []
    try:
        plan = Fleet(
            connect=lambda p: engine,
            gate=lambda p, e: GateResult(True, "never asked"),
            previous=lambda h: None,
            log=said.append,
        )
        (result,) = roll([pin], plan)
        assert result.status == FAILED
        assert result.rollback is not None and result.rollback.startswith("not needed"), said
        assert "removed" not in result.rollback
        running.reload()
        assert running.status == "running", "the server that ran there runs on"
        assert "refusedError" not in result.detail, result.detail
        assert f"pulling {gone} failed" in result.detail
    finally:
        with contextlib.suppress(Exception):
            running.remove(force=True)
