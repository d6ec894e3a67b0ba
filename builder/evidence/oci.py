"""Artifacts that refer to an image, in an OCI registry, over its HTTP API.

The HTTP goes through image/registry_http.py: the registry's TLS and login as the engine has
them, timeouts and retries. An artifact is an OCI image manifest whose `artifactType` says what
it is, whose one layer is the document, whose config is the empty descriptor and whose
`subject` is the image's manifest descriptor (OCI image spec 1.1, "artifacts guidance").
Finding an image's artifacts:

- the referrers API (`GET /v2/NAME/referrers/DIGEST`, distribution spec 1.1) where the registry
  answers it with an image index;
- otherwise the referrers tag scheme of the same spec: an image index tagged `sha256-<hex>` of
  the subject digest, listing every artifact; the pusher updates it (read, add, put). Debian's
  docker-registry (distribution 2.8) has no referrers API: this is what it gets.

Every manifest and blob read back is checked against the digest it was asked for; the
registry's word alone never counts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from builder.engine import imageref
from builder.errors import OperationFailed, StackError
from builder.image.names import REPOSITORY
from builder.image.registry import Registry
from builder.image.registry_http import RegistryAccess

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_BYTES = b"{}"
#: What an image's own manifest may be (the engine pushes Docker v2 manifests).
IMAGE_MEDIA_TYPES = (MANIFEST, DOCKER_MANIFEST, INDEX, DOCKER_LIST)
#: Registries answer in seconds or not at all; a blob here is a few hundred kB at most.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
CHUNKED_ABOVE = 64 * 1024 * 1024
CHUNK_BYTES = 16 * 1024 * 1024


class ManifestUnknown(StackError):
    """The registry answers, and has no manifest under that tag or digest."""


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    artifact_type: str | None = None
    annotations: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
        }
        if self.artifact_type:
            data["artifactType"] = self.artifact_type
        if self.annotations:
            data["annotations"] = dict(self.annotations)
        return data

    @classmethod
    def of(cls, data: Any) -> Descriptor:
        if not isinstance(data, dict):
            raise ValueError("a descriptor is a JSON object")
        annotations = data.get("annotations") or {}
        return cls(
            media_type=str(data["mediaType"]),
            digest=str(data["digest"]),
            size=int(data["size"]),
            artifact_type=data.get("artifactType"),
            annotations=tuple(sorted((str(k), str(v)) for k, v in annotations.items())),
        )

    def annotation(self, key: str) -> str | None:
        return dict(self.annotations).get(key)


def referrers_tag(digest: str) -> str:
    """The distribution spec's fallback tag of a subject: `sha256-<hex>`."""
    algorithm, _, hexdigest = digest.partition(":")
    return f"{algorithm}-{hexdigest}"


