"""Which image a smoked server runs, for `smoke --url --record`: the verdict is signed for
that digest, not for whatever the content tag names now (issue 43: a trusted operator key
signed "served and passed" for an image it never ran).

A server on this machine's loopback is found through the engine (the container publishing
the URL's port): the manifest digest recorded is the one whose config is that container's
image id. Any other server names its image: `--image REPO@sha256:...`, which must be in the
registry the verdict goes to and whose verdict must be of the stack's current content.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from builder.engine.protocol import Engine
from builder.errors import StackError
from builder.evidence.oci import ArtifactStore
from builder.image.registry import Registry

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def served_digest(
    url: str, image: str | None, target: Registry, engine: Engine | None, tag_digest: str
) -> str:
    """The manifest digest of what the server at url runs; tag_digest: what the content tag
    names (the candidate for a local container)."""
    if image is not None:
        return _named(image, target)
    parts = urlsplit(url)
    running = _local_image_id(engine, parts.port or 80) if parts.hostname in LOOPBACK else None
    if running is None:
        raise StackError(
            f"cannot tell which image the server at {url} runs (no container on this engine "
            "publishes its port)",
            key="--image",
            hint="name it: --image REPO@sha256:... (the digest the server's host pulled: "
            "`docker inspect --format '{{.Image}}' CONTAINER` there, or the pin's `image`)",
        )
    store = ArtifactStore(target)
    config = (store.manifest(store.image(tag_digest)).get("config") or {}).get("digest")
    if config != running:
        raise StackError(
            f"the server at {url} runs image {running[:19]}, and the stack's content tag in "
            f"{target.repository} names {tag_digest[:19]} (config {str(config)[:19]}): "
            "nothing recorded",
            key="--image",
            hint="smoke the server of the image you mean to vouch for, or name the image it "
            "runs with --image REPO@sha256:...",
        )
    return tag_digest


def _named(image: str, target: Registry) -> str:
    repository, at, digest = image.rpartition("@")
    if not at or not digest.startswith("sha256:") or len(digest) != 71:
        raise StackError(
            f"--image {image!r} is not REPO@sha256:<64 hex>",
            key="--image",
            hint="the digest the server's host pulled (the pin's `image`)",
        )
    if repository != target.repository:
        raise StackError(
            f"--image names {repository}, and the verdict goes to {target.repository}",
            key="--image",
            hint="give --registry the registry and namespace the image is in",
        )
    return digest


def _local_image_id(engine: Engine | None, port: int) -> str | None:
    """The image id of the running container on engine that publishes port, if one does."""
    if engine is None:
        return None
    for container in engine.containers():
        ports = ((container.attrs.get("NetworkSettings") or {}).get("Ports")) or {}
        for bindings in ports.values():
            if any(str(b.get("HostPort")) == str(port) for b in bindings or []):
                return str(container.attrs.get("Image") or "") or None
    return None


__all__ = ["served_digest"]
