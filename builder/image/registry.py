"""Registry digest: push and pull stack images by content tag, through the engine API.

Transient failures (the connection refused, reset or cut short, a timeout, a 5xx) are retried
with backoff; after that the registry is reported unreachable. A failure the engine had already
retried itself (dockerd retries a layer upload five times, about 50 s) is reported at once:
retrying it here made a registry answering 500 take over four minutes to report. Whatever
the registry itself answered (unknown manifest, auth) is reported at once: asking again cannot
change it. Nothing here speaks a registry-specific API: the engine does the talking.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from builder.engine import imageref
from builder.engine.protocol import Engine, Image, OnLayer
from builder.errors import (
    EngineError,
    EngineNotFound,
    EngineUnreachable,
    OperationFailed,
    StackError,
    ToolMissing,
)
from builder.image.names import REPOSITORY, content_tag
from builder.image.registry_http import refuse_inline_login

REGISTRY_ENV = "SM120_STACKS_REGISTRY"
_REGISTRY = imageref.REGISTRY_RE
T = TypeVar("T")


class RegistryError(OperationFailed):
    """The registry refused an operation (auth, missing tag, bad manifest)."""


@dataclass(frozen=True)
class Registry:
    host: str
    namespace: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> Registry:
        value = text or os.environ.get(REGISTRY_ENV)
        if not value:
            raise StackError(
                "no registry given",
                hint=f"pass --registry HOST[:PORT][/NAMESPACE] or set {REGISTRY_ENV}",
            )
        refuse_inline_login(value, "--registry")
        match = _REGISTRY.match(value)
        if match is None:
            raise StackError(
                f"registry {value!r} is not HOST[:PORT][/NAMESPACE]",
                key="--registry",
                hint="e.g. 127.0.0.1:5000 or registry.example.com/ml",
            )
        return cls(match.group("host"), match.group("namespace"))

    @property
    def repository(self) -> str:
        parts = [self.host, *([self.namespace] if self.namespace else []), REPOSITORY]
        return "/".join(parts)

    def ref(self, tag: str) -> str:
        return f"{self.repository}:{tag}"

    @property
    def option(self) -> str:
        """As `--registry` takes it, to repeat in a command a hint offers."""
        return "/".join([self.host, *([self.namespace] if self.namespace else [])])


def push(
    engine: Engine,
    registry: Registry,
    local_ref: str,
    stack: str,
    content_hash: str,
    progress: OnLayer | None = None,
    tags: tuple[str, ...] | None = None,
) -> str:
    """Push the content tag and the moving stack tag (or the tags given); return repo@sha256
    of the image. progress: told each layer event of every push (the second finds every layer
    there).

    The engine pushes a local name, so each tag is first put on the image as
    REGISTRY/REPO:TAG. A push that fails takes off the names it put there (not one the image
    already had): a failed push leaves no tag on this engine that no record names."""
    image = engine.image(local_ref)
    if image is None:
        raise RegistryError(f"there is no local image {local_ref} to push")
    added: list[str] = []
    try:
        digest = ""
        for tag in tags or (content_tag(stack, content_hash), stack):
            if _tag_new(engine, image.id, registry.ref(tag)):
                added.append(registry.ref(tag))

            def push_tag(tag: str = tag) -> str:
                return _answered(
                    "push", tag, lambda: engine.push(registry.repository, tag, progress), registry
                )

            # Every tag is sent (the moving tag too); the digest is the same image's for both.
            pushed = _with_retries(registry, push_tag)
            digest = digest or pushed
        if not digest:
            raise RegistryError(f"push to {registry.repository} reported no digest")
    except BaseException:
        _untag_quietly(engine, added)
        raise
    return f"{registry.repository}@{digest}"


def _tag_new(engine: Engine, image_id: str, ref: str) -> bool:
    """Put ref on the image; whether it is a name the image did not have before."""
    held = engine.image(ref)
    engine.tag(image_id, ref)
    return held is None or held.id != image_id


def _untag_quietly(engine: Engine, refs: list[str]) -> None:
    """Take refs off their image as far as the engine lets: the push's own failure is what is
    reported (an engine that went down keeps the names; the next push reuses them)."""
    for ref in refs:
        try:
            engine.untag(ref)
        except EngineError:
            continue


def pull(
    engine: Engine,
    registry: Registry,
    stack: str,
    content_hash: str,
    progress: OnLayer | None = None,
    verified: tuple[str, str] | None = None,
) -> Image:
    """Pull the image of this exact content hash; its label must say the same hash.
    verified: (manifest digest, config digest) of the image whose evidence was checked: the
    engine then pulls REPO@digest, never the tag (which a registry writer may move between
    the check and the pull), and the pulled image's id must be that config digest."""
    tag = content_tag(stack, content_hash)
    wanted = verified[0] if verified else tag
    ref = f"{registry.repository}@{wanted}" if verified else registry.ref(tag)
    _with_retries(
        registry,
        lambda: _answered(
            "pull", tag, lambda: engine.pull(registry.repository, wanted, progress), registry
        ),
    )
    image = engine.image(ref)
    if image is None:
        raise RegistryError(f"the engine pulled {ref} but does not have it")
    if verified and image.id != verified[1]:
        raise RegistryError(
            f"the engine pulled {ref} as image {image.id}, and the verified manifest names "
            f"config {verified[1]}: nothing was tagged or recorded"
        )
    label = image.labels.get("sm120-stacks.content-hash")
    if label != content_hash:
        raise RegistryError(
            f"{registry.ref(tag)} carries content hash {label}, expected {content_hash}"
        )
    return image


