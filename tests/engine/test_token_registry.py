"""The evidence client against a registry with the distribution spec's Bearer-token login
(Harbor, GHCR, GitLab, Docker Hub): Debian's docker-registry 2.8 with `auth: token:` and a token
service of the test's own (tests/support/token_registry.py), both over TLS from a CA made here
and trusted only through a certs.d of the test's own.

An image manifest goes up, an artifact referring to it goes up and is found again through the
referrers tag (distribution 2.8 has no referrers API), with a password login and with an
identity token; the token service says which scope and which grant it was asked for. A wrong
password or identity token is refused naming `docker login HOST`, and no secret is in any
message.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.errors import StackError
from builder.evidence.oci import (
    DOCKER_MANIFEST,
    MANIFEST,
    ArtifactStore,
    Descriptor,
    sha256_digest,
)
from builder.image.registry import Registry
from builder.image.registry_http import TLS_VERIFIED, RegistryAccess
from tests.conftest import REQUIRE_ENGINE
from tests.engine.conftest import unique
from tests.support.token_registry import SERVICE, TokenRegistry, TokenRequest, token_registry

pytestmark = pytest.mark.engine
REPOSITORY = "sm120-stacks"
KIND = "dev.sm120-stacks.kind"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenRegistry]:
    if shutil.which("docker-registry") is None:
        why = (
            "no docker-registry on PATH: the distribution spec's Bearer-token login is NOT "
            "TESTED (scripts/host-setup.sh --registry installs Debian's docker-registry 2.8)"
        )
        if REQUIRE_ENGINE:
            pytest.fail(why)
        pytest.skip(why)
    with token_registry(tmp_path_factory.mktemp("token-registry")) as registry:
        yield registry


class Said:
    """Every notice the registry client printed (retries), to search for secrets."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str) -> None:
        self.lines.append(text)


def _store(tokens: TokenRegistry, config: Path, said: Said) -> ArtifactStore:
    access = dataclasses.replace(RegistryAccess.from_environment(tokens.env(config)), notice=said)
    return ArtifactStore(Registry(tokens.host), access=access)


def _push_image(store: ArtifactStore, tag: str) -> Descriptor:
    """A one-layer OCI image manifest under tag, uploaded by the store itself (no engine)."""
    layer = store._put_blob(b"sm120 token test layer " + tag.encode(), "application/octet-stream")
    config = store._put_blob(
        json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers",
                    "diff_ids": [layer.digest]}}).encode(),
        "application/vnd.oci.image.config.v1+json",
    )  # fmt: skip
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config.to_json(),
        "layers": [layer.to_json()],
    }
    data = json.dumps(manifest, sort_keys=True).encode()
    store._put_manifest(tag, data, MANIFEST)
    found = store.image(tag)
    assert found.digest == sha256_digest(data)
    return found


def _scopes(seen: list[TokenRequest]) -> set[tuple[str, frozenset[str]]]:
    """The (resource, actions) the token service was asked for, whatever the actions' order
    (distribution names them from a Go map: `pull,push` or `push,pull`)."""
    asked = set()
    for request in seen:
        for scope in " ".join(request.scopes).split():
            resource, _, actions = scope.rpartition(":")
            asked.add((resource, frozenset(actions.split(","))))
    return asked


def _secrets(tokens: TokenRegistry) -> list[str]:
    pair = f"{tokens.user}:{tokens.password}".encode()
    return [tokens.password, tokens.identity_token, base64.b64encode(pair).decode()]


def test_a_password_login_gets_tokens_and_an_artifact_goes_up_and_back(
    tokens: TokenRegistry, tmp_path: Path
) -> None:
    said = Said()
    before = len(tokens.seen())
    store = _store(tokens, tokens.password_login(tmp_path / "login"), said)
    subject = _push_image(store, unique("token-image"))
    sent = store.attach(
        subject, "application/vnd.sm120-stacks.test", "application/json", b'{"ok": true}',
        {KIND: "token-test"},
    )  # fmt: skip
    found, how = store.referrers(subject.digest)
    assert how == "referrers tag"
    assert [d.digest for d in found] == [sent.digest]
    assert found[0].annotation(KIND) == "token-test"
    assert store.blob(Descriptor.of(store.manifest(sent)["layers"][0])) == b'{"ok": true}'
    assert store.transport == TLS_VERIFIED

    seen = tokens.seen()[before:]
    assert seen and all(r.grant == "password" and r.method == "GET" for r in seen), seen
    assert all(r.service == SERVICE and r.user == tokens.user for r in seen), seen
    asked = _scopes(seen)
    assert (f"repository:{REPOSITORY}", frozenset({"pull", "push"})) in asked, asked
    assert (f"repository:{REPOSITORY}", frozenset({"pull"})) in asked, asked
    # one token per scope, kept for the session: not a token request per registry request
    assert len(seen) <= 4, seen
    assert not [line for line in said.lines if any(s in line for s in _secrets(tokens))]


def test_an_identity_token_is_exchanged_with_grant_type_refresh_token(
    tokens: TokenRegistry, tmp_path: Path
) -> None:
    said = Said()
    before = len(tokens.seen())
    store = _store(tokens, tokens.token_login(tmp_path / "login"), said)
    subject = _push_image(store, unique("token-idt"))
    sent = store.attach(
        subject, "application/vnd.sm120-stacks.test", "application/json", b"{}",
        {KIND: "identity-token-test"},
    )  # fmt: skip
    found, _ = store.referrers(subject.digest)
    assert sent.digest in [d.digest for d in found]

    seen = tokens.seen()[before:]
    assert seen and all(r.method == "POST" and r.grant == "refresh_token" for r in seen), seen
    assert all(r.user == tokens.user and r.service == SERVICE for r in seen), seen
    assert (f"repository:{REPOSITORY}", frozenset({"pull", "push"})) in _scopes(seen)


