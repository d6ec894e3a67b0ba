"""Speaking to a registry's HTTP API ourselves, as the engine does: TLS, login, timeouts.

The engine moves the image; the documents beside it (evidence, warm caches) go through here,
so they must reach every registry the image reaches:

- **TLS, verified**, against the system trust store, the engine's own per-registry folder
  (`/etc/docker/certs.d/HOST/*.crt`, with `client.cert`/`client.key` for mutual TLS) and the
  tool's CA variable (SM120_STACKS_CA_BUNDLE; registry commands take no `--ca-bundle`, only
  build and test do). Plain HTTP, or TLS without
  verification, only for a registry the user names in SM120_STACKS_INSECURE_REGISTRIES (as
  dockerd's `insecure-registries`: TLS is tried first, unverified, then plain HTTP); the
  transport used is reported (`transport`), so evidence can say how it went up.
- **The login `docker login` saved** (registry_auth.py), answered to the registry's challenge:
  Basic, or the distribution spec's Bearer-token flow (the realm, service and scope the
  registry names; an identity token is swapped for an access token).
- **Timeouts on every request**, and retries of what may pass (no connection, no answer, 429
  and 5xx), each said before it waits. What the registry answered otherwise is its answer.

Nothing here holds a secret longer than a session; no message carries one.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.errors import StackError, ToolMissing
from builder.image import cabundle, registry_auth

INSECURE_ENV = "SM120_STACKS_INSECURE_REGISTRIES"
TIMEOUT_ENV = "SM120_STACKS_REGISTRY_TIMEOUT"
CERTS_D_ENV = "SM120_STACKS_CERTS_D"
#: Where dockerd reads a registry's CA and client certificate (its own docs).
CERTS_D = Path("/etc/docker/certs.d")
CONNECT_TIMEOUT_S = 10.0
#: A registry answers a manifest in milliseconds; a blob of a warm cache streams for longer,
#: but never this long without a byte.
READ_TIMEOUT_S = 60.0
ATTEMPTS = 3
#: What a request may get back and try again for.
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})

TLS_VERIFIED = "tls-verified"
TLS_UNVERIFIED = "tls-unverified"
PLAIN_HTTP = "plain-http"

_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class RegistryAccess:
    """How to reach registries: what the user set, read once where a command starts."""

    insecure: frozenset[str] = frozenset()
    ca_bundle: Path | None = None
    certs_d: Path = CERTS_D
    read_timeout: float = READ_TIMEOUT_S
    attempts: int = ATTEMPTS
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)
    notice: Callable[[str], None] = field(default=lambda text: print(text, file=sys.stderr))

    @property
    def connect_timeout(self) -> float:
        """Seconds to connect, TLS handshake included (urllib3 waits for the server's side of
        the handshake under the connect timeout): never more than the read timeout, so a
        registry that accepts connections and then says nothing (frozen) is given up on after
        SM120_STACKS_REGISTRY_TIMEOUT seconds, as its message says, not after ten."""
        return min(CONNECT_TIMEOUT_S, self.read_timeout)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> RegistryAccess:
        env = dict(os.environ if environ is None else environ)
        listed = {h.strip() for h in env.get(INSECURE_ENV, "").split(",") if h.strip()}
        for entry in listed:
            refuse_inline_login(entry, INSECURE_ENV)
            if "/" in entry:
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise StackError(
                        f"{entry!r} is neither HOST[:PORT] nor an address range",
                        key=INSECURE_ENV,
                        hint="e.g. 127.0.0.1:5000,registry.test,10.0.0.0/8",
                    ) from None
        return cls(
            insecure=frozenset(listed),
            ca_bundle=_tool_ca(env.get(cabundle.ENV_VAR)),
            certs_d=Path(env.get(CERTS_D_ENV) or CERTS_D),
            read_timeout=_timeout(env.get(TIMEOUT_ENV)),
            environ=env,
        )

    def session(self, host: str) -> RegistrySession:
        return RegistrySession(host, self)

    def allows_insecure(self, host: str) -> bool:
        """Whether the user named host insecure: as HOST[:PORT], as HOST for any port, or by
        an address range (`127.0.0.0/8`), as dockerd's insecure-registries reads them."""
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]")
        if host in self.insecure or name in self.insecure:
            return True
        try:
            address = ipaddress.ip_address("127.0.0.1" if name == "localhost" else name)
        except ValueError:
            return False
        for entry in self.insecure:
            if "/" in entry:
                try:
                    if address in ipaddress.ip_network(entry, strict=False):
                        return True
                except ValueError:
                    continue
        return False


