"""A build cache shared through the registry: a fresh machine reuses what another one pushed.

Every build embeds BuildKit's inline cache metadata in its image (`BUILDKIT_INLINE_CACHE=1` on
the classic client, `--cache-to type=inline` with buildx): a pushed image then says which build
steps made its layers. A build given a cache registry imports that metadata from the stack's
images there (`--cache-from`): its content tag, its moving tag, and the moving tags of the
stacks it extends (a variant with another serve argument has no image of its own yet, but its
parent does). A step whose cache key matches is not run: its layer is pulled instead.

That is what makes a FlashInfer precompile reusable across machines. The compile runs in a
cache mount, which lives on one machine only; the same step copies the finished modules into
its own layer, so the step, once cached, brings its output with it.

Inline cache records only the layers of the final image (BuildKit's mode=min). With buildx a
registry cache can hold every stage's layers as well (`--cache-to type=registry,...,mode=max`,
a separate cache image beside the stack's images): it needs a buildx builder that can export
cache (`docker buildx create --use`, the docker-container driver); the plain docker driver
refuses it. The classic client cannot export one at all.

A cache source the registry does not have (yet), or a registry that does not answer, is not an
error: BuildKit logs it and builds what it must.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.image.names import content_tag
from builder.image.registry import Registry
from builder.manifest.resolve import ResolvedStack

#: The build argument the classic client reads to embed inline cache metadata.
INLINE_CACHE_ARG = "BUILDKIT_INLINE_CACHE=1"
#: The tag of a stack's registry (mode=max) cache image, beside its own images.
CACHE_TAG_PREFIX = "buildcache-"


@dataclass(frozen=True)
class CacheSettings:
    """How a build takes part in the shared cache."""

    #: Embed inline cache metadata in the image (so a pushed image can seed other builds).
    inline: bool = True
    #: Image references to import cache from, most specific first.
    sources: tuple[str, ...] = ()
    #: A registry cache image to export every stage to (buildx only), or None.
    export: str | None = None


def stack_chain(stack: ResolvedStack) -> list[str]:
    """The stack's name, then each stack it extends, nearest first."""
    return [path.stem for path in stack.sources]


def registry_cache(
    stack: ResolvedStack, content_hash: str, registry: Registry, *, export: bool = False
) -> CacheSettings:
    """Cache sources for a build of stack in registry (see the module's docstring); with
    export, the registry cache image it also writes (buildx)."""
    chain = stack_chain(stack)
    sources = [registry.ref(content_tag(stack.name, content_hash))]
    sources += [registry.ref(name) for name in chain]
    cache_image = registry.ref(CACHE_TAG_PREFIX + stack.name)
    if export:
        # What earlier exports of this stack, and of its parents, left behind.
        sources += [registry.ref(CACHE_TAG_PREFIX + name) for name in chain]
    return CacheSettings(
        inline=True,
        sources=tuple(dict.fromkeys(sources)),
        export=cache_image if export else None,
    )


def cache_argv(settings: CacheSettings, client_kind: str) -> list[str]:
    """The build options for settings, in the spelling of the client (`buildx` or classic)."""
    argv: list[str] = []
    buildx = client_kind == "buildx"
    if settings.inline and not buildx:
        argv += ["--build-arg", INLINE_CACHE_ARG]
    if buildx:
        if settings.inline:
            argv += ["--cache-to", "type=inline"]
        if settings.export is not None:
            argv += ["--cache-to", f"type=registry,ref={settings.export},mode=max"]
    elif settings.export is not None:
        raise ValueError("a registry cache export needs buildx")
    for ref in settings.sources:
        argv += ["--cache-from", f"type=registry,ref={ref}" if buildx else ref]
    return argv
