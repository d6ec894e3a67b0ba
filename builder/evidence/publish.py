"""Push with evidence: the one way an image becomes "pushed".

The order is what makes a stop anywhere safe (issue 32): the image goes up under its content
tag; its evidence goes beside it; only then the moving stack tag and the record that `pin`
reads. A push whose evidence fails leaves no record and no moving tag, so no folder pins an
image whose registry holds no verdict, SBOM or provenance, and says what to run.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from builder.engine.protocol import Engine, OnLayer
from builder.errors import OperationFailed, StackError
from builder.evidence.attach import attach_evidence
from builder.evidence.keys import SigningKey
from builder.evidence.oci import Descriptor
from builder.image.distribute import Pushed, abandon_push, finish_push, push_stack
from builder.image.records import load_record
from builder.image.registry import Registry
from builder.manifest.resolve import ResolvedStack
from builder.render.context import RenderedContext


@dataclass(frozen=True)
class Published:
    digest_ref: str
    artifacts: list[Descriptor]


def publish(
    engine: Engine,
    registry: Registry,
    stack: ResolvedStack,
    rendered: RenderedContext,
    build_dir: Path,
    build_client: str,
    force: bool = False,
    progress: OnLayer | None = None,
    signer: SigningKey | None = None,
    again_options: tuple[str, ...] = (),
) -> Published:
    """The image and every evidence document in the registry (signed by signer, the build
    key, where given), then recorded as pushed. again_options: the user's own options besides
    --registry (`--signing-key FILE`, `--engine ADDR`), repeated in the push again a failed
    evidence step's hint offers, so that push signs and goes where the first one did."""
    pushed = push_stack(rendered, build_dir, engine, registry, force=force, progress=progress)
    record = load_record(build_dir, pushed.stack, pushed.content_hash)
    try:
        artifacts = attach_evidence(
            engine, registry, stack, rendered, record, pushed.digest_ref, build_client, signer
        )
    except (StackError, OperationFailed) as exc:
        abandon_push(pushed, build_dir, engine, registry)
        raise _evidence_failed(exc, pushed, registry, again_options) from None
    finish_push(pushed, build_dir, engine, registry, progress)
    return Published(pushed.digest_ref, artifacts)


def _evidence_failed(
    exc: StackError | OperationFailed,
    pushed: Pushed,
    registry: Registry,
    again_options: tuple[str, ...] = (),
) -> Exception:
    """The evidence step's own error, and what was (not) done: the same class, so its exit
    status stays (2 for what the user fixes: a login, a CA; 1 for a registry's refusal)."""
    done = (
        f"the image went up as {pushed.digest_ref}, its evidence did not: it is not recorded "
        f"as pushed and {registry.ref(pushed.stack)} was not moved"
    )
    command = shlex.join(
        ["sm120-stacks", "push", pushed.stack, "--registry", registry.option, *again_options]
    )
    again = f"`{command}` again (it sends only what is missing)"
    if isinstance(exc, StackError):
        return type(exc)(
            f"{exc.message}\n  {done}",
            file=exc.file,
            key=exc.key,
            line=exc.line,
            hint=f"{exc.hint or 'fix that'}; then {again}",
        )
    return OperationFailed(f"{exc}\n  {done}; fix that, then {again}")


__all__ = ["Published", "publish"]
