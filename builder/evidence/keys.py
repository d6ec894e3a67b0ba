"""Signing keys: ECDSA P-256 pairs in the PEM forms cosign reads, named by a key id.

cosign makes ECDSA P-256 keys and reads a public key as a PEM block of type `PUBLIC KEY`
holding the key's DER SubjectPublicKeyInfo (sigstore's cryptoutils.UnmarshalPEMToPublicKey,
then x509.ParsePKIXPublicKey), so `cosign verify-attestation --key NAME.pub` takes the public
key written here as it is. The private key is an unencrypted PKCS#8 PEM (`PRIVATE KEY`) in a
file of mode 0600: it is read from a path (a file, a mounted secret), never from an option's
value or the environment's, so it is in no argv, log, report, evidence or `docker inspect`.

The key id is the sha256 (hex) of the public key's DER SubjectPublicKeyInfo: the same for a
key however its PEM is wrapped, and what signatures, the trust policy and pins name a key by.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from builder.errors import StackError

#: The environment variable naming the FILE of the signing key (never the key itself).
SIGNING_KEY_ENV = "SM120_STACKS_SIGNING_KEY"
PRIVATE_SUFFIX = ".key"
PUBLIC_SUFFIX = ".pub"
#: A key file larger than this is not a key (a PEM P-256 key is about 250 bytes).
MAX_KEY_BYTES = 16_384
_PEM_MARK = "-----BEGIN"


@dataclass(frozen=True)
class PublicKey:
    """A public key that may verify signatures, and where it was read from."""

    key_id: str
    key: ec.EllipticCurvePublicKey
    source: str

    def pem(self) -> bytes:
        return public_pem(self.key)


@dataclass(frozen=True)
class SigningKey:
    """A private key read for one command; its repr never shows the key."""

    key_id: str
    key: ec.EllipticCurvePrivateKey

    def __repr__(self) -> str:
        return f"SigningKey(key_id={self.key_id!r})"


def public_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def fingerprint(key_id: str) -> str:
    """The key's fingerprint as ssh prints one (`SHA256:` and the unpadded base64 of the
    sha256 of its DER), to compare with its owner out of band; key_id is that sha256 in hex."""
    return "SHA256:" + base64.b64encode(bytes.fromhex(key_id)).decode().rstrip("=")


def published_key(pem: str, source: str) -> PublicKey | None:
    """A P-256 public key published beside a signature (an artifact's annotation), or None
    where the text is not one: such a key is only a candidate for first use, never trusted
    by being there."""
    if len(pem) > MAX_KEY_BYTES:
        return None
    try:
        key = serialization.load_pem_public_key(pem.encode())
    except (ValueError, UnsupportedAlgorithm):
        return None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        return None
    return PublicKey(key_id=key_id_of(key), key=key, source=source)


def key_id_of(key: ec.EllipticCurvePublicKey) -> str:
    """sha256 (hex) of the DER SubjectPublicKeyInfo."""
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def generate_key_pair(folder: Path, name: str) -> tuple[Path, Path, str]:
    """NAME.key (0600, created exclusively so it is never readable by others, even briefly)
    and NAME.pub in folder; refuses to replace either. Returns both paths and the key id."""
    if not name or "/" in name or name.startswith("."):
        raise StackError(
            f"{name!r} is not a key name", key="NAME", hint="a plain file name, e.g. build-2026"
        )
    private_path = folder / f"{name}{PRIVATE_SUFFIX}"
    public_path = folder / f"{name}{PUBLIC_SUFFIX}"
    for path in (private_path, public_path):
        if path.exists():
            raise StackError(
                "a key of this name exists: refusing to replace it",
                file=path,
                hint="choose another NAME, or remove the old pair first",
            )
    private = ec.generate_private_key(ec.SECP256R1())
    secret = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(descriptor, 0o600)  # whatever the umask left
        os.write(descriptor, secret)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    public = public_pem(private.public_key())
    temporary = public_path.with_name(f".{public_path.name}.tmp")
    temporary.write_bytes(public)
    os.replace(temporary, public_path)
    return private_path, public_path, key_id_of(private.public_key())


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise StackError(f"the {what} is not a file", file=path)
        if info.st_size > MAX_KEY_BYTES:
            raise StackError(f"the {what} is larger than {MAX_KEY_BYTES} bytes", file=path)
        return path.read_bytes()
    except OSError as exc:
        raise StackError(f"cannot read the {what}: {exc.strerror}", file=path) from None


def load_public_key(path: Path) -> PublicKey:
    """A `PUBLIC KEY` PEM of an ECDSA P-256 key; anything else is a StackError naming path."""
    raw = _read_key_file(path, "public key")
    try:
        key = serialization.load_pem_public_key(raw)
    except (ValueError, UnsupportedAlgorithm):
        raise StackError(
            "not a PEM public key (a `-----BEGIN PUBLIC KEY-----` block), or cut short",
            file=path,
            hint="use the NAME.pub that `sm120-stacks keys generate NAME` wrote",
        ) from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise StackError("not an ECDSA P-256 public key", file=path)
    return PublicKey(key_id=key_id_of(key), key=key, source=str(path))


def load_signing_key(path: Path) -> SigningKey:
    """The private key of path. Its bytes are never part of an error message."""
    raw = _read_key_file(path, "signing key")
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise StackError(
            "not an unencrypted PEM private key, or cut short",
            file=path,
            hint="use the NAME.key that `sm120-stacks keys generate NAME` wrote",
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise StackError("not an ECDSA P-256 private key", file=path)
    return SigningKey(key_id=key_id_of(key.public_key()), key=key)


def signing_key_path(value: str | None, option: str) -> Path | None:
    """The FILE an option (or SM120_STACKS_SIGNING_KEY) names; a key pasted in its place is
    refused without echoing it."""
    if value is None or value == "":
        return None
    if _PEM_MARK in value or "\n" in value:
        raise StackError(
            "this takes the path of a key file, and was given what looks like a key",
            key=option,
            hint="write the key to a file of mode 0600 (or mount it as a secret) and pass its "
            "path; the value given was not printed, but it may be in your shell's history",
        )
    return Path(value)
