"""Each base a build starts FROM, pinned to the image the engine holds under its name, once.

A tag can move (a base made again by `make base-cuda-local`, another user's run, a mirror
updated) while a build reads it. The tool used to read the tag's image ID for the label, then
let BuildKit resolve the same tag again for FROM: when the tag moved in between, the label named
one base and the layers were another's (issue 46). Now the tag is read once, here; the build's
FROM names that image by a content-addressed tag (`REPO:TAG-id-<image id>`, made by the build
just before BuildKit starts: BuildKit on the engine resolves a local image by tag only, never by
ID), the compile cache id takes the same ID, and the label records it. A base pinned by digest
already names its content and is left as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from builder.engine.protocol import Engine, Image
from builder.render.bases import content_reference

#: Label recording the image IDs the base references named at build time.
BASE_IDS_LABEL = "sm120-stacks.base-ids"
#: Label the base scripts put on what they make: the sha256 of the recipe (scripts/, bases/).
BASE_RECIPE_LABEL = "sm120-stacks.base-recipe"
#: A base tag that names its recipe (`make base-cuda-local` tags each image it makes so).
RECIPE_TAG = re.compile(r"-recipe-([0-9a-f]{12,64})$")


@dataclass(frozen=True)
class BasePin:
    """A base reference as the stack's FROM writes it, the image the engine holds under it
    now, and the content-addressed tag the build's FROM uses instead."""

    reference: str
    image: Image

    @property
    def content_ref(self) -> str:
        return content_reference(self.reference, self.image.id)

    @property
    def layers(self) -> list[str]:
        return _layers(self.image)


def base_pins(engine: Engine, bases: Mapping[str, str]) -> dict[str, BasePin]:
    """role -> pin of each base FROM names by tag that the engine holds; bases: role -> the
    reference FROM names (RenderedContext.bases). A base pinned by digest, or one the engine
    lacks (BuildKit pulls it, by digest in a lock), is left out."""
    pins: dict[str, BasePin] = {}
    seen: dict[str, Image | None] = {}
    for role, reference in bases.items():
        if "@sha256:" in reference:
            continue
        if reference not in seen:
            seen[reference] = engine.image(reference)
        image = seen[reference]
        if image is not None:
            pins[role] = BasePin(reference, image)
    return pins


def recorded_bases(pins: dict[str, BasePin]) -> dict[str, str]:
    """The label's value: reference -> image ID of each pinned base."""
    return {pin.reference: pin.image.id for pin in pins.values()}


def base_trouble(image: Image, pins: dict[str, BasePin]) -> str | None:
    """Why the image of this content hash is not the one to reuse with these bases (None: it
    is): its label names other bases than the pins, or its layers are not those of the base
    its label names (a label written from a tag that moved under the build)."""
    recorded = json.loads(image.labels.get(BASE_IDS_LABEL, "{}") or "{}")
    for pin in pins.values():
        was = recorded.get(pin.reference)
        if was != pin.image.id:
            said = _short(was) if was else "no image"
            return (
                f"its label says base {pin.reference} was {said}; the engine has "
                f"{_short(pin.image.id)} under that name now"
            )
    runtime = pins.get("runtime")
    if runtime is not None and image.id != runtime.image.id:
        base_layers = runtime.layers
        if base_layers and _layers(image)[: len(base_layers)] != base_layers:
            return (
                f"its label names base {runtime.reference} ({_short(runtime.image.id)}), but its "
                "layers do not start with that base's layers"
            )
    return None


def recipe_trouble(pins: dict[str, BasePin]) -> str | None:
    """A base whose tag names a recipe hash the image was not made by (its recipe label says
    another, or none): a tag moved by hand, or an image made by other means under that name."""
    for pin in pins.values():
        named = RECIPE_TAG.search(pin.reference.rpartition(":")[2])
        if named is None:
            continue
        made_by = pin.image.labels.get(BASE_RECIPE_LABEL, "")
        if not made_by.startswith(named.group(1)):
            return (
                f"base {pin.reference} names recipe {named.group(1)}, but its image "
                f"{_short(pin.image.id)} was made by "
                f"{'recipe ' + made_by[:16] if made_by else 'no recorded recipe'}"
            )
    return None


def _layers(image: Image) -> list[str]:
    return [str(layer) for layer in (image.attrs.get("RootFS") or {}).get("Layers") or []]


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]
