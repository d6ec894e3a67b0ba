"""Unsigned warm caches and the trust policy, on the real engine and registry: without a
policy the evidence's signer is trusted on first use for builds only, so an unsigned warm cache
is not restored (a cold start; issue 43: it used to restore unchecked); once trust.yaml names
a key for warm caches, of two artifacts of the host's key the signed one restores even where
an unsigned one is newer.

The hosts are test_warm.py's (a few lines of Python that compile a "kernel" at a cold start),
in this module's own repository; their GPU kind is `cpu`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.evidence.keys import generate_key_pair
from builder.hosts.pins import Pin
from builder.hosts.remote import connect
from builder.hosts.warm_target import target_of
from builder.knowledge.cache_volume import cache_volume
from builder.warm.volume import open_volume
from tests.engine.test_warm import _kernel, _serve, hosts, served_image
from tests.support.signed_evidence import attach_evidence

pytestmark = pytest.mark.engine
__all__ = ["hosts", "served_image"]  # test_warm's fixtures, used here by name


@pytest.fixture
def keys(workspace: Path, served_image: str) -> Iterator[Callable[[], Path]]:
    """Keys in the hosts folder, the image's evidence signed by `ops`; calling the fixture
    writes trust.yaml (ops for builds and warm caches on cpu); removed afterwards."""
    folder = workspace / "hosts"
    keys = folder / "restored-test-keys"
    if not (keys / "ops.key").exists():
        generate_key_pair(keys, "ops")
    attach_evidence(served_image, "warm-test", "0" * 64, keys / "ops.key")

    def adopt() -> Path:
        document = {
            "version": 1,
            "keys": {"ops": "restored-test-keys/ops.pub"},
            "purposes": {"build": ["ops"], "warm": {"cpu": ["ops"]}},
        }
        (folder / "trust.yaml").write_text(json.dumps(document))  # JSON is YAML
        return keys

    yield adopt
    (folder / "trust.yaml").unlink(missing_ok=True)


def _captured(said: str) -> str:
    found = re.search(r" as (sha256:[0-9a-f]{12})", said)
    assert found, said
    return found.group(1)


def _restored(pin: Pin) -> dict[str, Any] | None:
    engine = connect(pin)
    target = target_of(pin)
    assert target is not None
    with open_volume(engine, target.volume, cache_volume()) as access:
        return access.state("restored.json")


def test_an_unsigned_warm_cache_never_restores_by_default_and_signed_wins(
    hosts: Callable[..., tuple[Pin, int]],
    cli_process: Callable[..., Any],
    keys: Callable[[], Path],
    api: Any,
) -> None:
    source, source_port = hosts("restored-source")
    first = _serve(cli_process, source, source_port)
    # No policy (safe by default, issue 43): the evidence's key is trusted on first use for
    # builds, and no key for warm caches.
    assert "first use: trusted key" in first and "for build;" in first, first
    unsigned = _captured(cli_process("cache", "capture", source.host).stdout)

    # So the unsigned capture is refused on the next host: a cold start.
    target, target_port = hosts("restored-target")
    said = _serve(cli_process, target, target_port)
    assert f"restored warm cache {unsigned}" not in said
    assert "unsigned [no key]" in said
    assert _kernel(api, target)[0] != _kernel(api, source)[0], said  # it compiled its own
    assert _restored(target) is None

    folder = keys()  # the policy now names ops for warm caches on cpu too
    # A signed capture, then a newer unsigned one of the same key: the signed one restores.
    env = {"SM120_STACKS_SIGNING_KEY": str(folder / "ops.key")}
    signed = _captured(cli_process("cache", "capture", source.host, env=env).stdout)
    newer = _captured(cli_process("cache", "capture", source.host).stdout)
    assert len({unsigned, signed, newer}) == 3
    third, third_port = hosts("restored-third")
    said = _serve(cli_process, third, third_port, "--require-warm")
    assert f"restored warm cache {signed}" in said, said
    assert "no trust policy" not in said
    restored = _restored(third)
    assert restored is not None and str(restored["artifact"]).startswith(signed)
