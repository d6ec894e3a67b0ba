"""Registry login and trust as the Docker CLI keeps them (image/registry_auth.py,
image/registry_http.py), without a registry: config files, a real credential-helper process,
the insecure list and the settings' refusals. The registry round trips are in
tests/engine/test_tls_registry.py."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from builder.errors import StackError
from builder.image.registry import Registry
from builder.image.registry_auth import TOKEN_USER, credentials_for
from builder.image.registry_http import RegistryAccess


def _config(folder: Path, data: dict[str, object]) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data))
    return {"DOCKER_CONFIG": str(folder), "PATH": os.environ.get("PATH", "")}


def test_an_inline_login_is_read_for_its_host_only(tmp_path: Path) -> None:
    auth = base64.b64encode(b"alice:s3cret").decode()
    env = _config(tmp_path, {"auths": {"https://reg.example:5443": {"auth": auth}}})
    found = credentials_for("reg.example:5443", env)
    assert found is not None and (found.user, found.secret) == ("alice", "s3cret")
    assert "s3cret" not in repr(found)
    assert credentials_for("other.example", env) is None


def test_an_identity_token_is_kept_as_one(tmp_path: Path) -> None:
    env = _config(tmp_path, {"auths": {"reg.example": {"identitytoken": "refresh-me"}}})
    found = credentials_for("reg.example", env)
    assert found is not None and found.identity_token and found.user == TOKEN_USER


def test_a_credential_helper_is_asked_as_docker_asks_it(tmp_path: Path) -> None:
    """A real helper process on PATH: the server on stdin, JSON out; credHelpers before
    credsStore, and a helper that knows nothing leaves the inline entry to answer."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    asked = tmp_path / "asked"
    for name, user in (("perhost", "bob"), ("store", "carol")):
        helper = bin_dir / f"docker-credential-{name}"
        helper.write_text(
            "#!/bin/sh\nread server\n"
            f'echo "$server" >> {asked}\n'
            f'[ "$server" = reg.example ] || exit 1\n'
            f'printf \'{{"ServerURL":"%s","Username":"{user}","Secret":"pw-{user}"}}\' "$server"\n'
        )
        helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    inline = base64.b64encode(b"dave:inline").decode()
    env = _config(
        tmp_path / "cfg",
        {
            "credsStore": "store",
            "credHelpers": {"reg.example": "perhost"},
            "auths": {"elsewhere.example": {"auth": inline}},
        },
    )
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    found = credentials_for("reg.example", env)
    assert found is not None and (found.user, found.source) == ("bob", "helper perhost")
    elsewhere = credentials_for("elsewhere.example", env)
    assert elsewhere is not None and elsewhere.user == "dave"
    assert asked.read_text().split() == ["reg.example", "elsewhere.example"]


def test_a_missing_helper_and_a_broken_config_are_errors_that_say_what_to_do(
    tmp_path: Path,
) -> None:
    env = _config(tmp_path / "a", {"credsStore": "nowhere"})
    with pytest.raises(StackError, match="docker-credential-nowhere is not on PATH"):
        credentials_for("reg.example", env)
    broken = tmp_path / "b"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(StackError) as raised:
        credentials_for("reg.example", {"DOCKER_CONFIG": str(broken)})
    assert raised.value.file == broken / "config.json" and "docker login" in str(raised.value)
    bad = _config(tmp_path / "c", {"auths": {"reg.example": {"auth": "bm9jb2xvbg=="}}})
    with pytest.raises(StackError, match="not base64 of USER:PASSWORD"):
        credentials_for("reg.example", bad)


def test_insecure_registries_are_named_as_dockerd_names_them() -> None:
    access = RegistryAccess.from_environment(
        {"SM120_STACKS_INSECURE_REGISTRIES": "reg.test:5000, plain.test,10.1.0.0/16"}
    )
    assert access.allows_insecure("reg.test:5000")
    assert not access.allows_insecure("reg.test:5443")
    assert access.allows_insecure("plain.test:8080") and access.allows_insecure("plain.test")
    assert access.allows_insecure("10.1.2.3:5000") and not access.allows_insecure("10.2.0.1")
    nothing = RegistryAccess.from_environment({})
    assert not nothing.allows_insecure("127.0.0.1:5000")  # loopback is not plain by default
    loopback = RegistryAccess.from_environment({"SM120_STACKS_INSECURE_REGISTRIES": "127.0.0.0/8"})
    assert loopback.allows_insecure("localhost:5000") and loopback.allows_insecure("127.0.0.1")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SM120_STACKS_INSECURE_REGISTRIES": "10.0.0.0/99"}, "nor an address range"),
        ({"SM120_STACKS_INSECURE_REGISTRIES": "u:hunter2@reg.test"}, "holds a login"),
        ({"SM120_STACKS_REGISTRY_TIMEOUT": "soon"}, "not a number of seconds"),
        ({"SM120_STACKS_REGISTRY_TIMEOUT": "0"}, "not a number of seconds"),
    ],
)
def test_bad_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(StackError, match=message) as raised:
        RegistryAccess.from_environment(env)
    assert "hunter2" not in str(raised.value)


