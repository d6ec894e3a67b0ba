"""What `build` decides: pull or build, whether the client can do what was asked, where the
layer cache comes from, and the up-to-date memo of what came out.

The command line hands down the locked stack and its rendered context (both made once) with a
BuildRequest, and prints the Made it gets back. Pulling with the image's evidence is a later
step's job (evidence/pull.py, above this one): this module only says that the registry has the
image (Made.pull_from), and the command line pulls it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from builder.engine.protocol import Engine
from builder.errors import StackError
from builder.image import uptodate
from builder.image.build import BuildOptions, BuildOutcome, build_stack
from builder.image.buildcache import CacheSettings, registry_cache
from builder.image.buildclient import client_memo, detect_build_client
from builder.image.distribute import registry_has_current
from builder.image.names import moving_ref
from builder.image.registry import Registry
from builder.lock.locked import LockedStack
from builder.render.context import RenderedContext


@dataclass(frozen=True)
class BuildRequest:
    """build's options, parsed: what the command line was asked for."""

    options: BuildOptions = field(default_factory=BuildOptions)
    #: --pull-or-build's registry: pull the image of this content hash when it holds it.
    pull_from: Registry | None = None
    #: --cache-from-registry: reuse the layers of this stack's images there.
    cache_from: Registry | None = None
    #: --cache-to-registry: also export every stage's layers there (buildx only).
    cache_export: bool = False

    def __post_init__(self) -> None:
        """Options that cannot work together are refused before any engine is asked."""
        if self.cache_export and self.cache_from is None and self.pull_from is None:
            raise StackError(
                "--cache-to-registry needs a registry",
                key="--cache-to-registry",
                hint="give --cache-from-registry HOST[:PORT][/NAMESPACE]",
            )


@dataclass(frozen=True)
class Made:
    """What `make_image` did: built or found the image (`outcome`), or found that the registry
    asked has it (`pull_from`, outcome None): the caller pulls it with its evidence there
    (evidence/pull.py, a step above this one, so image/ does not call back up to it)."""

    outcome: BuildOutcome | None = None
    pull_from: Registry | None = None
    #: Where the build's layer cache came from (none: the local cache only).
    cache_sources: tuple[str, ...] = ()


def inputs_taken(stacks_dir: Path) -> str:
    """The input files' fingerprint before the command resolves anything: an input that moves
    while it builds keeps the up-to-date memo from being written (uptodate.remember)."""
    return uptodate.fingerprint(stacks_dir, [])


def make_image(
    locked: LockedStack,
    rendered: RenderedContext,
    request: BuildRequest,
    engine: Engine,
    folders: tuple[Path, Path],
    taken: str,
    say: Callable[[str], object] = lambda line: None,
) -> Made:
    """Reuse or build the image of rendered and remember the outcome for the up-to-date check,
    or, with --pull-or-build, say that the registry has it (Made.pull_from: the caller pulls).
    folders: (build folder, stacks folder); taken: the inputs' fingerprint from before the
    command resolved anything (inputs_taken); say: where a line goes before a long build starts
    (the registry asked had no such image)."""
    build_dir, stacks_dir = folders
    if request.pull_from is not None and registry_has_current(rendered, engine, request.pull_from):
        return Made(pull_from=request.pull_from)
    if request.pull_from is not None:
        say(f"{request.pull_from.repository} has no image of this content hash; building")
    client = functools.cache(lambda: detect_build_client(memo=client_memo(build_dir)))
    if request.cache_export and client().kind != "buildx":
        raise StackError(
            f"--cache-to-registry needs buildx; this machine builds with {client().describe()}",
            key="--cache-to-registry",
            hint="install the buildx plugin and `docker buildx create --use`, or leave the option "
            "off: the inline cache in every pushed image still seeds other machines' builds",
        )
    source = request.cache_from or request.pull_from
    cache = CacheSettings()
    if source is not None:
        cache = registry_cache(
            locked.stack, rendered.content_hash(), source, export=request.cache_export
        )
    options = replace(request.options, cache=cache)
    outcome = build_stack(locked.stack, rendered, build_dir, client, engine, options)
    wheels = {str(c.source): c.fingerprint for c in rendered.copied.values()}
    built = (outcome.content_hash, outcome.image_ref, outcome.image_id)
    uptodate.remember(
        build_dir, stacks_dir, locked.name, wheels, *built, moving_ref(locked.name), taken
    )
    return Made(outcome=outcome, cache_sources=cache.sources)
