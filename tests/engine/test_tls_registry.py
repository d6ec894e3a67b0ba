"""The distributed half against a registry as users have one: TLS from a private CA and a
password (tests/support/tls_registry.py), logged in with `docker login` into a DOCKER_CONFIG
of the test's own. Debian's docker-registry 2.8 has no referrers API: the referrers tag.

Push with its evidence, `evidence`, `pin` from a build folder with no records, a warm-cache
artifact up and back; a wrong password, an untrusted CA, a frozen registry; and no secret in
any file, log or message.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import shutil
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.evidence.oci import ArtifactStore, Descriptor
from builder.image.records import CPU, load_record, save_record
from builder.image.registry import Registry
from builder.image.registry_http import TLS_VERIFIED, RegistryAccess
from tests.engine.conftest import clone_workspace, unique
from tests.engine.test_evidence import _pushed_with_evidence, _served, _share
from tests.support.tls_registry import TlsRegistry, tls_registry

pytestmark = pytest.mark.engine
TLS_CPU = unique("tls-cpu")
TLS_HALF = unique("tls-half")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRegistry]:
    if shutil.which("docker-registry") is None:
        pytest.skip("no docker-registry (scripts/host-setup.sh --registry installs it)")
    with tls_registry(tmp_path_factory.mktemp("tls-registry")) as registry:
        yield registry


@pytest.fixture(scope="module")
def pushed(
    tls: TlsRegistry,
    cli_process: Callable[..., Any],
    workspace: Path,
    api: Any,
    local_base: str,
    tiny_signing_key: Path,
) -> Iterator[str]:
    """TLS_CPU (a variant of the tiny stack: the subject is the registry, not the image's
    content) built, recorded as tested, pushed with its evidence to the TLS registry, signed
    (a host with no trust.yaml pins signed evidence, trusting its key on first use, and
    refuses unsigned: issue 43)."""

    def run(*args: str, check: bool = True) -> Any:
        return cli_process(*args, check=check, env=tls.env())

    def write_variant(name: str, body: str) -> str:
        (workspace / "stacks" / f"{name}.yaml").write_text(f"extends: ci-tiny\n{body}\n")
        return name

    yield _pushed_with_evidence(
        TLS_CPU,
        write_variant,
        run,
        workspace,
        Registry(tls.host),
        [_served()],
        signing_key=tiny_signing_key,
    )
    for image in api.images.list(filters={"label": f"sm120-stacks.stack={TLS_CPU}"}):
        for tag in image.tags:
            with contextlib.suppress(Exception):
                api.images.remove(tag, noprune=False)


def _access(tls: TlsRegistry, **extra: str) -> RegistryAccess:
    return RegistryAccess.from_environment(tls.env(**extra))


def test_push_with_evidence_then_pin_from_a_folder_with_no_records(
    tls: TlsRegistry,
    pushed: str,
    cli_process: Callable[..., Any],
    workspace: Path,
    tmp_path: Path,
) -> None:
    record = load_record(workspace / "build", TLS_CPU, _hash(workspace, TLS_CPU))
    assert any(ref.startswith(tls.host) for ref in record.pushed.values())
    store = ArtifactStore(Registry(tls.host), access=_access(tls))
    found, how = store.referrers(pushed)
    kinds = {d.annotation("dev.sm120-stacks.kind") for d in found}
    assert {"verdict", "sbom", "provenance"} <= kinds and how == "referrers tag"
    assert {d.annotation("dev.sm120-stacks.transport") for d in found} == {TLS_VERIFIED}

    folder = clone_workspace(workspace, tmp_path / "clone")
    _share(TLS_CPU, workspace, folder)
    env = tls.env()
    where = ["--stacks-dir", str(folder / "stacks"), "--build-dir", str(folder / "build")]
    shown = cli_process(*where, "evidence", TLS_CPU, "--registry", tls.host, "--json", env=env)
    assert json.loads(shown.stdout)["static"] == "passed"
    hosts = tmp_path / "hosts"
    pinned = cli_process(
        *where, "pin", unique("tlshost"), TLS_CPU, "--registry", tls.host, "--gpus", "none",
        "--hosts-dir", str(hosts), env=env,
    )  # fmt: skip
    assert f"{tls.host}/sm120-stacks@{pushed}" in pinned.stdout
    assert f"served on {CPU}" in pinned.stdout


def test_a_push_whose_evidence_failed_is_not_recorded_and_moves_no_tag(
    tls: TlsRegistry,
    pushed: str,
    cli_process: Callable[..., Any],
    workspace: Path,
    api: Any,
    tmp_path: Path,
) -> None:
    """The engine pushes to a loopback registry without checking its certificate (dockerd's
    default insecure range); the evidence does not: the image goes up, the evidence fails."""
    (workspace / "stacks" / f"{TLS_HALF}.yaml").write_text(
        "extends: ci-tiny\nenv:\n  TLS_HALF: '1'\n"
    )
    cli_process("build", TLS_HALF)
    content_hash = _hash(workspace, TLS_HALF)
    record = load_record(workspace / "build", TLS_HALF, content_hash)
    record.tests, record.static = "passed", "passed"
    save_record(workspace / "build", record)
    untrusted = tmp_path / "certs.d"
    untrusted.mkdir()
    env = tls.env(SM120_STACKS_CERTS_D=str(untrusted))
    try:
        result = cli_process("push", TLS_HALF, "--registry", tls.host, check=False, env=env)
        assert result.returncode == 2, result.stderr
        assert "its evidence did not: it is not recorded as pushed" in result.stderr
        assert f"sm120-stacks push {TLS_HALF} --registry {tls.host}` again" in result.stderr
        assert load_record(workspace / "build", TLS_HALF, content_hash).pushed == {}
        store = ArtifactStore(Registry(tls.host), access=_access(tls))
        tags = store.session.request(
            "GET", "/v2/sm120-stacks/tags/list", "repository:sm120-stacks:pull"
        )
        assert TLS_HALF not in tags.json()["tags"]  # the moving tag did not move
        local = [t for i in api.images.list() for t in i.tags if t.startswith(tls.host)]
        assert not [t for t in local if TLS_HALF in t], local
        pinned = cli_process(
            "pin", unique("halfhost"), TLS_HALF, "--gpus", "none", "--hosts-dir",
            str(tmp_path / "hosts"), check=False, env=env,
        )  # fmt: skip
        assert pinned.returncode != 0, pinned.stdout
        assert not list((tmp_path / "hosts").glob("*.yaml"))
    finally:
        for image in api.images.list(filters={"label": f"sm120-stacks.stack={TLS_HALF}"}):
            for tag in image.tags:
                with contextlib.suppress(Exception):
                    api.images.remove(tag, noprune=False)


def test_a_warm_cache_artifact_goes_up_and_comes_back_through_tls(
    tls: TlsRegistry, pushed: str, tmp_path: Path
) -> None:
    """The store's own upload (POST, PUT) and streamed download, checked byte for byte."""
    payload = tmp_path / "cache.tar"
    inner = tmp_path / "kernel.bin"
    inner.write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    with tarfile.open(payload, "w") as tar:
        tar.add(inner, arcname="live/triton/kernel.bin")
    store = ArtifactStore(Registry(tls.host), access=_access(tls))
    subject = store.image(pushed)
    annotations = {"dev.sm120-stacks.kind": "tls-warm-test"}
    sent = store.attach_files(
        subject, "application/vnd.sm120-stacks.test", [(payload, "application/x-tar")], annotations
    )
    layer = store.manifest(sent)["layers"][0]
    back = tmp_path / "back.tar"
    store.blob_to_file(Descriptor.of(layer), back)
    assert (
        hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(payload.read_bytes()).digest()
    )


