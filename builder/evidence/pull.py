"""Pull an image with its evidence: the one way `pull` and `build --pull-or-build` take an image
from a registry.

The evidence is read (and checked, evidence/reader.py) before the image is pulled, so an image
whose evidence cannot be relied on is not pulled at all; its verdicts are then merged into the
record of this build folder (image/verdicts.py `merge`), so `pin` relies on them here as it
would in the folder that tested the image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.engine.protocol import Engine, OnLayer
from builder.evidence.reader import Evidence, read_evidence
from builder.evidence.trust import TrustPolicy
from builder.image.distribute import pull_stack
from builder.image.records import load_record, save_record
from builder.image.registry import Registry
from builder.render.context import RenderedContext


@dataclass(frozen=True)
class Pulled:
    #: The local reference the image is tagged with, as a build would tag it.
    ref: str
    evidence: Evidence


def pull_with_evidence(
    rendered: RenderedContext,
    build_dir: Path,
    engine: Engine,
    registry: Registry,
    progress: OnLayer | None = None,
    trust: TrustPolicy | None = None,
    allow_unsigned: bool = False,
) -> Pulled:
    """The image of the stack's current content hash, pulled and tagged, with its verdicts
    recorded here and the push it came from."""
    stack, content_hash = rendered.stack, rendered.content_hash()
    evidence = read_evidence(
        registry, stack, content_hash, trust=trust, allow_unsigned=allow_unsigned
    )
    ref = pull_stack(rendered, build_dir, engine, registry, progress)
    record = load_record(build_dir, stack, content_hash)  # pull_stack attached the image
    record.take(evidence.record())
    record.pushed[registry.repository] = evidence.ref
    save_record(build_dir, record)
    return Pulled(ref, evidence)


__all__ = ["Pulled", "pull_with_evidence"]
