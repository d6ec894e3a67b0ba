"""`smoke --url --record --signing-key FILE` end to end, on the real engine and registry: the
served verdict it adds to the image's evidence is a DSSE envelope signed by the key given
(verified here with securesystemslib, an independent DSSE implementation), which `evidence`
and `pin`, from a build folder with no records and under a trust policy naming that key for
`served` on cpu, rely on; under a policy trusting another key for it, the same verdict is
refused. An unsigned one, and one signed by a key no policy names, are not counted: `pin`
exits 2 naming the document and the key (--allow-unsigned lets the unsigned one through,
below the signed verdict it cannot outrank, and never the stranger's).

The server is ci-mini's image (a variant of this module's own, pushed to a fresh namespace)
serving the trained tiny model on CPU, started here as the smoke tests start it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.signer import SSlibKey

from builder.evidence import documents
from builder.evidence.keys import generate_key_pair, load_signing_key
from builder.evidence.oci import ArtifactStore, Descriptor
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE
from builder.image.names import local_ref
from builder.image.records import load_record, save_record
from builder.image.registry import Registry
from builder.manifest.resolve import resolve
from builder.render.context import render
from tests.engine.conftest import clone_workspace, unique
from tests.support.health import wait_healthy
from tests.support.net import free_port

pytestmark = [
    pytest.mark.engine,
    pytest.mark.needs_ci_mini("a served verdict from a real smoke of transformers serve"),
]

NAME = unique("trust-smoke")
SERVED = "https://sm120-stacks.dev/verdict/v1"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("smoke-keys")
    for name in ("build", "ops", "stranger"):
        generate_key_pair(folder, name)
    return folder


def _hosts(root: Path, keys: Path, served: list[str]) -> Path:
    """A hosts folder whose trust.yaml names build for builds and `served` for cpu."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(keys, root / "keys", dirs_exist_ok=True)
    document = {
        "version": 1,
        "keys": {n: f"keys/{n}.pub" for n in ("build", "ops")},
        "purposes": {"build": ["build"], "served": {"cpu": served}},
    }
    (root / "trust.yaml").write_text(json.dumps(document))
    return root


@pytest.fixture
def server(
    variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    models: dict[str, Path],
    api: Any,
) -> Iterator[str]:
    """The variant built, tested as `test` would record it, serving the trained tiny model on
    a loopback port: its URL."""
    variant(NAME, "env:\n  TRUST_TEST: 'smoke'")
    cli_process("build", NAME)
    content_hash = render(resolve(NAME, workspace / "stacks")).content_hash()
    record = load_record(workspace / "build", NAME, content_hash)
    record.static = "passed"
    save_record(workspace / "build", record)
    port = free_port()
    container = api.containers.run(
        local_ref(NAME, content_hash),
        detach=True,
        name=f"sm120-trust-smoke-{os.urandom(4).hex()}",
        ports={"8000/tcp": ("127.0.0.1", port)},
        volumes={str(models["trained"]): {"bind": "/models/tiny", "mode": "ro"}},
        shm_size="1g",
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)


def _served_envelopes(target: Registry, digest: str) -> list[dict[str, Any]]:
    """Every signed verdict document of the image that carries a served verdict, as JSON."""
    store = ArtifactStore(target)
    found = []
    for descriptor in store.referrers(digest)[0]:
        manifest = store.manifest(descriptor)
        if manifest.get("artifactType") != documents.VERDICT_TYPE:
            continue
        layer = Descriptor.of(manifest["layers"][0])
        if layer.media_type != ENVELOPE_MEDIA_TYPE:
            continue
        envelope = json.loads(store.blob(layer))
        statement = json.loads(base64.b64decode(envelope["payload"]))
        if statement["predicate"].get("served"):
            found.append(envelope)
    return found


