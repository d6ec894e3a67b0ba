"""The one grammar of image references (the distribution spec's, restricted to what we use).

Manifests name bases by it, substitutions rewrite it, pins hold `repo@sha256:...`, the
registry option names a host and namespace, and the engine, the evidence and the CLI split a
reference into repository, tag and digest with `parse`: each pattern below is built from the
same parts, so a reference one step accepts is never refused, or split otherwise, by the next.
It lives on the ground floor (builder/engine/) because the engine adapter tags by it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COMPONENT = r"[a-z0-9]+(?:[._-][a-z0-9]+)*"
#: A registry host: DNS labels (upper case allowed, as Docker does) and an optional port.
DOMAIN = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?"
#: A repository name: an optional host (the first component; with a port only where a path
#: follows, so `ubuntu:2204` is a tag and `host:5000/repo` a port) and paths.
NAME = rf"(?:{COMPONENT}(?::[0-9]+)?/)?{COMPONENT}(?:/{COMPONENT})*"
TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST = r"sha256:[0-9a-f]{64}"

#: name[:tag] (what a manifest names as a base).
TAGGED = rf"^{NAME}(?::{TAG})?$"
#: name[:tag][@digest] (what a substitution may name).
REFERENCE = rf"^{NAME}(?::{TAG})?(?:@{DIGEST})?$"
#: name[:tag]@digest (what a pin holds: the exact image, never a moving tag).
PINNED = rf"^{NAME}(?::{TAG})?@{DIGEST}$"
#: host[:port][/namespace] (the --registry option).
REGISTRY = rf"^(?P<host>{DOMAIN})(?:/(?P<namespace>{COMPONENT}(?:/{COMPONENT})*))?$"
DIGEST_ONLY = rf"^{DIGEST}$"

REFERENCE_RE = re.compile(REFERENCE)
REGISTRY_RE = re.compile(REGISTRY)
DIGEST_RE = re.compile(DIGEST_ONLY)
_PARTS_RE = re.compile(rf"^(?P<repository>{NAME})(?::(?P<tag>{TAG}))?(?:@(?P<digest>{DIGEST}))?$")


@dataclass(frozen=True)
class ImageRef:
    """A reference split by the grammar: `repository[:tag][@digest]`."""

    #: With its registry host, if any: 127.0.0.1:5000/sm120-stacks, nvidia/cuda.
    repository: str
    tag: str | None
    digest: str | None

    @property
    def host(self) -> str | None:
        """The registry host the repository names, as Docker tells one: a first component
        with a dot or a port, or `localhost`, before a path; None for a Docker Hub name."""
        first, slash, _ = self.repository.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            return first
        return None

    @property
    def path(self) -> str:
        """The repository without its host: what a registry's /v2/ URLs name."""
        host = self.host
        return self.repository if host is None else self.repository[len(host) + 1 :]

    @property
    def tagged(self) -> str:
        """repository[:tag], the digest left off: what a manifest names as a base."""
        return self.repository if self.tag is None else f"{self.repository}:{self.tag}"

    @property
    def reference(self) -> str | None:
        """What a registry's manifest URL takes for it: the digest if it has one, else the tag
        (None: neither, which Docker reads as `latest`)."""
        return self.digest or self.tag


def digest_of(ref: str) -> str:
    """The digest of a pinned reference (`repository[:tag]@sha256:...`, or the digest alone);
    ValueError for one that names none."""
    digest = parse(ref).digest if not DIGEST_RE.match(ref) else ref
    if digest is None:
        raise ValueError(f"{ref!r} names no digest (REPOSITORY@sha256:DIGEST)")
    return digest


def parse(ref: str) -> ImageRef:
    """ref split by the grammar; ValueError, saying what a reference looks like, for one it
    does not accept."""
    found = _PARTS_RE.match(ref)
    if found is None:
        raise ValueError(
            f"{ref!r} is not an image reference (REPOSITORY[:TAG][@sha256:DIGEST], lower-case "
            "repository, e.g. 127.0.0.1:5000/sm120-stacks:ci-mini)"
        )
    return ImageRef(found["repository"], found["tag"], found["digest"])
