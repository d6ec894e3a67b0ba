"""How a FROM names its base by content, and what a base's identity is.

A base pinned by digest names its content already (`repo@sha256:...`). A local base (made on
the build machine, no registry holds it) is named for the build by a tag that carries its image
ID, `REPO:TAG-id-<64 hex>`: BuildKit on the engine resolves a local image by tag, not by ID, and
a tag that spells the ID cannot come to mean another image without the tool noticing.
"""

from __future__ import annotations

import re

#: Docker's limit on a tag's length.
TAG_MAX = 128
_ID_TAG = re.compile(r"-id-([0-9a-f]{64})$")


def content_reference(reference: str, image_id: str) -> str:
    """reference's repository, tagged by its tag and image_id: `local/cuda:13.0.2-id-<hex>`."""
    repository, tag = split_reference(reference)
    hex_id = image_id.removeprefix("sha256:")
    suffix = f"-id-{hex_id}"
    return f"{repository}:{tag[: TAG_MAX - len(suffix)]}{suffix}"


def base_identity(reference: str) -> str:
    """What a base is, without its name: the digest of `repo@sha256:...`, the image ID of a
    content reference; a reference by tag alone (rendered with no engine to ask) has only its
    name. The compile cache id takes this, so the same image under another name shares it."""
    if "@sha256:" in reference:
        return "sha256:" + reference.rpartition("@sha256:")[2]
    found = _ID_TAG.search(split_reference(reference)[1])
    return f"sha256:{found.group(1)}" if found else reference


def split_reference(reference: str) -> tuple[str, str]:
    """(repository, tag) of a reference by tag; `latest` when it names none."""
    name, slash, last = reference.rpartition("/")
    if ":" in last:
        last, _, tag = last.partition(":")
    else:
        tag = "latest"
    return f"{name}{slash}{last}", tag