class ArtifactStore:
    """Artifacts of images in one registry repository (the stacks' repository)."""

    def __init__(
        self, registry: Registry, name: str | None = None, access: RegistryAccess | None = None
    ) -> None:
        self.registry = registry
        self.session = (access or RegistryAccess.from_environment()).session(registry.host)
        #: Manifests and blobs already read and checked against their digest: content
        #: addressed, so first use's pass and the read after it fetch each document once.
        self._checked: dict[str, bytes] = {}
        self.name = name or "/".join(
            [*([registry.namespace] if registry.namespace else []), REPOSITORY]
        )

    @property
    def transport(self) -> str:
        """How the documents went: tls-verified, or what the user allowed for this registry."""
        self.session.base  # noqa: B018 - the scheme is settled by the first request
        return self.session.transport

    @classmethod
    def of_image(cls, image: str) -> ArtifactStore:
        """The store of the repository an image reference (HOST/NAME@sha256:... or :tag)
        names: a pin's image, whichever repository it was pushed to."""
        hint = "pin an image pushed to a registry (`sm120-stacks push STACK`)"
        try:
            parts = imageref.parse(image)
        except ValueError as exc:
            raise StackError(str(exc), hint=hint) from None
        if parts.host is None:
            raise StackError(f"{image} names no registry host", hint=hint)
        return cls(Registry(parts.host), parts.path)

    # -- reading --

    def image(self, reference: str) -> Descriptor:
        """The descriptor of the image manifest a tag or digest names (its bytes' digest)."""
        data, media_type = self._manifest(reference, IMAGE_MEDIA_TYPES)
        digest = sha256_digest(data)
        if reference.startswith("sha256:") and digest != reference:
            raise _tampered(f"manifest {reference}", digest)
        return Descriptor(media_type, digest, len(data))

    def manifest(self, descriptor: Descriptor) -> dict[str, Any]:
        """An artifact's manifest, checked against its descriptor."""
        data = self._checked.get(descriptor.digest)
        if data is None:
            data, _ = self._manifest(descriptor.digest, (descriptor.media_type,))
            if sha256_digest(data) != descriptor.digest or len(data) != descriptor.size:
                raise _tampered(f"manifest {descriptor.digest}", sha256_digest(data))
            self._checked[descriptor.digest] = data
        parsed = json.loads(data)
        if not isinstance(parsed, dict):
            raise OperationFailed(f"manifest {descriptor.digest} is not a JSON object")
        return parsed

    def blob(self, descriptor: Descriptor) -> bytes:
        """A blob's bytes, checked against its descriptor (size and sha256)."""
        if descriptor.size > MAX_DOCUMENT_BYTES:
            raise OperationFailed(f"blob {descriptor.digest} is {descriptor.size} bytes: too big")
        known = self._checked.get(descriptor.digest)
        if known is not None and len(known) == descriptor.size:
            return known
        response = self._request("GET", f"/blobs/{descriptor.digest}")
        if response.status_code == 404:
            raise StackError(f"the registry has no blob {descriptor.digest}")
        _ok(response, f"blob {descriptor.digest}")
        data = response.content
        if sha256_digest(data) != descriptor.digest or len(data) != descriptor.size:
            raise _tampered(f"blob {descriptor.digest}", sha256_digest(data))
        self._checked[descriptor.digest] = bytes(data)
        return bytes(data)

    def referrers(self, subject: str) -> tuple[list[Descriptor], str]:
        """The artifacts that name subject, and how they were found ("referrers API" or
        "referrers tag")."""
        answered = self._api_index(subject)
        if answered is not None:
            return _index_entries(answered), "referrers API"
        return self._tag_index(subject), "referrers tag"

    @functools.cached_property
    def has_referrers_api(self) -> bool:
        """Asked once per store: a push attaches three artifacts."""
        return self._api_index("sha256:" + "0" * 64) is not None

    def _api_index(self, subject: str) -> bytes | None:
        """The referrers API's index for subject; None where the registry has no such API."""
        response = self._request("GET", f"/referrers/{subject}", accept=INDEX)
        kind = response.headers.get("content-type", "").split(";")[0]
        return bytes(response.content) if response.status_code == 200 and kind == INDEX else None

    # -- writing --

    def attach(
        self,
        subject: Descriptor,
        artifact_type: str,
        media_type: str,
        payload: bytes,
        annotations: dict[str, str],
    ) -> Descriptor:
        """Push payload as an artifact referring to subject; its manifest's descriptor."""
        with tempfile.TemporaryDirectory(prefix="sm120-evidence-") as scratch:
            path = Path(scratch) / "blob"
            path.write_bytes(payload)
            return self.attach_files(subject, artifact_type, [(path, media_type)], annotations)

    def attach_files(
        self,
        subject: Descriptor,
        artifact_type: str,
        layers: list[tuple[Path, str]],
        annotations: dict[str, str],
    ) -> Descriptor:
        """Push files (of any size, streamed) as the layers of one artifact referring to
        subject, in order; the artifact manifest's descriptor."""
        pushed = [self._put_file(path, media_type) for path, media_type in layers]
        config = self._put_blob(EMPTY_BYTES, EMPTY)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "artifactType": artifact_type,
            "config": config.to_json(),
            "layers": [layer.to_json() for layer in pushed],
            "subject": subject.to_json(),
            "annotations": annotations,
        }
        data = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        digest = sha256_digest(data)
        self._put_manifest(digest, data, MANIFEST)
        found = Descriptor(
            MANIFEST,
            digest,
            len(data),
            artifact_type,
            tuple(sorted(annotations.items())),
        )
        if not self.has_referrers_api:
            self._add_to_tag_index(subject.digest, found)
        return found

    def blob_to_file(self, descriptor: Descriptor, path: Path) -> None:
        """Stream a blob of any size into path, checked against its descriptor (size and
        sha256) as it arrives; path is removed when the bytes are not intact."""
        response = self._request("GET", f"/blobs/{descriptor.digest}", stream=True)
        if response.status_code == 404:
            raise StackError(f"the registry has no blob {descriptor.digest}")
        _ok(response, f"blob {descriptor.digest}")
        digest = hashlib.sha256()
        size = 0
        try:
            with path.open("wb") as out:
                for chunk in response.iter_content(chunk_size=1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        got = "sha256:" + digest.hexdigest()
        if got != descriptor.digest or size != descriptor.size:
            path.unlink(missing_ok=True)
            raise _tampered(f"blob {descriptor.digest}", got)

    # -- the registry's HTTP (registry_http: TLS, login, timeouts, retries) --

    def _request(
        self, method: str, path: str, accept: str | None = None, push: bool = False, **kwargs: Any
    ) -> Any:
        headers = dict(kwargs.pop("headers", {}))
        if accept:
            headers["Accept"] = accept
        scope = f"repository:{self.name}:{'pull,push' if push else 'pull'}"
        url = path if path.startswith("http") else f"/v2/{self.name}{path}"
        return self.session.request(method, url, scope, headers=headers, **kwargs)

    def _manifest(self, reference: str, media_types: tuple[str, ...]) -> tuple[bytes, str]:
        response = self._request("GET", f"/manifests/{reference}", accept=", ".join(media_types))
        if response.status_code == 404:
            raise ManifestUnknown(f"the registry {self.registry.host} has no manifest {reference}")
        _ok(response, f"manifest {reference}")
        kind = response.headers.get("content-type", "").split(";")[0]
        return bytes(response.content), kind or media_types[0]

    def _put_blob(self, data: bytes, media_type: str) -> Descriptor:
        with tempfile.TemporaryDirectory(prefix="sm120-evidence-") as scratch:
            path = Path(scratch) / "blob"
            path.write_bytes(data)
            return self._put_file(path, media_type)

    def _put_file(self, path: Path, media_type: str) -> Descriptor:
        """Upload a file as a blob unless the registry has it: one PUT, or for a cache of
        gigabytes PATCHes of CHUNK_BYTES (distribution's POST, PATCH..., PUT)."""
        digest, size = _file_digest(path)
        found = Descriptor(media_type, digest, size)
        if self._request("HEAD", f"/blobs/{digest}").status_code == 200:
            return found
        started = self._request("POST", "/blobs/uploads/", push=True)
        _ok(started, f"blob upload of {media_type}")
        location = _location(started, self.session.base)
        with path.open("rb") as source:
            if size > CHUNKED_ABOVE:
                offset = 0
                while chunk := source.read(CHUNK_BYTES):
                    headers = {
                        "Content-Type": "application/octet-stream",
                        "Content-Range": f"{offset}-{offset + len(chunk) - 1}",
                    }
                    sent = self._request("PATCH", location, push=True, headers=headers, data=chunk)
                    _ok(sent, f"blob upload of {media_type}")
                    location = _location(sent, self.session.base)
                    offset += len(chunk)
                body: Any = b""
            else:
                body = source
            joiner = "&" if "?" in location else "?"
            done = self._request(
                "PUT",
                f"{location}{joiner}digest={digest}",
                push=True,
                headers={"Content-Type": "application/octet-stream"},
                data=body,
            )
        _ok(done, f"blob upload of {media_type}")
        return found

    def _put_manifest(self, reference: str, data: bytes, media_type: str) -> None:
        response = self._request(
            "PUT",
            f"/manifests/{reference}",
            push=True,
            headers={"Content-Type": media_type},
            data=data,
        )
        _ok(response, f"manifest upload {reference}")

    def _tag_index(self, subject: str) -> list[Descriptor]:
        response = self._request("GET", f"/manifests/{referrers_tag(subject)}", accept=INDEX)
        if response.status_code == 404:
            return []
        _ok(response, f"referrers tag of {subject}")
        return _index_entries(response.content)

    def _add_to_tag_index(self, subject: str, artifact: Descriptor) -> None:
        entries = [e for e in self._tag_index(subject) if e.digest != artifact.digest]
        index = {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [e.to_json() for e in [*entries, artifact]],
        }
        data = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
        self._put_manifest(referrers_tag(subject), data, INDEX)


def _index_entries(data: bytes) -> list[Descriptor]:
    try:
        index = json.loads(data)
        return [Descriptor.of(entry) for entry in index.get("manifests") or []]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise OperationFailed(
            f"the registry's referrers index is not an OCI index ({exc})"
        ) from None


def _ok(response: Any, what: str) -> None:
    if response.status_code not in (200, 201, 202):
        body = " ".join(str(getattr(response, "text", "")).split())[:300]
        raise OperationFailed(f"the registry refused {what}: HTTP {response.status_code} {body}")


def _tampered(what: str, got: str) -> StackError:
    return StackError(
        f"{what} is not intact: its bytes hash to {got}",
        hint="the registry's copy was changed or truncated: push the image and its evidence "
        "again from the build machine (`sm120-stacks push STACK`)",
    )


def _file_digest(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return "sha256:" + digest.hexdigest(), size


def _location(response: Any, base: str) -> str:
    """Where an upload goes on: the Location header, which may be relative to the registry."""
    location = response.headers.get("Location")
    if not location:
        raise OperationFailed("the registry started a blob upload without a Location")
    return str(urljoin(base + "/", location))


__all__ = [
    "EMPTY",
    "INDEX",
    "MANIFEST",
    "ArtifactStore",
    "Descriptor",
    "ManifestUnknown",
    "referrers_tag",
    "sha256_digest",
]
