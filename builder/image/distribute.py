"""Stack-level push and pull: registry operations plus local tags and records.

registry.py knows images and tags; this module knows stacks: which content hash is current,
that a pulled image gets the same local tags a build would give it, and that every push is
recorded with its digest (what `pin` later requires).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.engine.protocol import Engine, OnLayer
from builder.errors import StackError
from builder.image.build import find_image
from builder.image.names import local_ref, moving_ref
from builder.image.records import load_record, require_tested, save_record
from builder.image.registry import Registry, has_image, pull, push
from builder.render.context import RenderedContext


@dataclass(frozen=True)
class Pushed:
    stack: str
    content_hash: str
    digest_ref: str


def push_stack(
    rendered: RenderedContext,
    build_dir: Path,
    engine: Engine,
    registry: Registry,
    force: bool = False,
    progress: OnLayer | None = None,
) -> Pushed:
    name, content_hash = rendered.stack, rendered.content_hash()
    ref = local_ref(name, content_hash)
    image = find_image(engine, ref, content_hash)
    if image is None:
        raise StackError(
            f"no local image of {name} at its current content hash ({ref})",
            hint=f"build it first: sm120-stacks build {name}",
        )
    record = load_record(build_dir, name, content_hash)
    if record.image_id not in (None, image.id):
        # Another build folder on this engine built this content again: what this folder
        # tested was the image before, so the tag's image is untested here.
        record.attach_image(image.id)
    if not force:
        require_tested(
            record,
            ref,
            "refusing to push an untested image",
            hint=f"run `sm120-stacks test {name}`, or pass --force to push anyway",
        )
    digest_ref = push(engine, registry, ref, name, content_hash, progress)
    record.pushed[registry.repository] = digest_ref
    save_record(build_dir, record)
    return Pushed(name, content_hash, digest_ref)


def pull_stack(
    rendered: RenderedContext,
    build_dir: Path,
    engine: Engine,
    registry: Registry,
    progress: OnLayer | None = None,
) -> str:
    """Pull the image of the stack's current content hash and tag it as a build would."""
    name, content_hash = rendered.stack, rendered.content_hash()
    image = pull(engine, registry, name, content_hash, progress)
    engine.tag(image.id, local_ref(name, content_hash))
    engine.tag(image.id, moving_ref(name))
    record = load_record(build_dir, name, content_hash)
    record.attach_image(image.id)
    save_record(build_dir, record)
    return local_ref(name, content_hash)


def registry_has_current(rendered: RenderedContext, engine: Engine, registry: Registry) -> bool:
    return has_image(engine, registry, rendered.stack, rendered.content_hash())
