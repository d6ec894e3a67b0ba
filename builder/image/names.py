"""Image names and labels: how a content hash becomes a tag and what an image says about itself.

One repository, `sm120-stacks`, holds every stack: `sm120-stacks:<stack>-<hash16>` is exact and
never moves; `sm120-stacks:<stack>` follows the newest build or push of that stack.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime

from builder import REPO_ROOT
from builder.manifest.resolve import ResolvedStack, canonical_json
from builder.render.context import MANIFEST_FILE, RenderedContext

REPOSITORY = "sm120-stacks"
HASH_CHARS = 16
SOURCE_URL = "https://github.com/sm120-stacks/sm120-stacks"


def content_tag(stack: str, content_hash: str) -> str:
    return f"{stack}-{content_hash[:HASH_CHARS]}"


def local_ref(stack: str, content_hash: str) -> str:
    return f"{REPOSITORY}:{content_tag(stack, content_hash)}"


def moving_ref(stack: str) -> str:
    return f"{REPOSITORY}:{stack}"


def created_timestamp() -> str:
    """From SOURCE_DATE_EPOCH (default 0), never the clock: labels stay reproducible."""
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0") or 0)
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def source_revision() -> str:
    try:
        result = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def image_labels(stack: ResolvedStack, rendered: RenderedContext) -> dict[str, str]:
    """OCI labels plus the stack's identity, resolved manifest and derived arch flags. The
    manifest label is the document the context carries (render's MANIFEST_FILE), read there
    rather than made again: the label and the hashed file cannot differ."""
    manifest = json.loads(rendered.files[MANIFEST_FILE][0])
    vllm = stack.manifest.python.packages.get("vllm")
    return {
        "org.opencontainers.image.title": f"sm120-stacks {stack.name}",
        "org.opencontainers.image.version": vllm.version if vllm else stack.manifest.cuda,
        "org.opencontainers.image.revision": source_revision(),
        "org.opencontainers.image.source": SOURCE_URL,
        "org.opencontainers.image.created": created_timestamp(),
        "sm120-stacks.stack": stack.name,
        "sm120-stacks.content-hash": rendered.content_hash(),
        "sm120-stacks.manifest": canonical_json(manifest),
        "sm120-stacks.arch": canonical_json(stack.arch.env),
    }
