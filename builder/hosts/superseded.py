"""Images a host pulled for pins it no longer has: removed once a deploy passed its gates.

`deploy --apply` pulls each pin's image by digest onto the host's engine and nothing removed
the one before: after three rounds of the tool's soak each host held the image of round 1,
which neither its pin nor its previous pin names (bench/results/tool-soak/leaks.txt), and a
flagship image is tens of GB. After a host passed its gates, the images of its stack that this
tool pulled there and that neither pin names are removed.

"That this tool pulled": an image with no tag at all whose every name is a digest in the pin's
repository (a pull by digest names it so and nothing else does), labelled with the pin's stack.
A built image, one tagged for a push or by hand, one of another repository or stack, and one a
container still uses (the engine refuses) stay. The previous pin's image stays for a rollback.
"""

from __future__ import annotations

from collections.abc import Sequence

from builder.engine.protocol import Engine, Image
from builder.errors import EngineError

STACK_LABEL = "sm120-stacks.stack"


def superseded(engine: Engine, stack: str, keep: Sequence[str]) -> list[Image]:
    """The images of stack on engine that a pull by digest from the repository of keep[0]
    made and that none of keep (image references, repo@sha256:...) names."""
    if not keep:
        return []
    repository = keep[0].split("@", 1)[0]
    kept = {image.id for image in (engine.image(ref) for ref in keep) if image is not None}
    found = []
    for image in engine.images(label=f"{STACK_LABEL}={stack}"):
        tags = [t for t in image.attrs.get("RepoTags") or [] if t != "<none>:<none>"]
        digests = image.repo_digests
        ours = bool(digests) and all(d.split("@", 1)[0] == repository for d in digests)
        if image.id not in kept and not tags and ours:
            found.append(image)
    return found


def remove_superseded(engine: Engine, stack: str, keep: Sequence[str]) -> str | None:
    """Remove what `superseded` finds; what was removed, in words (None: nothing was)."""
    removed = []
    for image in superseded(engine, stack, keep):
        try:
            engine.remove_image(image.id)
        except EngineError:
            continue  # in use by a container, or gone meanwhile: nothing to take back
        removed.append(image.id.removeprefix("sha256:")[:12])
    if not removed:
        return None
    return f"removed {len(removed)} image(s) of earlier pins: {', '.join(removed)}"
