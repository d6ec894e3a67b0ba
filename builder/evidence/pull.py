"""Pull an image with its evidence: the one way `pull` and `build --pull-or-build` take an image
from a registry.

The evidence is read (and checked, evidence/reader.py, under the hosts folder's policy or
trusted on first use, evidence/decision.py) before the image is pulled, so an image whose
evidence cannot be relied on is not pulled at all. The engine then pulls REPO@<the digest
whose evidence was verified>, never the tag, and the pulled image's id must be the config that
manifest names: a tag moved between the check and the pull changes nothing. Its verdicts are
then merged into the record of this build folder (image/verdicts.py `merge`), so `pin` relies
on them here as it would in the folder that tested the image.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from builder.engine.protocol import Engine, OnLayer
from builder.errors import StackError
from builder.evidence.decision import relied_evidence
from builder.evidence.oci import ArtifactStore
from builder.evidence.reader import Evidence
from builder.image.distribute import pull_stack
from builder.image.records import load_record, save_record
from builder.image.registry import Registry
from builder.render.context import RenderedContext


@dataclass(frozen=True)
class Pulled:
    #: The local reference the image is tagged with, as a build would tag it.
    ref: str
    evidence: Evidence
    #: What the trust decision said (a key trusted on first use).
    said: list[str] = field(default_factory=list)


def pull_with_evidence(
    rendered: RenderedContext,
    build_dir: Path,
    engine: Engine,
    registry: Registry,
    progress: OnLayer | None = None,
    hosts_dir: Path | None = None,
    allow_unsigned: bool = False,
) -> Pulled:
    """The image of the stack's current content hash, pulled by the digest its verified
    evidence names and tagged, with its verdicts recorded here and the push it came from.
    hosts_dir: the folder whose trust.yaml decides (written on first use)."""
    stack, content_hash = rendered.stack, rendered.content_hash()
    store = ArtifactStore(registry)
    relied = relied_evidence(
        hosts_dir or build_dir / "hosts",
        registry,
        stack,
        content_hash,
        allow_unsigned=allow_unsigned,
        store=store,
        tool="pull",
    )
    evidence = relied.evidence
    config = _config_digest(store, evidence.digest)
    ref = pull_stack(rendered, build_dir, engine, registry, progress, (evidence.digest, config))
    record = load_record(build_dir, stack, content_hash)  # pull_stack attached the image
    record.take(evidence.record())
    record.pushed[registry.repository] = evidence.ref
    save_record(build_dir, record)
    return Pulled(ref, evidence, relied.said)


def _config_digest(store: ArtifactStore, digest: str) -> str:
    """The config digest (the engine's image id) the verified manifest names, read by digest
    (the store checks the manifest hashes to it)."""
    manifest = store.manifest(store.image(digest))
    config = (manifest.get("config") or {}).get("digest")
    if not isinstance(config, str) or not config.startswith("sha256:"):
        raise StackError(
            f"the manifest of {store.registry.repository}@{digest} names no config digest "
            "(an image index?): it cannot be pulled by what was verified",
            hint="push a single-platform image (`sm120-stacks push STACK`)",
        )
    return config


__all__ = ["Pulled", "pull_with_evidence"]
