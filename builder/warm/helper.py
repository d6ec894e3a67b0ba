"""The image every cache-volume helper runs: the tool's own, never the pinned one.

Reading and writing a host's cache volume (drift, cache list/prove/capture, doctor, the restore
before a start) needs a shell on the volume's engine: `find` for listings, `mv` under the
restore journal, `rm -rf` for a purge. Neither way that avoids a container was enough:

- the engine's archive API on a container created and never started reads files (GET archive)
  and adds them (PUT archive), but cannot rename, delete or list without streaming every byte
  (a 45 GB model folder for its revision): a restore's journalled swap and a purge are
  impossible through it;
- a helper of the pinned image ran that image's `sleep`, `sh` and `find` as root on the volume
  before the image passed the trust policy (issue 43: an image whose `sleep` planted a file in
  live/triton/ had it loaded by the signed server after a re-pin).

So the helper is an image the tool owns: its Debian base (scripts/make-base-local.sh, built by
debootstrap from Debian's signed packages, never pulled from a registry), or the image a person
names in SM120_STACKS_VOLUME_HELPER. It is resolved on the volume's engine to its image id and
run by that id, a content address: a registry writer cannot substitute it, and a name moved
after the lookup runs nothing else. Nothing of the pinned image runs, whatever its evidence.
"""

from __future__ import annotations

import os

from builder.engine.protocol import Engine
from builder.errors import EngineError, StackError

HELPER_ENV = "SM120_STACKS_VOLUME_HELPER"
#: scripts/make-base-local.sh's image: a shell, GNU find, coreutils.
DEFAULT_HELPER = "local/debian-python:bookworm"


def helper_reference() -> str:
    return os.environ.get(HELPER_ENV) or DEFAULT_HELPER


def helper_image(engine: Engine) -> str:
    """The helper's image id on this engine (`sha256:...`), what the helper container runs."""
    reference = helper_reference()
    try:
        image = engine.image(reference)
    except EngineError as exc:
        raise StackError(
            f"cannot look up the cache volume helper image {reference}: {exc.explanation}",
            key=HELPER_ENV,
        ) from None
    if image is None:
        raise StackError(
            f"the cache volume helper image {reference} is not on this engine: the tool reads "
            "and writes cache volumes with an image of its own, never the pinned one",
            key=HELPER_ENV,
            hint="make it on the host (`scripts/make-base-local.sh`, with DOCKER_HOST naming "
            f"its engine), or set {HELPER_ENV} to an image you trust there (a shell, GNU find "
            "and coreutils), by ID or repo@sha256",
        )
    return image.id
