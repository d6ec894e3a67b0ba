"""Stack-level push and pull: registry operations plus local tags and records.

registry.py knows images and tags; this module knows stacks: which content hash is current,
that a pulled image gets the same local tags a build would give it, and that every push is
recorded with its digest (what `pin` later requires), only once its evidence is beside it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from builder.engine.protocol import Engine, OnLayer
from builder.errors import EngineError, StackError
from builder.image.build import find_image
from builder.image.names import content_tag, local_ref, moving_ref
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
    """Push the image under its content tag alone, recording nothing: the moving tag and the
    record wait until its evidence is there too (evidence/publish.py), so a push that stops
    halfway leaves nothing a `pin` would take for pushed."""
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
    tag = content_tag(name, content_hash)
    digest_ref = push(engine, registry, ref, name, content_hash, progress, tags=(tag,))
    return Pushed(name, content_hash, digest_ref)


def finish_push(
    pushed: Pushed,
    build_dir: Path,
    engine: Engine,
    registry: Registry,
    progress: OnLayer | None = None,
) -> None:
    """Once the image and its evidence are in the registry: the moving tag, then the record."""
    ref = local_ref(pushed.stack, pushed.content_hash)
    push(engine, registry, ref, pushed.stack, pushed.content_hash, progress, tags=(pushed.stack,))
    record = load_record(build_dir, pushed.stack, pushed.content_hash)
    record.pushed[registry.repository] = pushed.digest_ref
    save_record(build_dir, record)


def abandon_push(pushed: Pushed, build_dir: Path, engine: Engine, registry: Registry) -> None:
    """A push whose evidence did not go up: the registry-named tag it put on this engine goes,
    unless an earlier, finished push of the same image named it (the registry keeps the content
    tag's manifest; without evidence beside it, `pin` from another folder refuses it)."""
    record = load_record(build_dir, pushed.stack, pushed.content_hash)
    if registry.repository in record.pushed:
        return
    with contextlib.suppress(EngineError):
        engine.untag(registry.ref(content_tag(pushed.stack, pushed.content_hash)))


def pull_stack(
    rendered: RenderedContext,
    build_dir: Path,
    engine: Engine,
    registry: Registry,
    progress: OnLayer | None = None,
    verified: tuple[str, str] | None = None,
) -> str:
    """Pull the image of the stack's current content hash and tag it as a build would
    (verified: its manifest and config digests, image/registry.py `pull`)."""
    name, content_hash = rendered.stack, rendered.content_hash()
    image = pull(engine, registry, name, content_hash, progress, verified)
    engine.tag(image.id, local_ref(name, content_hash))
    engine.tag(image.id, moving_ref(name))
    record = load_record(build_dir, name, content_hash)
    record.attach_image(image.id)
    save_record(build_dir, record)
    return local_ref(name, content_hash)


def registry_has_current(rendered: RenderedContext, engine: Engine, registry: Registry) -> bool:
    return has_image(engine, registry, rendered.stack, rendered.content_hash())