def test_a_wrong_password_is_refused_with_docker_login_named(
    tls: TlsRegistry, pushed: str, cli_process: Callable[..., Any], tmp_path: Path
) -> None:
    config = tmp_path / "wrong"
    config.mkdir()
    wrong = base64.b64encode(f"{tls.user}:not-the-password".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {tls.host: {"auth": wrong}}}))
    result = cli_process(
        "evidence", TLS_CPU, "--registry", tls.host, check=False,
        env=tls.env(DOCKER_CONFIG=str(config)),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"refused the login saved in {config / 'config.json'}" in result.stderr
    assert f"docker login {tls.host}" in result.stderr
    assert "not-the-password" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_no_login_at_all_names_docker_login(
    tls: TlsRegistry, pushed: str, cli_process: Callable[..., Any], tmp_path: Path
) -> None:
    result = cli_process(
        "evidence", TLS_CPU, "--registry", tls.host, check=False,
        env=tls.env(DOCKER_CONFIG=str(tmp_path)),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "asks for a login" in result.stderr and f"docker login {tls.host}" in result.stderr


def test_an_untrusted_ca_is_a_tls_error_that_names_certs_d(
    tls: TlsRegistry, pushed: str, cli_process: Callable[..., Any], tmp_path: Path
) -> None:
    empty = tmp_path / "certs.d"
    empty.mkdir()
    result = cli_process(
        "evidence", TLS_CPU, "--registry", tls.host, check=False,
        env=tls.env(SM120_STACKS_CERTS_D=str(empty)),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "TLS certificate is not trusted" in result.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in result.stderr or "verify failed" in result.stderr
    assert f"{empty}/{tls.host}/ca.crt" in result.stderr


def test_a_frozen_registry_times_out_saying_what_it_waited_for(
    tls: TlsRegistry, pushed: str, cli_process: Callable[..., Any]
) -> None:
    started = time.monotonic()
    with tls.frozen():
        result = cli_process(
            "evidence", TLS_CPU, "--registry", tls.host, check=False,
            env=tls.env(SM120_STACKS_REGISTRY_TIMEOUT="2"),
        )  # fmt: skip
    took = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert "did not answer within 2 s" in result.stderr
    assert "trying again in" in result.stderr
    assert took < 60, took


def test_bad_registry_settings_are_refused_without_echoing_secrets(
    tls: TlsRegistry, pushed: str, cli_process: Callable[..., Any], tmp_path: Path
) -> None:
    inline = cli_process(
        "evidence", TLS_CPU, "--registry", f"{tls.user}:{tls.password}@{tls.host}", check=False
    )
    assert inline.returncode == 2 and "holds a login" in inline.stderr
    assert tls.password not in inline.stderr + inline.stdout
    not_pem = tmp_path / "ca.der"
    not_pem.write_bytes(b"\x30\x82\x01\x00 not a PEM file")
    bad_ca = cli_process(
        "evidence", TLS_CPU, "--registry", tls.host, check=False,
        env=tls.env(SM120_STACKS_CA_BUNDLE=str(not_pem)),
    )  # fmt: skip
    assert bad_ca.returncode == 2 and "not PEM" in bad_ca.stderr and str(not_pem) in bad_ca.stderr
    certs_d = tmp_path / "certs.d"
    (certs_d / tls.host).mkdir(parents=True)
    no_ca = cli_process(
        "evidence", TLS_CPU, "--registry", tls.host, check=False,
        env=tls.env(SM120_STACKS_CERTS_D=str(certs_d)),
    )  # fmt: skip
    assert no_ca.returncode == 2 and "holds no ca.crt" in no_ca.stderr


def test_no_secret_in_any_file_the_tool_wrote(
    tls: TlsRegistry, pushed: str, workspace: Path, tmp_path: Path
) -> None:
    secrets = [tls.password.encode(), base64.b64encode(f"{tls.user}:{tls.password}".encode())]
    searched = 0
    for root in (workspace / "build", tls.log.parent / "data"):
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                searched += 1
                assert not any(s in data for s in secrets), path
    assert searched > 3


def _hash(workspace: Path, name: str) -> str:
    from builder.manifest.resolve import resolve
    from builder.render.context import render

    return render(resolve(name, workspace / "stacks")).content_hash()


def test_a_registry_frozen_mid_push_stops_the_push_with_what_it_waited_for(
    tls: TlsRegistry, api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine itself pushes the image; a registry that stops answering mid-upload left the
    push waiting on the API's 600 s per read (a 120 s freeze stalled it silently). Now a push
    whose stream is silent for SM120_STACKS_REGISTRY_TIMEOUT seconds ends with that said."""
    import os
    import threading

    from builder.engine.address import from_environment
    from builder.engine.docker_adapter import connect_engine
    from builder.engine.protocol import LayerEvent
    from builder.errors import EngineError

    (tmp_path / "blob").write_bytes(os.urandom(256 * 1024 * 1024))  # incompressible
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY blob /blob\n")
    repository = f"{tls.host}/sm120-stacks"
    tag = unique("frozen")
    image, _ = api.images.build(path=str(tmp_path), tag=f"{repository}:{tag}", rm=True)
    monkeypatch.setenv("DOCKER_CONFIG", str(tls.docker_config))
    monkeypatch.setenv("SM120_STACKS_REGISTRY_TIMEOUT", "5")
    engine = connect_engine(from_environment())  # reads the test's docker login
    moving = threading.Event()
    failed: list[BaseException] = []

    def seen(event: LayerEvent) -> None:
        if event.status == "Pushing" and (event.current or 0) > 0:
            moving.set()

    def push() -> None:
        try:
            engine.push(repository, tag, seen)
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)

    worker = threading.Thread(target=push, daemon=True)
    try:
        worker.start()
        assert moving.wait(120), "the push never started moving bytes"
        with tls.frozen():
            started = time.monotonic()
            worker.join(60)
            took = time.monotonic() - started
        assert not worker.is_alive(), "the push still waits on a frozen registry"
        assert failed and isinstance(failed[0], EngineError), failed
        assert "stalled" in str(failed[0]) and "5 s" in str(failed[0])
        assert failed[0].retried and took < 30, took
    finally:
        with contextlib.suppress(Exception):
            api.images.remove(image.id, force=True)
