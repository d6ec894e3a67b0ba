"""Which lines of a proxy CA bundle the image check looks for: the private certificates only."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import certifi

from builder.verify.validate import proxy_ca_lines


def test_only_certificates_outside_the_public_set_are_looked_for(tmp_path: Path) -> None:
    """The image's own CA store ships the public certificates; searching for one of them
    would fail every image. A private (proxy) certificate is what must not leak."""
    public = Path(certifi.where()).read_text()
    first_public = public[public.index("-----BEGIN CERTIFICATE-----") :]
    first_public = first_public[: first_public.index("-----END CERTIFICATE-----") + 25]
    body = base64.b64encode(os.urandom(48 * 8)).decode()
    private_lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    private = "\n".join(
        ["-----BEGIN CERTIFICATE-----", *private_lines, "-----END CERTIFICATE-----"]
    )
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(f"{first_public}\n{private}\n")
    assert proxy_ca_lines(bundle) == [private_lines[len(private_lines) // 2]]
    assert proxy_ca_lines(None) == [] and proxy_ca_lines(tmp_path / "none.pem") == []


def test_a_certificate_of_a_public_set_is_not_looked_for(tmp_path: Path) -> None:
    """Debian's Mozilla copy differs from certifi's; grpc ships an older one still. A cert of
    any public set must not count as the proxy CA, or every vLLM image fails the check."""
    body = base64.b64encode(os.urandom(48 * 8)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    pem = "\n".join(["-----BEGIN CERTIFICATE-----", *lines, "-----END CERTIFICATE-----"])
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(pem + "\n")
    assert proxy_ca_lines(bundle, public="") == [lines[len(lines) // 2]]
    assert proxy_ca_lines(bundle, public=pem) == []
