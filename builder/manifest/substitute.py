"""Base-image substitution: build any stack FROM a mirror or a local image instead.

Sites without access to the manifest's registry (air-gapped clusters, private mirrors, these
build machines) map base references once for every stack. A rule `FROM=TO` replaces an exact
reference when FROM has a tag, or a repository prefix (keeping the tag) when it has none. The
substitution is part of the resolved stack, so it changes the content hash and is recorded in
the image's labels; the manifest's pinned digest is dropped because it names the original.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from builder.engine import imageref
from builder.errors import StackError

ENV_VAR = "SM120_STACKS_BASE_SUBSTITUTE"
_REF = imageref.REFERENCE_RE


@dataclass(frozen=True)
class Substitutions:
    rules: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str], source: str = "--substitute-base") -> Substitutions:
        rules = []
        for entry in (e for raw in entries for e in re.split(r"[\s,]+", raw) if e):
            old, sep, new = entry.partition("=")
            prefix_rule = not _has_tag(old)
            if (
                not sep
                or not _REF.match(old)
                or "@" in old
                or not _REF.match(new)
                or (prefix_rule and ("@" in new or _has_tag(new)))
            ):
                raise StackError(
                    f"base substitution {entry!r} is not FROM=TO with image references",
                    key=source,
                    hint="exact: nvidia/cuda:13.0.2-devel-ubuntu24.04=local/cuda:13.0.2-devel-"
                    "bookworm; a repository (tag kept): nvidia/cuda=mirror.example/nvidia/cuda",
                )
            rules.append((old, new))
        return cls(tuple(rules))

    def apply(self, image: str) -> str | None:
        """The substitute for image, or None when no rule matches."""
        for old, new in self.rules:
            if _has_tag(old):
                if image == old:
                    return new
            elif image == old or image.startswith(old + ":"):
                return new + image[len(old) :]
        return None


def _has_tag(ref: str) -> bool:
    try:
        return imageref.parse(ref).tag is not None
    except ValueError:  # not a reference: Substitutions.parse refuses it by _REF
        return False
