"""The constrained strings every file schema shares (manifests, knowledge, locks, records,
pins): each string that can reach a Dockerfile line or a shell is held to a pattern here, so
rendering never has to guess whether a value is safe."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import StringConstraints

from builder.engine import imageref

# --- constrained strings -----------------------------------------------------------------------

#: Text without control characters or the characters a shell or Dockerfile would interpret.
SAFE_TEXT = r"^[^\x00-\x1f\x7f`$\\;&|<>\"']*$"
SafeText = Annotated[str, StringConstraints(pattern=SAFE_TEXT, max_length=2000)]
#: Free prose (notes): any single- or multi-line text; it only ever reaches JSON labels.
Prose = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x08\x0b-\x1f\x7f]*$", max_length=4000)]
Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=128)]
Identifier = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]
PackageName = Annotated[
    str, StringConstraints(pattern=r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")
]
ImageRef = Annotated[str, StringConstraints(pattern=imageref.TAGGED)]
OverrideTemplate = Annotated[
    str, StringConstraints(pattern=r"^overrides/[A-Za-z0-9_][A-Za-z0-9_.-]*\.j2$")
]
Digest = Annotated[str, StringConstraints(pattern=imageref.DIGEST_ONLY)]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Url = Annotated[str, StringConstraints(pattern=r"^https?://[A-Za-z0-9._~:/?#\[\]@!%+,=-]+$")]
#: A single argument of the serve command; rendered in exec (JSON) form, never through a shell.
ServeArg = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]+$", max_length=2000)]
ModelId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./-]+$", max_length=300)]
RelPath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./-]+$", max_length=300)]
WheelPath = Annotated[
    str, StringConstraints(pattern=r"^/?([A-Za-z0-9_+-][A-Za-z0-9_.+-]*/)*[A-Za-z0-9_.+-]+\.whl$")
]
#: FlashInfer spells attention modules by every template parameter (172 characters for a
#: paged prefill); a directory name allows 255.
ModuleName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]+$", max_length=255)]
#: The GPU targets a stack can name (knowledge/arch.yaml spells each for every consumer).
GpuName = Literal["sm90", "sm120", "sm121"]
#: vLLM's --kv-cache-dtype choices this project knows (its CacheDType); the one definition the
#: manifest and the attention routes (knowledge/attention_routes.yaml) share.
KvCacheDtype = Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
