"""The CA bundle builds get as the `proxy-ca` BuildKit secret: the host's trust store by default.

Behind a TLS-intercepting proxy, pip and uv inside a build fail CERTIFICATE_VERIFY_FAILED unless
they trust the proxy's CA. A host that gets through the proxy itself has that CA in its system
trust store, so the first store found is given to every build unless told otherwise: a file
(`--ca-bundle F`), or `none`. The secret is mounted for the RUN steps that download and is in no
layer; `test` looks for the same bundle's private certificates in the image to prove it.

`python -m builder.image.cabundle [VALUE]` prints the resolved path (nothing for none), so
scripts that build outside the tool (scripts/make-base-cuda-local.sh) use the same default.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from builder.errors import EXIT_BAD_INPUT, StackError

ENV_VAR = "SM120_STACKS_CA_BUNDLE"
#: The value that gives builds no CA bundle at all.
OPT_OUT = "none"
#: System trust stores, first found wins: Debian/Ubuntu (update-ca-certificates), Fedora/RHEL
#: (update-ca-trust), Alpine/macOS/BSD.
SYSTEM_TRUST_STORES = (
    Path("/etc/ssl/certs/ca-certificates.crt"),
    Path("/etc/pki/tls/certs/ca-bundle.crt"),
    Path("/etc/ssl/cert.pem"),
)


def resolve_ca_bundle(value: str | None, stores: Sequence[Path] | None = None) -> Path | None:
    """The bundle for `--ca-bundle value`: None or "" -> the first system trust store that
    exists (None if there is none), "none" -> None, else a file that must exist."""
    if not value:
        found = [p for p in (SYSTEM_TRUST_STORES if stores is None else stores) if p.is_file()]
        return found[0] if found else None
    if value == OPT_OUT:
        return None
    path = Path(value)
    if not path.is_file():
        raise StackError(
            f"CA bundle {value} does not exist" + (" (it is a folder)" if path.is_dir() else ""),
            key="--ca-bundle",
            hint=f"give a PEM file (the proxy's CA, or a trust store holding it), or `{OPT_OUT}` "
            f"for builds without one; without the option ({ENV_VAR} unset) builds get this "
            "host's system trust store",
        )
    return path


def main(argv: Sequence[str]) -> int:
    try:
        path = resolve_ca_bundle(argv[0] if argv else os.environ.get(ENV_VAR))
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if path is not None:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
