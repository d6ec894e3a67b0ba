"""A registry with Bearer-token auth, as Harbor, GHCR, GitLab and Docker Hub have it, on loopback.

Debian's docker-registry (distribution 2.8) serves it over TLS from a CA made here, with
`auth: token:`: it answers 401 with `Bearer realm=...,service=...,scope=...` and accepts only
JWTs its token service signed. The token service is ours (http.server, TLS with the same CA):
it checks a user's password (Basic, a GET) or an identity token (a POST with
grant_type=refresh_token) and signs the distribution spec's JWT with an ECDSA P-256 key whose
self-signed certificate is the registry's `rootcertbundle` and rides in the header's x5c (what
registry/auth/token/token.go of distribution 2.8 verifies: iss, aud, exp and nbf with 60 s of
leeway, the x5c chain to a root in the bundle, an ES256 signature as JOSE's r||s).

Every request the token service saw is kept (never a secret in it), so a test can say which
scope was asked for and which grant.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.net import free_port
from tests.support.tls_registry import make_certificates

SERVICE = "sm120-test-registry"
ISSUER = "sm120-test-token-service"
TOKEN_SECONDS = 300


@dataclass(frozen=True)
class TokenRequest:
    """One request the token service answered: how it was asked, and what it said."""

    method: str
    grant: str  # "password" (Basic on a GET) or the POST's grant_type
    service: str
    scopes: tuple[str, ...]
    user: str | None  # whom it knew the request came from; None: refused
    status: int


@dataclass
class TokenService:
    """The users it knows (user: password), the identity tokens it issued (token: user)."""

    passwords: dict[str, str]
    identity_tokens: dict[str, str]
    #: Users who may pull and nothing more (a read-only account, a pull robot).
    pull_only: frozenset[str]
    signing_key: object
    signing_cert_der: bytes
    seen: list[TokenRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def grant(self, request: TokenRequest, scopes: list[str]) -> dict[str, object] | None:
        with self.lock:
            self.seen.append(request)
        if request.user is None:
            return None
        granted = access_claims(scopes, pull_only=request.user in self.pull_only)
        token = sign_token(self, request.user, request.service, granted)
        return {"token": token, "access_token": token, "expires_in": TOKEN_SECONDS}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def access_claims(scopes: list[str], pull_only: bool = False) -> list[dict[str, object]]:
    """`repository:NAME:pull,push` scopes as the JWT's access claim: all that is asked, or for
    a pull-only user the pull alone (as Harbor and GHCR grant less than asked, not refuse)."""
    claims: list[dict[str, object]] = []
    for scope in " ".join(scopes).split():
        kind, _, rest = scope.partition(":")
        name, _, actions = rest.rpartition(":")
        granted = [a for a in actions.split(",") if a == "pull" or not pull_only]
        claims.append({"type": kind, "name": name, "actions": granted})
    return claims


def sign_token(
    service: TokenService, user: str, audience: str, access: list[dict[str, object]]
) -> str:
    """An ES256 JWT as distribution 2.8 verifies it (header x5c, its claim set)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    now = int(time.time())
    header = {
        "typ": "JWT",
        "alg": "ES256",
        "x5c": [base64.b64encode(service.signing_cert_der).decode()],
    }
    claims = {
        "iss": ISSUER,
        "sub": user,
        "aud": audience,
        "exp": now + TOKEN_SECONDS,
        "nbf": now - 1,
        "iat": now,
        "jti": os.urandom(12).hex(),
        "access": access,
    }
    signing_input = ".".join(
        _b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
    )
    key = service.signing_key
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def make_signing_certificate(folder: Path) -> tuple[object, bytes, Path]:
    """The token service's key, and its self-signed certificate (DER, and the PEM bundle the
    registry trusts)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    bundle = folder / "token-signing.crt"
    bundle.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert.public_bytes(serialization.Encoding.DER), bundle


def _handler(service: TokenService) -> type[BaseHTTPRequestHandler]:
    class TokenHandler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # the requests are kept in service.seen, without their secrets

        def do_GET(self) -> None:
            query = parse_qs(urlsplit(self.path).query)
            user = self._basic_user()
            asked = TokenRequest(
                "GET", "password", _one(query, "service"), tuple(query.get("scope", [])),
                user, 200 if user else 401,
            )  # fmt: skip
            self._answer(service.grant(asked, query.get("scope", [])))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
            grant = _one(form, "grant_type")
            user = None
            if grant == "refresh_token":
                user = service.identity_tokens.get(_one(form, "refresh_token"))
            elif grant == "password":
                name = _one(form, "username")
                if service.passwords.get(name) == _one(form, "password"):
                    user = name
            asked = TokenRequest(
                "POST", grant, _one(form, "service"), tuple(form.get("scope", [])),
                user, 200 if user else 401,
            )  # fmt: skip
            self._answer(service.grant(asked, form.get("scope", [])))

        def _basic_user(self) -> str | None:
            kind, _, value = (self.headers.get("Authorization") or "").partition(" ")
            if kind.lower() != "basic":
                return None
            try:
                name, _, password = base64.b64decode(value).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return name if service.passwords.get(name) == password else None

        def _answer(self, body: dict[str, object] | None) -> None:
            refused = {"errors": [{"code": "UNAUTHORIZED", "message": "authentication failed"}]}
            data = json.dumps(body if body is not None else refused).encode()
            self.send_response(200 if body is not None else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return TokenHandler


def _one(values: dict[str, list[str]], key: str) -> str:
    return (values.get(key) or [""])[0]


class _TlsServer(ThreadingHTTPServer):
    """TLS spoken in each connection's own thread: a client that opens a connection and
    waits (Go's HTTP client does) must not hold up the accept loop in a handshake."""

    context: ssl.SSLContext
    daemon_threads = True

    def finish_request(self, request: Any, client_address: Any) -> None:
        with contextlib.suppress(OSError):
            super().finish_request(self.context.wrap_socket(request, server_side=True),
                                   client_address)  # fmt: skip

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-handshake: nothing the test needs to see


@contextlib.contextmanager
def token_service(
    service: TokenService, cert: Path, key: Path
) -> Iterator[tuple[str, ThreadingHTTPServer]]:
    """The token service on a loopback port, over TLS: (its realm URL, the server)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = _TlsServer(("127.0.0.1", free_port()), _handler(service))
    server.context = context
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/token", server
    finally:
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class TokenRegistry:
    host: str
    user: str
    password: str
    identity_token: str
    reader: str  # a user who may only pull; its password is `password` too
    realm: str
    ca: Path
    certs_d: Path
    service: TokenService
    log: Path

    def docker_config(self, folder: Path, entry: dict[str, str]) -> Path:
        """A DOCKER_CONFIG folder whose config.json holds entry as this registry's login."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"auths": {self.host: entry}}))
        return folder

    def password_login(
        self, folder: Path, password: str | None = None, user: str | None = None
    ) -> Path:
        """The `auths` entry `docker login HOST` writes for a user and password."""
        pair = f"{user or self.user}:{self.password if password is None else password}"
        return self.docker_config(folder, {"auth": base64.b64encode(pair.encode()).decode()})

    def token_login(self, folder: Path) -> Path:
        """The entry `docker login` writes where the token service gave an identity token."""
        user = base64.b64encode(f"{self.user}:".encode()).decode()
        return self.docker_config(folder, {"auth": user, "identitytoken": self.identity_token})

    def env(self, docker_config: Path, **extra: str) -> dict[str, str]:
        """What a user who logged in and trusted the CA has: no insecure registry."""
        return {
            "DOCKER_CONFIG": str(docker_config),
            "SM120_STACKS_CERTS_D": str(self.certs_d),
            "SM120_STACKS_INSECURE_REGISTRIES": "",
            **extra,
        }

    def seen(self) -> list[TokenRequest]:
        with self.service.lock:
            return list(self.service.seen)


def _registry_config(folder: Path, host: str, cert: Path, key: Path, realm: str,
                     bundle: Path) -> Path:  # fmt: skip
    config = folder / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: info\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
        "  delete:\n    enabled: true\n"
        f"http:\n  addr: {host}\n  tls:\n    certificate: {cert}\n    key: {key}\n"
        f"auth:\n  token:\n    realm: {realm}\n    service: {SERVICE}\n"
        f"    issuer: {ISSUER}\n    rootcertbundle: {bundle}\n"
    )
    return config