class RegistrySession:
    """Requests to one registry host, with its trust, its login and its tokens."""

    def __init__(self, host: str, access: RegistryAccess) -> None:
        import requests

        self.host = host
        self.access = access
        self.http = requests.Session()
        self.http.headers["User-Agent"] = "sm120-stacks"
        self._tokens: dict[str, str] = {}
        self._basic: str | None = None
        self._scheme: str | None = None
        self.transport = TLS_VERIFIED
        if access.allows_insecure(host):
            import urllib3

            # The user named this registry insecure, and the evidence says so: no warning
            # per request on top.
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            self.transport = TLS_UNVERIFIED
            self.http.verify = False
        else:
            # Every https URL, not only this host's: the token service a Bearer challenge
            # names (often another host or port) is trusted as the registry is, as the
            # engine's token fetch uses the registry's TLS settings.
            self.http.mount("https://", _trust_adapter(self._tls_context()))

    @property
    def base(self) -> str:
        if self._scheme is None:
            self._scheme = self._pick_scheme()
        return f"{self._scheme}://{self.host}"

    def request(self, method: str, url: str, scope: str, **kwargs: Any) -> Any:
        """method url (absolute, or a path under /v2/), logged in for scope, retried where
        it may pass; the response whatever its status but 401."""
        if url.startswith("/"):
            url = self.base + url
        response = self._send(method, url, scope, kwargs)
        if response.status_code == 401:
            self._answer_challenge(response, scope)
            response = self._send(method, url, scope, kwargs)
            if response.status_code == 401:
                raise self._login_refused(response, scope)
        return response

    # -- the connection --

    def _send(self, method: str, url: str, scope: str, kwargs: dict[str, Any]) -> Any:
        import requests

        headers = dict(kwargs.get("headers") or {})
        authorization = self._tokens.get(scope) or self._basic
        if authorization:
            headers["Authorization"] = authorization
        sent = {**kwargs, "headers": headers}
        timeout = (self.access.connect_timeout, self.access.read_timeout)
        path = url.split(self.host, 1)[-1].split("?", 1)[0]
        for attempt in range(1, self.access.attempts + 1):
            body = sent.get("data")
            if body is not None and hasattr(body, "seek"):
                body.seek(0)  # a file sent again from its start
            try:
                response = self.http.request(method, url, timeout=timeout, **sent)
            except requests.exceptions.SSLError as exc:
                raise self._tls_failed(exc) from None
            except (requests.ConnectionError, requests.Timeout) as exc:
                what = _no_answer(exc, self.access)
                if attempt == self.access.attempts:
                    raise ToolMissing(
                        f"the registry {self.host} {what} ({method} {path}, "
                        f"{attempt} attempts)",
                        hint="start it or check the address (--registry / "
                        "SM120_STACKS_REGISTRY); a slow registry: raise "
                        f"{TIMEOUT_ENV} (seconds, now {self.access.read_timeout:g})",
                    ) from None
            else:
                if response.status_code not in RETRY_STATUS or attempt == self.access.attempts:
                    return response
                what = f"answered HTTP {response.status_code}"
            delay = float(2 ** (attempt - 1))
            self.access.notice(
                f"registry {self.host}: {method} {path} {what}; trying again in {delay:g} s "
                f"({attempt + 1} of {self.access.attempts})"
            )
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _pick_scheme(self) -> str:
        """https, and for a registry named insecure plain http where TLS is not spoken."""
        import requests

        if not self.access.allows_insecure(self.host):
            return "https"
        try:
            self.http.get(f"https://{self.host}/v2/", timeout=(CONNECT_TIMEOUT_S, 10.0))
            return "https"
        except requests.exceptions.SSLError:
            self.transport = PLAIN_HTTP
            return "http"
        except requests.RequestException:
            return "https"  # no answer at all: the real request says so, retried

    def _tls_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        folder = self.access.certs_d / self.host
        if folder.is_dir():
            cas = sorted(folder.glob("*.crt"))
            clients = sorted(folder.glob("*.cert"))
            if not cas and not clients:
                raise StackError(
                    f"{folder} holds no ca.crt (nor a client.cert)",
                    file=folder,
                    hint=f"put the registry's CA certificate (PEM) in {folder}/ca.crt, as the "
                    "engine reads it, or remove the empty folder",
                )
            for ca in cas:
                _load_ca(context, ca)
            for cert in clients:
                key = cert.with_suffix(".key")
                try:
                    context.load_cert_chain(cert, key)
                except (OSError, ssl.SSLError) as exc:
                    raise StackError(
                        f"client certificate {cert.name} with {key.name}: {exc}",
                        file=cert,
                        hint="give the client certificate and its key as PEM, side by side",
                    ) from None
        if self.access.ca_bundle is not None:
            _load_ca(context, self.access.ca_bundle)
        return context

    def _tls_failed(self, exc: Exception) -> StackError:
        reason = _ssl_reason(exc)
        if "wrong version number" in reason.lower() or "record layer" in reason.lower():
            return StackError(
                f"the registry {self.host} does not speak TLS (it answers plain HTTP)",
                hint=f"the tool uses TLS unless told: for a test registry, set "
                f"{INSECURE_ENV}={self.host} (plain HTTP, as dockerd's insecure-registries)",
            )
        return StackError(
            f"the registry {self.host}'s TLS certificate is not trusted here: {reason}",
            hint=f"put its CA certificate in {self.access.certs_d}/{self.host}/ca.crt (where "
            f"the engine reads it too) or set {cabundle.ENV_VAR}=FILE; "
            f"only for a test registry: {INSECURE_ENV}={self.host}",
        )

    # -- the login --

    def _answer_challenge(self, response: Any, scope: str) -> None:
        challenge = response.headers.get("WWW-Authenticate", "")
        kind, _, rest = challenge.partition(" ")
        credentials = registry_auth.credentials_for(self.host, self.access.environ)
        if kind.lower() == "basic":
            if credentials is None or credentials.identity_token:
                raise self._login_missing()
            self._basic = credentials.basic()
            return
        if kind.lower() != "bearer":
            raise StackError(
                f"the registry {self.host} asks for a login the tool does not speak "
                f"({kind or 'no WWW-Authenticate'})",
                hint="use a registry with Basic or Bearer-token auth (the distribution spec's)",
            )
        params = dict(_CHALLENGE_PARAM.findall(rest))
        self._tokens[scope] = "Bearer " + self._token(params, scope, credentials)

    def _token(
        self,
        params: dict[str, str],
        scope: str,
        credentials: registry_auth.Credentials | None,
    ) -> str:
        realm = params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise StackError(
                f"the registry {self.host} names a token service that is no URL: {realm!r}",
                hint="check the registry's auth configuration (token realm)",
            )
        if realm.startswith("http://") and not self.access.allows_insecure(self.host):
            raise StackError(
                f"the registry {self.host} sends logins to a plain-HTTP token service",
                hint=f"fix the registry's token realm, or for a test registry {INSECURE_ENV}",
            )
        query = {"service": params.get("service", ""), "scope": params.get("scope") or scope}
        timeout = (self.access.connect_timeout, self.access.read_timeout)
        if credentials is not None and credentials.identity_token:
            form = {**query, "grant_type": "refresh_token", "refresh_token": credentials.secret}
            form["client_id"] = "sm120-stacks"
            answer = self._ask_token_service("POST", realm, data=form, timeout=timeout)
        else:
            headers = {"Authorization": credentials.basic()} if credentials else {}
            answer = self._ask_token_service(
                "GET", realm, params=query, headers=headers, timeout=timeout
            )
        if answer.status_code in (401, 403):
            raise self._login_refused() if credentials else self._login_missing()
        try:
            body = answer.json()
            return str(body.get("token") or body["access_token"])
        except (ValueError, KeyError, AttributeError):
            raise StackError(
                f"the token service of {self.host} answered HTTP {answer.status_code} "
                "without a token",
                hint=f"check the login (`docker login {self.host}`)",
            ) from None

    def _ask_token_service(self, method: str, realm: str, **kwargs: Any) -> Any:
        """The token request, its failures said as the registry's are (no traceback; the
        realm's query and form, which may hold a secret, never in the message)."""
        import requests

        service = realm.split("?", 1)[0]
        try:
            return self.http.request(method, realm, **kwargs)
        except requests.exceptions.SSLError as exc:
            raise StackError(
                f"the token service of {self.host} ({service}) has a TLS certificate not "
                f"trusted here: {_ssl_reason(exc)}",
                hint=f"put its CA certificate in {self.access.certs_d}/{self.host}/ca.crt or "
                f"set {cabundle.ENV_VAR}=FILE",
            ) from None
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise ToolMissing(
                f"the token service of {self.host} ({service}) {_no_answer(exc, self.access)}",
                hint="check the registry's token realm, or try again when it answers",
            ) from None

    def _login_missing(self) -> StackError:
        config = registry_auth.config_file(self.access.environ)
        return StackError(
            f"the registry {self.host} asks for a login, and the Docker client config "
            f"({config}) holds none for it",
            hint=f"docker login {self.host} (DOCKER_CONFIG names another config folder)",
        )

    def _login_refused(self, response: Any = None, scope: str = "") -> StackError:
        config = registry_auth.config_file(self.access.environ)
        challenge = response.headers.get("WWW-Authenticate", "") if response is not None else ""
        if 'error="insufficient_scope"' in challenge:
            # The login was good; the token it got grants less than asked (a pull-only user
            # or robot account pushing): not a matter of logging in again.
            _, name, actions = [*scope.split(":"), "", ""][:3]
            return StackError(
                f"the registry {self.host} accepted the login saved in {config}, and that "
                f"login is not granted {actions} on {name}",
                hint=f"ask the registry's administrator for {actions} access to {name}, or "
                f"`docker login {self.host}` as a user who has it",
            )
        return StackError(
            f"the registry {self.host} refused the login saved in {config}",
            hint=f"log in again: docker login {self.host}",
        )