@pytest.mark.parametrize("login", ["password", "identity token"])
def test_a_wrong_login_is_refused_naming_docker_login_and_no_secret(
    tokens: TokenRegistry, tmp_path: Path, login: str
) -> None:
    wrong = "wrong-" + tokens.password
    if login == "password":
        config = tokens.password_login(tmp_path / "wrong", password=wrong)
    else:
        config = tokens.docker_config(
            tmp_path / "wrong", {"auth": "", "identitytoken": "wrong-" + tokens.identity_token}
        )
    said = Said()
    before = len(tokens.seen())
    store = _store(tokens, config, said)
    with pytest.raises(StackError) as refused:
        store.referrers("sha256:" + "0" * 64)
    text = str(refused.value)
    assert f"refused the login saved in {config / 'config.json'}" in text, text
    assert f"docker login {tokens.host}" in text, text
    messages = [text, *said.lines]
    for secret in [*_secrets(tokens), wrong, "wrong-" + tokens.identity_token]:
        assert not [m for m in messages if secret in m], (secret, messages)
    seen = tokens.seen()[before:]
    assert seen and all(r.status == 401 for r in seen), seen
    grant = "password" if login == "password" else "refresh_token"
    assert {r.grant for r in seen} == {grant}, seen


def test_no_login_for_a_token_registry_names_docker_login(
    tokens: TokenRegistry, tmp_path: Path
) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    store = _store(tokens, empty, Said())
    with pytest.raises(StackError) as refused:
        store.referrers("sha256:" + "0" * 64)
    text = str(refused.value)
    assert "asks for a login" in text and f"docker login {tokens.host}" in text, text


def test_a_pull_only_login_pushing_is_told_it_may_not_push_not_to_log_in_again(
    tokens: TokenRegistry, tmp_path: Path
) -> None:
    """The token service grants a read-only user pull alone (Harbor, GHCR): the registry
    answers insufficient_scope, which is about rights, not a wrong password."""
    owner = _store(tokens, tokens.password_login(tmp_path / "owner"), Said())
    subject = _push_image(owner, unique("token-ro"))
    config = tokens.password_login(tmp_path / "reader", user=tokens.reader)
    store = _store(tokens, config, Said())
    assert store.image(subject.digest) == subject  # pulling is allowed
    with pytest.raises(StackError) as refused:
        store.attach(subject, "application/vnd.sm120-stacks.test", "application/json", b"{}", {})
    text = str(refused.value)
    assert f"accepted the login saved in {config / 'config.json'}" in text, text
    assert f"is not granted pull,push on {REPOSITORY}" in text, text
    assert "log in again" not in text, text
    assert f"docker login {tokens.host}" in text and tokens.password not in text, text


def test_an_untrusted_token_service_is_a_tls_error_naming_it_not_a_traceback(
    tokens: TokenRegistry, tmp_path: Path
) -> None:
    """The registry's CA trusted, the token service's not: the failure names the token
    service and where its CA goes (it was requests' SSLError, uncaught, before)."""
    certs_d = tmp_path / "certs.d"
    (certs_d / tokens.host).mkdir(parents=True)
    shutil.copy(tokens.certs_d / tokens.host / "ca.crt", certs_d / tokens.host / "ca.crt")
    access = RegistryAccess.from_environment(
        tokens.env(tokens.password_login(tmp_path / "login"), SM120_STACKS_CERTS_D=str(certs_d))
    )
    store = ArtifactStore(Registry(tokens.host), access=access)
    with pytest.raises(StackError) as refused:
        store.referrers("sha256:" + "0" * 64)
    text = str(refused.value)
    service = tokens.realm.split("?", 1)[0]
    assert f"the token service of {tokens.host} ({service})" in text, text
    assert "certificate verify failed" in text.lower(), text
    assert f"{certs_d}/{tokens.host}/ca.crt" in text, text


def test_the_engine_pushes_with_docker_login_and_the_evidence_follows(
    tokens: TokenRegistry, tmp_path: Path
) -> None:
    """The real `docker login` and `docker push` through the same token service (the engine is
    the reference client of this flow), then an artifact referring to the engine's own Docker
    v2 manifest, with the config docker login wrote."""
    config = tmp_path / "docker-config"
    config.mkdir()
    env = {**os.environ, "DOCKER_CONFIG": str(config)}
    subprocess.run(
        ["docker", "login", tokens.host, "--username", tokens.user, "--password-stdin"],
        input=tokens.password.encode(), env=env, check=True, capture_output=True,
    )  # fmt: skip
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\nCOPY marker /marker\n")
    (context / "marker").write_text(unique("token-engine") + "\n")
    tag = f"{tokens.host}/{REPOSITORY}:{unique('token-engine')}"
    before = len(tokens.seen())
    try:
        subprocess.run(["docker", "build", "-q", "-t", tag, str(context)], env=env, check=True,
                       capture_output=True)  # fmt: skip
        pushed = subprocess.run(["docker", "push", tag], env=env, check=True,
                                capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        subprocess.run(["docker", "image", "rm", tag], env=env, capture_output=True)
    engine_asked = _scopes(tokens.seen()[before:])
    assert (f"repository:{REPOSITORY}", frozenset({"pull", "push"})) in engine_asked
    digest = pushed.stdout.split("digest: ", 1)[1].split()[0]
    store = _store(tokens, config, Said())
    subject = store.image(digest)
    assert subject.media_type == DOCKER_MANIFEST
    sent = store.attach(subject, "application/vnd.sm120-stacks.test", "application/json",
                        b"{}", {KIND: "engine-pushed"})  # fmt: skip
    found, _ = store.referrers(digest)
    assert [d.digest for d in found] == [sent.digest]