@contextlib.contextmanager
def token_registry(folder: Path) -> Iterator[TokenRegistry]:
    """docker-registry with token auth and its token service, both on loopback over TLS."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, cert, key = make_certificates(folder)
    # The token service's TLS from a CA of its own, as a realm on another host has: trusted
    # only because certs.d/HOST holds it beside the registry's (the engine reads every *.crt).
    (folder / "token-tls").mkdir()
    token_ca, token_cert, token_key = make_certificates(folder / "token-tls")
    user, password = "sm120-tester", "pw-" + os.urandom(12).hex()
    identity_token = "idt-" + os.urandom(16).hex()
    signing_key, signing_der, bundle = make_signing_certificate(folder)
    reader = "sm120-reader"
    service = TokenService(
        {user: password, reader: password}, {identity_token: user}, frozenset({reader}),
        signing_key, signing_der,
    )  # fmt: skip
    host = f"127.0.0.1:{free_port()}"
    with token_service(service, token_cert, token_key) as (realm, _server):
        config = _registry_config(folder, host, cert, key, realm, bundle)
        log = folder / "registry.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["docker-registry", "serve", str(config)], stdout=out, stderr=out
            )
        try:
            _wait_for_challenge(host, ca, log)
            certs_d = folder / "certs.d"
            (certs_d / host).mkdir(parents=True)
            (certs_d / host / "ca.crt").write_bytes(ca.read_bytes())
            (certs_d / host / "token-service-ca.crt").write_bytes(token_ca.read_bytes())
            yield TokenRegistry(
                host, user, password, identity_token, reader, realm, ca, certs_d, service, log
            )
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def _wait_for_challenge(host: str, ca: Path, log: Path) -> None:
    """Up once /v2/ answers 401 with a Bearer challenge (token auth configured, not htpasswd)."""
    context = ssl.create_default_context(cafile=str(ca))
    for _ in range(60):
        try:
            urllib.request.urlopen(f"https://{host}/v2/", timeout=2, context=context)
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and exc.headers.get("WWW-Authenticate", "").startswith("Bearer"):
                return
            raise RuntimeError(f"the token registry answered {exc.code} {exc.headers}") from None
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the token registry on {host} did not come up: {log.read_text()[-2000:]}")
