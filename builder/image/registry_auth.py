"""The credentials `docker login` left for a registry, found where the engine finds them.

The engine pushes the image with what the Docker client's config gives it; the evidence beside
the image must go up with the same login, or a push to any registry with a password stops
halfway. So this reads the same places in the same order as the Docker CLI: the config file in
$DOCKER_CONFIG (else ~/.docker/config.json), then a per-registry credential helper
(`credHelpers`), else the default store (`credsStore`), else the inline `auths` entry.

A secret read here lives only in memory: it is never logged, never written, and the objects
that carry it print as `Credentials(user=..., secret=<hidden>)`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import StackError

#: How long a credential helper (a keychain, a cloud CLI) may take to answer.
HELPER_TIMEOUT_S = 30
#: The Docker CLI's name for an identity token in place of a user (OAuth2 refresh token).
TOKEN_USER = "<token>"


@dataclass(frozen=True)
class Credentials:
    user: str
    secret: str = field(repr=False)
    #: Where they came from, for messages: the config file, or `helper NAME`.
    source: str = ""

    @property
    def identity_token(self) -> bool:
        """An identity (refresh) token in place of a password, swapped for an access token."""
        return self.user == TOKEN_USER

    def basic(self) -> str:
        pair = f"{self.user}:{self.secret}".encode()
        return "Basic " + base64.b64encode(pair).decode()


def config_file(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    folder = env.get("DOCKER_CONFIG")
    return Path(folder) / "config.json" if folder else Path.home() / ".docker" / "config.json"


def credentials_for(host: str, environ: Mapping[str, str] | None = None) -> Credentials | None:
    """The login for host (HOST[:PORT]) that the Docker CLI would use; None when there is none."""
    env = os.environ if environ is None else environ
    path = config_file(env)
    config = _read_config(path)
    helpers = config.get("credHelpers") or {}
    helper = helpers.get(host) if isinstance(helpers, dict) else None
    helper = helper or config.get("credsStore")
    if isinstance(helper, str) and helper:
        found = _from_helper(helper, host, env)
        if found is not None:
            return found
    auths = config.get("auths") or {}
    if not isinstance(auths, dict):
        return None
    for key, entry in auths.items():
        if _host_of(str(key)) == host and isinstance(entry, dict):
            return _from_entry(entry, path, key)
    return None


def _read_config(path: Path) -> dict[str, object]:
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StackError(
            f"cannot read the Docker client config ({exc.__class__.__name__})",
            file=path,
            hint="fix or remove it, then `docker login HOST` again (DOCKER_CONFIG names "
            "its folder)",
        ) from None
    return loaded if isinstance(loaded, dict) else {}


def _host_of(key: str) -> str:
    """An `auths` key as the CLI writes it: `host`, `https://host` or `https://host/v1/`."""
    return key.split("://", 1)[-1].split("/", 1)[0]


def _from_entry(entry: dict[str, object], path: Path, key: str) -> Credentials | None:
    token = entry.get("identitytoken")
    if isinstance(token, str) and token:
        return Credentials(TOKEN_USER, token, str(path))
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            user, sep, secret = base64.b64decode(auth).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            sep = ""
        if not sep:
            raise StackError(
                "the saved login is not base64 of USER:PASSWORD",
                file=path,
                key=f"auths.{key}.auth",
                hint=f"log in again: docker login {_host_of(key)}",
            )
        return Credentials(user, secret, str(path))
    name, password = entry.get("username"), entry.get("password")
    if isinstance(name, str) and isinstance(password, str) and name:
        return Credentials(name, password, str(path))
    return None


def _from_helper(helper: str, host: str, env: Mapping[str, str]) -> Credentials | None:
    """Ask `docker-credential-HELPER get` (its protocol: the server on stdin, JSON out)."""
    program = shutil.which(f"docker-credential-{helper}", path=env.get("PATH"))
    if program is None:
        raise StackError(
            f"the Docker client config names the credential helper {helper!r}, and "
            f"docker-credential-{helper} is not on PATH",
            hint="install it, or remove credsStore/credHelpers from the config and "
            f"`docker login {host}` again",
        )
    try:
        done = subprocess.run(
            [program, "get"],
            input=host,
            capture_output=True,
            text=True,
            timeout=HELPER_TIMEOUT_S,
            check=False,
            env=dict(env),
        )
    except subprocess.TimeoutExpired:
        raise StackError(
            f"docker-credential-{helper} did not answer for {host} in {HELPER_TIMEOUT_S} s",
            hint="unlock its keychain or check the helper",
        ) from None
    if done.returncode != 0:
        return None  # "credentials not found": the helper holds no login for this host
    try:
        answer = json.loads(done.stdout)
        user, secret = str(answer["Username"]), str(answer["Secret"])
    except (ValueError, KeyError, TypeError):
        raise StackError(
            f"docker-credential-{helper} answered something that is not its JSON for {host}",
            hint="check the helper (`docker-credential-" + helper + " list`)",
        ) from None
    return Credentials(user, secret, f"helper {helper}")


__all__ = ["Credentials", "config_file", "credentials_for"]
