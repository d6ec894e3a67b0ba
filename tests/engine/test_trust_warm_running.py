"""A host already running as pinned when trust.yaml is added (issue 43), on the real engine
and registry: its cache volume holds a forged warm cache restored before the policy (unsigned,
by an earlier tool that checked nothing), which its server loaded. `deploy --apply` used to
say "already runs as pinned; nothing to do" and leave it live; now the host is restarted with
live/ emptied first, and its server compiles its own kernel. Also: the error that stops a
roll names its host once ("failed: HOST: warm required", not "HOST: HOST:").

The hosts are test_warm.py's (a few lines of Python that load a "kernel" from the cache or
compile it at a cold start), in this module's own repository; their GPU kind is `cpu`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.evidence.keys import generate_key_pair
from builder.evidence.oci import ArtifactStore
from builder.hosts import deploy
from builder.hosts.pins import Pin
from builder.hosts.remote import connect
from builder.hosts.warm_target import host_facts, target_of
from builder.warm.lifecycle import restore
from tests.engine.conftest import RUN
from tests.engine.test_trust_warm import EVIL, _forge
from tests.engine.test_warm import _kernel, hosts, served_image
from tests.support.health import wait_healthy
from tests.support.signed_evidence import attach_evidence

pytestmark = pytest.mark.engine
__all__ = ["hosts", "served_image"]  # test_warm's fixtures, used here by name


@pytest.fixture
def adopt_policy(workspace: Path, served_image: str) -> Iterator[Callable[[], None]]:
    """The image's evidence signed by `ops`; calling it writes trust.yaml (ops for builds and
    warm caches on cpu), as an operator adding a policy would; removed afterwards."""
    folder = workspace / "hosts"
    keys = folder / f"running-test-keys-{RUN}"
    if not (keys / "ops.key").exists():
        generate_key_pair(keys, "ops")
    attach_evidence(served_image, "warm-test", "0" * 64, keys / "ops.key")

    def adopt() -> None:
        document = {
            "version": 1,
            "keys": {"ops": f"{keys.name}/ops.pub"},
            "purposes": {"build": ["ops"], "warm": {"cpu": ["ops"]}},
        }
        (folder / "trust.yaml").write_text(json.dumps(document))  # JSON is YAML

    yield adopt
    (folder / "trust.yaml").unlink(missing_ok=True)


def test_a_host_running_a_forged_cache_is_purged_and_restarted_once_a_policy_is_added(
    hosts: Callable[..., tuple[Pin, int]],
    cli_process: Callable[..., Any],
    adopt_policy: Callable[[], None],
    api: Any,
    tmp_path: Path,
) -> None:
    host, port = hosts("running-forged", env={"RUNNING": "1"})  # a key of its own
    _forge(host, tmp_path, None)  # unsigned, of the host's exact key
    # What an earlier tool left: the forged cache restored unchecked, the server started on it.
    engine = connect(host)
    target = target_of(host)
    assert target is not None
    store = ArtifactStore.of_image(host.image)
    restored = restore(engine, store, target, host_facts(host, engine, None))
    assert restored.warm, restored.detail
    deploy.apply(host, engine)
    wait_healthy(f"http://127.0.0.1:{port}/health", 60)
    assert _kernel(api, host)[0] == hashlib.md5(EVIL).hexdigest().encode()  # it is live
    first = api.containers.get(host.container).id

    adopt_policy()
    deployed = cli_process("deploy", host.host, "--apply")
    said = deployed.stdout
    assert "already runs" not in said, said
    assert "its cache volume holds what the trust policy refuses (" in said, said
    assert "emptied the cache volume: it held what the trust policy refuses" in said, said
    assert f"restarted {host.container}" in said, said
    wait_healthy(f"http://127.0.0.1:{port}/health", 60)
    assert api.containers.get(host.container).id != first
    kernel, _ = _kernel(api, host)
    assert kernel != hashlib.md5(EVIL).hexdigest().encode()  # the server compiled its own

    # Nothing refused is left: the next deploy leaves it running.
    again = cli_process("deploy", host.host, "--apply")
    assert "already runs" in again.stdout, again.stdout
    assert api.containers.get(host.container).id != first


def test_the_error_that_stops_a_roll_names_its_host_once(
    hosts: Callable[..., tuple[Pin, int]],
    cli_process: Callable[..., Any],
    adopt_policy: Callable[[], None],
) -> None:
    adopt_policy()
    host, _ = hosts("running-required", env={"REQUIRED": "1"})  # no artifact has its key
    refused = cli_process("deploy", host.host, "--apply", "--require-warm", check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    lines = refused.stderr.splitlines()
    assert f"failed: {host.host}: warm required, and no warm cache" in "\n".join(lines)
    assert f"{host.host}: {host.host}:" not in refused.stderr, refused.stderr
