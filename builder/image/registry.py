"""Registry digest: push and pull stack images by content tag, through the engine API.

docker-py reports push and pull failures inside the progress stream, not as exceptions, so every
streamed line is checked. Connection errors are retried with backoff; after that the registry is
reported unreachable. Nothing here speaks a registry-specific API: the engine does the talking.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from builder.errors import StackError, ToolMissing
from builder.image.names import REPOSITORY, content_tag

REGISTRY_ENV = "SM120_STACKS_REGISTRY"
_REGISTRY = re.compile(
    r"^(?P<host>[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?)"
    r"(/(?P<namespace>[a-z0-9]+([._/-][a-z0-9]+)*))?$"
)
T = TypeVar("T")


class RegistryError(Exception):
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


def push(api: Any, registry: Registry, local_ref: str, stack: str, content_hash: str) -> str:
    """Push the content tag and the moving stack tag; return repo@sha256 of the image."""
    image = api.images.get(local_ref)
    digest = ""
    for tag in (content_tag(stack, content_hash), stack):
        image.tag(registry.repository, tag)

        def push_tag(tag: str = tag) -> str:
            stream = api.api.push(registry.repository, tag=tag, stream=True, decode=True)
            return _check_stream(stream, "push", tag)

        # Every tag is sent (the moving tag too); the digest is the same image's for both.
        pushed = _with_retries(registry, push_tag)
        digest = digest or pushed
    if not digest:
        raise RegistryError(f"push to {registry.repository} reported no digest")
    return f"{registry.repository}@{digest}"


def pull(api: Any, registry: Registry, stack: str, content_hash: str) -> Any:
    """Pull the image of this exact content hash; its label must say the same hash."""
    tag = content_tag(stack, content_hash)
    _with_retries(
        registry,
        lambda: _check_stream(
            api.api.pull(registry.repository, tag=tag, stream=True, decode=True), "pull", tag
        ),
    )
    image = api.images.get(registry.ref(tag))
    label = (image.labels or {}).get("sm120-stacks.content-hash")
    if label != content_hash:
        raise RegistryError(
            f"{registry.ref(tag)} carries content hash {label}, expected {content_hash}"
        )
    return image


def has_image(api: Any, registry: Registry, stack: str, content_hash: str) -> bool:
    """Whether the registry holds this content hash (asks for the manifest, pulls nothing)."""
    from docker.errors import APIError, NotFound

    ref = registry.ref(content_tag(stack, content_hash))

    def ask() -> bool:
        try:
            api.api.inspect_distribution(ref)
        except NotFound:
            return False
        except APIError as exc:
            if _is_connection_error(exc):
                raise
            if "manifest unknown" in str(exc) or "not found" in str(exc).lower():
                return False
            raise RegistryError(f"asking {registry.host} for {ref} failed: {exc}") from None
        return True

    return _with_retries(registry, ask)


def repo_digest(image: Any, registry: Registry) -> str | None:
    """The image's digest in this registry (RepoDigests), not its local image ID."""
    for entry in image.attrs.get("RepoDigests") or []:
        if entry.startswith(registry.repository + "@"):
            return str(entry)
    return None


def _check_stream(lines: Iterable[dict[str, Any]], action: str, tag: str) -> str:
    digest = ""
    for line in lines:
        if "error" in line or "errorDetail" in line:
            detail = line.get("errorDetail", {}).get("message") or line.get("error")
            if _looks_like_connection(str(detail)):
                raise ConnectionError(str(detail))
            raise RegistryError(f"{action} of {tag} failed: {detail}")
        aux = line.get("aux") or {}
        if isinstance(aux, dict) and aux.get("Digest"):
            digest = str(aux["Digest"])
        status = str(line.get("status", ""))
        if match := re.search(r"digest: (sha256:[0-9a-f]{64})", status):
            digest = digest or match.group(1)
    return digest


def _with_retries(
    registry: Registry, action: Callable[[], T], attempts: int = 5, first_delay: float = 0.5
) -> T:
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if not _is_connection_error(exc):
                raise
            if attempt == attempts:
                raise ToolMissing(
                    f"registry {registry.host} is unreachable after {attempts} attempts: "
                    f"{str(exc)[:200]}",
                    hint="start the registry or fix --registry / "
                    f"{REGISTRY_ENV} (HOST[:PORT][/NAMESPACE])",
                ) from None
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def _is_connection_error(exc: BaseException) -> bool:
    import requests

    if isinstance(exc, ConnectionError | requests.exceptions.ConnectionError):
        return True
    return _looks_like_connection(str(exc))


def _looks_like_connection(text: str) -> bool:
    markers = (
        "connection refused",
        "no such host",
        "i/o timeout",
        "connection reset",
        "dial tcp",
        "EOF",
        "server misbehaving",
        "network is unreachable",
    )
    return any(marker in text for marker in markers)
