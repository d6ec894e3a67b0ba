"""Stack-level push and pull: registry operations plus local tags and records.

registry.py knows images and tags; this module knows stacks: which content hash is current,
that a pulled image gets the same local tags a build would give it, and that every push is
recorded with its digest (what `pin` later requires).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.errors import StackError
from builder.image.build import find_image
from builder.image.names import local_ref, moving_ref
from builder.image.records import load_record, save_record
from builder.image.registry import Registry, has_image, pull, push
from builder.render.context import render
from builder.spec.resolve import ResolvedStack


@dataclass(frozen=True)
class Pushed:
    stack: str
    content_hash: str
    digest_ref: str


def current_hash(stack: ResolvedStack) -> str:
    return render(stack).content_hash()


def push_stack(
    stack: ResolvedStack, build_dir: Path, api: Any, registry: Registry, force: bool = False
) -> Pushed:
    content_hash = current_hash(stack)
    ref = local_ref(stack.name, content_hash)
    if find_image(api, ref, content_hash) is None:
        raise StackError(
            f"no local image of {stack.name} at its current content hash ({ref})",
            hint=f"build it first: sm120-stacks build {stack.name}",
        )
    record = load_record(build_dir, stack.name, content_hash)
    if record.tests != "passed" and not force:
        state = "failed" if record.tests == "failed" else "not been run"
        raise StackError(
            f"the tests of {ref} have {state}; refusing to push an untested image",
            hint=f"run `sm120-stacks test {stack.name}`, or pass --force to push anyway",
        )
    digest_ref = push(api, registry, ref, stack.name, content_hash)
    record.pushed[registry.repository] = digest_ref
    save_record(build_dir, record)
    return Pushed(stack.name, content_hash, digest_ref)


def pull_stack(stack: ResolvedStack, build_dir: Path, api: Any, registry: Registry) -> str:
    """Pull the image of the stack's current content hash and tag it as a build would."""
    content_hash = current_hash(stack)
    image = pull(api, registry, stack.name, content_hash)
    image.tag(local_ref(stack.name, content_hash))
    image.tag(moving_ref(stack.name))
    record = load_record(build_dir, stack.name, content_hash)
    record.attach_image(image.id)
    save_record(build_dir, record)
    return local_ref(stack.name, content_hash)


def registry_has_current(stack: ResolvedStack, api: Any, registry: Registry) -> bool:
    return has_image(api, registry, stack.name, current_hash(stack))