def test_smoke_record_signs_the_served_verdict_and_only_a_trusted_one_counts(
    server: str,
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    keys: Path,
    tmp_path: Path,
) -> None:
    namespace = f"trust-smoke-{os.urandom(3).hex()}"
    target = Registry.parse(f"{registry.host}/{namespace}")
    where = f"{registry.host}/{namespace}"
    env = {"SM120_STACKS_SIGNING_KEY": str(keys / "build.key")}
    pushed = cli_process("push", NAME, "--registry", where, env=env)
    digest = pushed.stdout.strip().splitlines()[0].rpartition("@")[2]
    wait_healthy(server, 180)

    def smoke(*key: str) -> Any:
        return cli_process("smoke", NAME, "--url", server, "--record", "--registry", where, *key)

    ops = load_signing_key(keys / "ops.key").key_id
    recorded = smoke("--signing-key", str(keys / "ops.key"))
    assert "recorded: served on cpu (passed)" in recorded.stderr, recorded.stderr
    assert f"signed by key {ops[:16]}" in recorded.stderr
    assert (keys / "ops.key").read_text().splitlines()[1] not in recorded.stdout + recorded.stderr

    # The envelope in the registry: signed by ops, over a statement about this very digest;
    # securesystemslib verifies it with the public key alone.
    [envelope] = _served_envelopes(target, digest)
    assert [s["keyid"] for s in envelope["signatures"]] == [ops]
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicateType"] == SERVED
    assert statement["subject"][0]["digest"]["sha256"] == digest.removeprefix("sha256:")
    assert statement["predicate"]["served"][0]["gpu_kind"] == "cpu"
    public = serialization.load_pem_public_key((keys / "ops.pub").read_bytes())
    sslib_key = SSlibKey.from_crypto(public, keyid=ops)  # type: ignore[arg-type]
    assert ops in SslibEnvelope.from_dict(envelope).verify([sslib_key], 1)

    second = clone_workspace(workspace, tmp_path / "clone")  # no records of the image
    shutil.copy(workspace / "stacks" / f"{NAME}.yaml", second / "stacks")
    folder = ("--stacks-dir", str(second / "stacks"), "--build-dir", str(second / "build"))
    trusted = _hosts(tmp_path / "hosts", keys, ["ops"])

    def run(hosts: Path, *args: str) -> Any:
        return cli_process(*folder, "--hosts-dir", str(hosts), *args, check=False)

    def pin(hosts: Path, host: str, *more: str) -> Any:
        return run(hosts, "pin", host, NAME, "--registry", where, "--gpus", "none", *more)

    shown = run(trusted, "evidence", NAME, "--registry", where)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"ops ({ops[:16]})" in shown.stdout and "build (" in shown.stdout, shown.stdout
    pinned = pin(trusted, unique("smoke-signed"))
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    assert "relies on its served verdict on cpu" in pinned.stdout, pinned.stdout
    assert ops in (trusted / f"{unique('smoke-signed')}.yaml").read_text()

    # The same verdict under a policy that trusts only the build key for cpu: not relied on
    # (issue 43: ops's index is signed by no key this policy trusts, so the newest trusted
    # index is push's, which does not list ops's verdict: ignored and named).
    build_only = _hosts(tmp_path / "hosts-build-only", keys, ["build"])
    other = pin(build_only, unique("smoke-other"))
    assert "does not list" in other.stderr and "no trusted key signed it" in other.stderr
    other_file = build_only / f"{unique('smoke-other')}.yaml"
    assert not other_file.exists() or ops not in other_file.read_text()

    # An unsigned served verdict (a later one): not counted.
    unsigned = smoke()
    assert "recorded: served on cpu (passed)" in unsigned.stderr
    assert "unsigned: a host with a trust policy will not count it" in unsigned.stderr
    # issue 43: ignored and named beside the signed evidence, not a refusal (a registry
    # writer's unsigned extra would otherwise stop every pin); the pin rests on the signed.
    ignored = pin(trusted, unique("smoke-unsigned"))
    assert ignored.returncode == 0, ignored.stdout + ignored.stderr
    assert "ignored 1 unsigned document(s)" in ignored.stderr, ignored.stderr
    assert "allow_unsigned: false" in (trusted / f"{unique('smoke-unsigned')}.yaml").read_text()
    migrated = pin(trusted, unique("smoke-migrated"), "--allow-unsigned")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    pin_file = (trusted / f"{unique('smoke-migrated')}.yaml").read_text()
    assert "allow_unsigned: true" in pin_file and ops in pin_file

    # One signed by a key the policy does not name, with its own index: beside the signed
    # index neither is listed by a trusted key, so both are ignored and named (issue 43), and
    # nothing rests on the stranger's key, --allow-unsigned or not.
    stranger = load_signing_key(keys / "stranger.key").key_id
    smoke("--signing-key", str(keys / "stranger.key"))
    ignored = pin(trusted, unique("smoke-stranger"), "--allow-unsigned")
    assert ignored.returncode == 0, ignored.stdout + ignored.stderr
    assert "does not list" in ignored.stderr and "no trusted key signed it" in ignored.stderr
    assert stranger not in (trusted / f"{unique('smoke-stranger')}.yaml").read_text()