def test_a_registry_with_a_login_in_it_is_refused_without_echoing_it() -> None:
    with pytest.raises(StackError) as raised:
        Registry.parse("bob:hunter2@reg.example:5443/ml")
    assert "holds a login" in str(raised.value) and "hunter2" not in str(raised.value)
    assert raised.value.key == "--registry"


def test_a_ca_that_is_not_pem_and_a_certs_d_folder_without_a_ca(tmp_path: Path) -> None:
    der = tmp_path / "ca.der"
    der.write_bytes(b"\x30\x82\x01\x0a")
    access = RegistryAccess.from_environment({"SM120_STACKS_CA_BUNDLE": str(der)})
    with pytest.raises(StackError, match="not PEM") as raised:
        access.session("reg.example")
    assert raised.value.file == der
    certs_d = tmp_path / "certs.d"
    (certs_d / "reg.example:5443").mkdir(parents=True)
    empty = RegistryAccess.from_environment({"SM120_STACKS_CERTS_D": str(certs_d)})
    with pytest.raises(StackError, match="holds no ca.crt"):
        empty.session("reg.example:5443")
    assert empty.session("reg.example").transport == "tls-verified"  # no folder: system store


def test_an_untrusted_certificate_offers_only_what_registry_commands_take(tmp_path: Path) -> None:
    """A real TLS handshake with a certificate from a CA not trusted here: the hint names
    certs.d and SM120_STACKS_CA_BUNDLE, never `--ca-bundle` (no registry command takes it)."""
    import http.server
    import ssl
    import threading

    from tests.support.tls_registry import make_certificates

    _, cert, key = make_certificates(tmp_path)
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    try:
        access = RegistryAccess.from_environment({"SM120_STACKS_CERTS_D": str(tmp_path / "none")})
        with pytest.raises(StackError) as raised:
            access.session(host).request("GET", "/v2/", "")
    finally:
        server.shutdown()
    said = f"{raised.value} {raised.value.hint}"
    assert "TLS certificate is not trusted" in said
    assert "SM120_STACKS_CA_BUNDLE=FILE" in said and f"{tmp_path}/none/{host}/ca.crt" in said
    assert "--ca-bundle" not in said


def test_a_registry_that_accepts_and_never_answers_is_given_up_on_after_the_timeout(
    tmp_path: Path,
) -> None:
    """A frozen TLS registry (the kernel accepts the connection, nothing answers the client's
    handshake): each try waits SM120_STACKS_REGISTRY_TIMEOUT seconds, as the message says,
    not the ten-second connect limit (urllib3 waits out the handshake under that one)."""
    import socket
    import time

    from builder.errors import ToolMissing

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # never accepted, never answered: the handshake hangs
    host = f"127.0.0.1:{silent.getsockname()[1]}"
    notices: list[str] = []
    access = RegistryAccess.from_environment(
        {"SM120_STACKS_REGISTRY_TIMEOUT": "1", "SM120_STACKS_CERTS_D": str(tmp_path / "none")}
    )
    access = dataclasses.replace(access, notice=notices.append)
    started = time.monotonic()
    try:
        with pytest.raises(ToolMissing) as raised:
            access.session(host).request("GET", "/v2/", "")
    finally:
        silent.close()
    took = time.monotonic() - started
    assert "did not answer within 1 s" in str(raised.value) and "3 attempts" in str(raised.value)
    assert [n.split("; ")[1] for n in notices] == [
        "trying again in 1 s (2 of 3)",
        "trying again in 2 s (3 of 3)",
    ]
    # 3 tries of 1 s and 1 + 2 s between them; ten seconds a try before
    assert took < 9, took
