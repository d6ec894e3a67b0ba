"""A registry writer with push access and nothing else: the registry's plain HTTP API (the
distribution spec), no key the hosts trust and no code of this tool.

What it can do is what issue 43's threat model grants such a writer: put blobs and manifests,
move a tag, add an artifact to an image's referrers (the `sha256-<hex>` index tag the local
registry keeps, having no referrers API), take one out, and sign with a key of its own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"
ACCEPT = ", ".join(
    [OCI_MANIFEST, OCI_INDEX, "application/vnd.docker.distribution.manifest.v2+json"]
)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Attacker:
    """Push access to one repository of a registry at host (plain HTTP)."""

    host: str
    repository: str

    def _url(self, path: str) -> str:
        return f"http://{self.host}/v2/{self.repository}{path}"

    def _send(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes, dict[str, str]]:
        request = urllib.request.Request(
            self._url(path) if path.startswith("/") else path,
            data=data,
            method=method,
            headers=headers or {},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as error:
            return error.code, error.read(), dict(error.headers)

    def put_blob(self, data: bytes) -> str:
        digest = _digest(data)
        status, _, headers = self._send("POST", "/blobs/uploads/")
        assert status == 202, status
        location = headers["Location"]
        if location.startswith("/"):
            location = f"http://{self.host}{location}"
        joiner = "&" if "?" in location else "?"
        status, _, _ = self._send(
            "PUT",
            f"{location}{joiner}digest={digest}",
            data,
            {"Content-Type": "application/octet-stream"},
        )
        assert status == 201, status
        return digest

    def manifest(self, reference: str) -> tuple[bytes, str]:
        status, body, headers = self._send(
            "GET", f"/manifests/{reference}", headers={"Accept": ACCEPT}
        )
        assert status == 200, (status, body[:200])
        return body, headers.get("Content-Type", OCI_MANIFEST).split(";")[0]

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        status, answer, _ = self._send(
            "PUT", f"/manifests/{reference}", body, {"Content-Type": media_type}
        )
        assert status == 201, (status, answer[:300])
        return _digest(body)

    def blob(self, digest: str) -> bytes:
        status, body, _ = self._send("GET", f"/blobs/{digest}")
        assert status == 200, status
        return body

    # -- referrers (the index tag the registry keeps for an image without a referrers API) --

    def referrers(self, subject: str) -> dict[str, Any]:
        status, body, _ = self._send(
            "GET", f"/manifests/{subject.replace(':', '-')}", headers={"Accept": OCI_INDEX}
        )
        if status == 404:
            return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        assert status == 200, status
        loaded: dict[str, Any] = json.loads(body)
        return loaded

    def put_referrers(self, subject: str, index: dict[str, Any]) -> None:
        body = json.dumps(index).encode()
        self.put_manifest(subject.replace(":", "-"), body, OCI_INDEX)

    def attach(
        self,
        subject: str,
        artifact_type: str,
        layer_type: str,
        payload: bytes,
        annotations: dict[str, str],
    ) -> str:
        """payload as an artifact whose subject is the image `subject`, listed among its
        referrers; the artifact manifest's digest."""
        body, media_type = self.manifest(subject)
        layer = self.put_blob(payload)
        config = self.put_blob(b"{}")
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": artifact_type,
            "config": {"mediaType": EMPTY, "digest": config, "size": 2},
            "layers": [{"mediaType": layer_type, "digest": layer, "size": len(payload)}],
            "subject": {"mediaType": media_type, "digest": subject, "size": len(body)},
            "annotations": annotations,
        }
        raw = json.dumps(manifest).encode()
        digest = self.put_manifest(_digest(raw), raw, OCI_MANIFEST)
        index = self.referrers(subject)
        index["manifests"].append(
            {
                "mediaType": OCI_MANIFEST,
                "digest": digest,
                "size": len(raw),
                "artifactType": artifact_type,
                "annotations": annotations,
            }
        )
        self.put_referrers(subject, index)
        return digest

    def remove_referrer(self, subject: str, artifact: str) -> None:
        index = self.referrers(subject)
        index["manifests"] = [m for m in index["manifests"] if m["digest"] != artifact]
        self.put_referrers(subject, index)

    def artifacts(self, subject: str) -> list[dict[str, Any]]:
        """The artifact manifests listed for subject, each with its digest."""
        found = []
        for entry in self.referrers(subject)["manifests"]:
            body, _ = self.manifest(entry["digest"])
            found.append({**json.loads(body), "_digest": entry["digest"]})
        return found


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def public_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def key_id(key: ec.EllipticCurvePrivateKey) -> str:
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def envelope(statement: dict[str, Any], key: ec.EllipticCurvePrivateKey) -> bytes:
    """A DSSE envelope of statement signed by key, written from the DSSE spec."""
    payload = json.dumps(statement).encode()
    kind = b"application/vnd.in-toto+json"
    message = b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)
    signature = key.sign(message, ec.ECDSA(hashes.SHA256()))
    return json.dumps(
        {
            "payloadType": kind.decode(),
            "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": key_id(key), "sig": base64.b64encode(signature).decode()}],
        }
    ).encode()


def statement(repository: str, digest: str, predicate_type: str, predicate: Any) -> dict[str, Any]:
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": repository, "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    }