def _trust_adapter(context: ssl.SSLContext) -> Any:
    """requests' HTTPAdapter with our SSL context (requests is imported late: it is slow to
    import, and most commands never reach a registry)."""
    from requests.adapters import HTTPAdapter

    class TrustAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            kwargs["ssl_context"] = context
            super().init_poolmanager(*args, **kwargs)

        def proxy_manager_for(self, *args: Any, **kwargs: Any) -> Any:
            kwargs["ssl_context"] = context
            return super().proxy_manager_for(*args, **kwargs)

    return TrustAdapter()


def _load_ca(context: ssl.SSLContext, path: Path) -> None:
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise StackError(f"cannot read the CA file ({exc.strerror})", file=path) from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise StackError(
            "this CA file is not PEM (no BEGIN CERTIFICATE)",
            file=path,
            hint="give the CA certificate as PEM (`openssl x509 -inform der -in F -out F.pem`)",
        )
    try:
        context.load_verify_locations(cadata=text)
    except ssl.SSLError as exc:
        raise StackError(f"this CA file does not load: {exc}", file=path) from None


def _tool_ca(value: str | None) -> Path | None:
    """The tool's CA option for registries: a file given, or none (the system store is
    always trusted); `none` as for builds."""
    if not value or value == cabundle.OPT_OUT:
        return None
    return cabundle.resolve_ca_bundle(value)