def has_image(engine: Engine, registry: Registry, stack: str, content_hash: str) -> bool:
    """Whether the registry holds this content hash (asks for the manifest, pulls nothing)."""
    ref = registry.ref(content_tag(stack, content_hash))

    def ask() -> bool:
        try:
            engine.registry_digest(ref)
        except EngineNotFound:
            return False
        except EngineError as exc:
            if is_transient(exc):
                raise
            if "manifest unknown" in exc.explanation or "not found" in exc.explanation.lower():
                return False
            raise RegistryError(
                f"asking {registry.host} for {ref} failed: {exc.explanation}"
            ) from None
        return True

    return _with_retries(registry, ask)


def repo_digest(image: Image, registry: Registry) -> str | None:
    """The image's digest in this registry (RepoDigests), not its local image ID."""
    for entry in image.repo_digests:
        if entry.startswith(registry.repository + "@"):
            return entry
    return None


def _answered(action: str, tag: str, call: Callable[[], T], registry: Registry) -> T:
    """call, with the registry's own refusal (anything not transient) as an error. Where the
    engine's words give the cause away (a login, a CA), what the user fixes: a StackError with
    the remedy, exit 2, as the evidence side says the same refusal; else a RegistryError."""
    try:
        return call()
    except EngineError as exc:
        if is_transient(exc):
            raise
        remedy = _remedy(exc.explanation, registry.host)
        if remedy is not None:
            raise StackError(f"{action} of {tag} failed: {exc.explanation}", hint=remedy) from None
        raise RegistryError(f"{action} of {tag} failed: {exc.explanation}") from None


def _remedy(explanation: str, host: str) -> str | None:
    if _NO_LOGIN.search(explanation):
        return f"log in as the engine's client reads it: docker login {host}"
    if "x509" in explanation or "certificate signed by unknown authority" in explanation:
        return (
            f"trust the registry's CA where the engine reads it: /etc/docker/certs.d/{host}/ca.crt"
        )
    return None


_NO_LOGIN = re.compile(
    r"no basic auth credentials|unauthorized|authentication required|denied", re.IGNORECASE
)


def _with_retries(
    registry: Registry, action: Callable[[], T], attempts: int = 5, first_delay: float = 0.5
) -> T:
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except EngineError as exc:
            if not is_transient(exc):
                raise
            if attempt == attempts or exc.retried:
                tries = "the engine's own retries" if exc.retried else f"{attempts} attempts"
                state = (
                    "answered server errors"
                    if _SERVER_ERROR.search(exc.explanation)
                    else "is unreachable"
                )
                raise ToolMissing(
                    f"registry {registry.host} {state} after {tries}: " f"{exc.explanation[:200]}",
                    hint="start the registry or fix --registry / "
                    f"{REGISTRY_ENV} (HOST[:PORT][/NAMESPACE]); nothing was recorded, and "
                    "a push again sends only what the registry lacks",
                ) from None
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


#: What only the registry itself says (the distribution spec's error codes, Docker's auth
#: messages). A message carrying one was answered: asking again gets the same answer, whatever
#: else the message holds (a registry may quote "EOF" or a 5xx from behind it).
_REGISTRY_ANSWER = re.compile(
    r"\b(?:manifest unknown|manifest invalid|manifest blob unknown|manifest unverified"
    r"|blob unknown|blob upload (?:unknown|invalid)|name unknown|name invalid|tag invalid"
    r"|digest invalid|size invalid|unsupported|unauthorized|denied|toomanyrequests"
    r"|authentication required|no basic auth credentials|insufficient_scope|not found)\b",
    re.IGNORECASE,
)
#: Failures of the connection to the registry or of the registry's server, which pass.
_TRANSIENT = re.compile(
    "|".join(
        (
            # Go's net errors: the dial failed (refused, no route, DNS not answering), or the
            # established connection was reset, broken, closed or timed out.
            r"\bdial tcp\b",
            r"\bconnection refused\b",
            r"\bconnection reset by peer\b",
            r"\bbroken pipe\b",
            r"\buse of closed network connection\b",
            r"\bi/o timeout\b",
            r"\bTLS handshake timeout\b",
            r"\bClient\.Timeout exceeded\b",
            r"\bcontext deadline exceeded\b",
            r"\btimeout awaiting response headers\b",
            # The connection ended mid-answer: Go's io.ErrUnexpectedEOF, or io.EOF as the whole
            # error of an HTTP request (`Get "https://host/v2/": EOF`).
            r"\bunexpected EOF\b",
            r'\b(?i:get|head|put|post|patch|delete) "[^"]+": EOF\b',
            # The registry's server failed (5xx), as Docker and containerd phrase its status.
            r"\bHTTP status: 5\d\d\b",
            r"\bHTTP 5\d\d response\b",
            r"\b5\d\d (?:Internal Server Error|Bad Gateway|Service Unavailable|Gateway Timeout)\b",
        )
    )
)

#: The transient failures that are the registry's server's (a 5xx), to say so.
_SERVER_ERROR = re.compile(
    r"\bHTTP status: 5\d\d\b|\bHTTP 5\d\d response\b"
    r"|\b5\d\d (?:Internal Server Error|Bad Gateway|Service Unavailable|Gateway Timeout)\b"
)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying could help: the engine's API dropped, or the engine relayed a failure
    of the connection to the registry or of its server. Judged on the daemon's message, not the
    engine API's status, which is 500 for everything the daemon relays."""
    if isinstance(exc, EngineUnreachable):
        return True
    if not isinstance(exc, EngineError):
        return False
    return is_transient_message(exc.explanation)


def is_transient_message(text: str) -> bool:
    return _REGISTRY_ANSWER.search(text) is None and _TRANSIENT.search(text) is not None
