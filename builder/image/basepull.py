"""A build that failed because a base image cannot be pulled here, told as that.

BuildKit resolves every FROM image in its registry before it runs a single step; on a machine
that cannot reach the registry (no DNS, no route, a proxy) or is refused by it, the build
stops with a raw resolver line ("no such host", "failed to resolve source metadata for
docker.io/nvidia/cuda:..."). The person reading it needs the remedies this tool has for
exactly that case: substituting a mirror or a local base, or making the local CUDA base.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.engine import imageref
from builder.errors import ToolMissing
from builder.manifest.substitute import ENV_VAR as SUBSTITUTE_ENV

#: The step in which BuildKit resolves a FROM image: "[internal] load metadata for IMAGE".
METADATA_STEP = re.compile(r"^\[internal\] load metadata for (\S+)$")
#: Newer BuildKit's summary of the same failure, on the client's last line.
METADATA_FAILURE = re.compile(r"failed to resolve source metadata for (\S+): ")
#: Docker Hub, as BuildKit spells its references in full.
HUB_PREFIXES = ("docker.io/library/", "docker.io/")


class BaseImageUnavailable(ToolMissing):
    """A base image of the stack cannot be pulled on this machine."""


@dataclass(frozen=True)
class UnpullableBase:
    #: The image as BuildKit names it (docker.io/... in full).
    image: str
    #: BuildKit's own line saying why.
    line: str


def unpullable_base(
    failed_step: tuple[str, str] | None, log_lines: Iterable[str]
) -> UnpullableBase | None:
    """The base image a failed build could not resolve, from its failed step (title, error)
    or, where BuildKit reported no step, its summary line; None for any other failure."""
    if failed_step is not None and (match := METADATA_STEP.match(failed_step[0])):
        return UnpullableBase(match.group(1), failed_step[1].strip())
    for line in log_lines:
        if match := METADATA_FAILURE.search(line):
            return UnpullableBase(match.group(1), line.strip())
    return None


def base_unavailable_error(
    stack: str, found: UnpullableBase, written: Sequence[str], log_path: Path
) -> BaseImageUnavailable:
    """The error for `found`, naming the base as the manifest writes it (what a substitution
    must match) and every way around it; BuildKit's line stays in it as the cause."""
    image = as_written(found.image, written)
    return BaseImageUnavailable(
        f"the base image {image} of {stack} cannot be pulled on this machine\n"
        f"  BuildKit: {found.line}\n  log: {log_path}",
        hint=f"build FROM a mirror or a local image instead: --substitute-base {image}=OTHER "
        f"(or {SUBSTITUTE_ENV}={image}=OTHER); without any registry, make the local CUDA base "
        f"with `make base-cuda-local` and build on it with `make flagship-local STACK={stack}`",
    )


def as_written(seen: str, written: Sequence[str]) -> str:
    """The reference among `written` that BuildKit's `seen` stands for, else `seen` shortened
    the same way (BuildKit adds docker.io/, library/, :latest and the lock's @digest)."""
    wanted = _canonical(seen)
    for ref in written:
        if _canonical(ref) == wanted:
            return ref
    name = seen.split("@", 1)[0]
    for prefix in HUB_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _canonical(ref: str) -> str:
    """ref as BuildKit spells it: docker.io/ (and library/) before a Docker Hub name, :latest
    for no tag, the digest left off; the host rule is imageref's."""
    try:
        parsed = imageref.parse(ref)
    except ValueError:  # no reference by the grammar: compared as it stands
        return ref
    name = parsed.repository if parsed.host is not None else f"docker.io/{parsed.repository}"
    if name.count("/") == 1 and name.startswith("docker.io/"):
        name = "docker.io/library/" + name[len("docker.io/") :]
    return f"{name}:{parsed.tag or 'latest'}"