def _timeout(value: str | None) -> float:
    if not value:
        return READ_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise StackError(
            f"{TIMEOUT_ENV}={value!r} is not a number of seconds above 0",
            key=TIMEOUT_ENV,
            hint="e.g. 60",
        )
    return seconds


def refuse_inline_login(value: str, where: str) -> None:
    """A registry written with a login in it (USER:PASS@HOST): refused without echoing it."""
    if "@" in value.split("/", 1)[0]:
        raise StackError(
            "a registry address holds a login (USER:PASSWORD@HOST); it is not repeated here",
            key=where,
            hint="give HOST[:PORT] alone and log in with `docker login HOST`; the tool reads "
            "that login, as the engine does",
        )


def _no_answer(exc: Exception, access: RegistryAccess) -> str:
    import requests

    if isinstance(exc, requests.exceptions.ReadTimeout):
        return f"did not answer within {access.read_timeout:g} s"
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return f"did not accept a connection within {access.connect_timeout:g} s"
    text = str(exc)
    if "Connection refused" in text:
        return "refused the connection (nothing listens there)"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "has a name that does not resolve"
    return "could not be reached: " + _last_reason(text)


def _ssl_reason(exc: Exception) -> str:
    """The reason at the end of requests' wrapped TLS error (CERTIFICATE_VERIFY_FAILED...)."""
    text = str(exc)
    found = re.findall(r"\[SSL[^\]]*\][^()'\"]*|certificate verify failed[^()'\"]*", text)
    return (found[-1] if found else _last_reason(text)).strip(" :")


def _last_reason(text: str) -> str:
    inner = re.findall(r"\(([^()]+)\)", text)
    return (inner[-1] if inner else text)[-200:]


__all__ = [
    "INSECURE_ENV",
    "PLAIN_HTTP",
    "TIMEOUT_ENV",
    "TLS_UNVERIFIED",
    "TLS_VERIFIED",
    "RegistryAccess",
    "RegistrySession",
    "refuse_inline_login",
]
