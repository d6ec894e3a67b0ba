"""The one mount syntax of the command line: SOURCE:TARGET[:ro|:rw], as `docker run -v` writes it.

`pin --volume` and `test --volume` (and `test --mount`, its spelling of one release ago) read
mounts through `parse_mount`, so one command cannot accept what the other refuses. SOURCE is a
host path (absolute, or starting with `.`, made absolute here) or a named volume; TARGET a
path inside the container. Each command then says what it allows: `test` binds host folders
only, `pin` keeps named volumes too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from builder.errors import StackError

SYNTAX = "SOURCE:TARGET[:ro]"
#: The host's model folder, mounted read-only at MODELS_TARGET: by `pin` (its default volume,
#: or --models DIR) and by `test`'s smoke (--models DIR), so that a model the smoke found is
#: where the pinned server looks for it.
DEFAULT_MODELS = "/var/lib/sm120-stacks/models"
MODELS_TARGET = "/models"
_PATH = re.compile(r"^/[A-Za-z0-9_./+-]*$")
_VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class MountSpec:
    #: An absolute host path (a bind mount) or a named volume.
    source: str
    target: str
    read_only: bool = False

    @property
    def bind(self) -> bool:
        return self.source.startswith("/")


def parse_mount(text: str, option: str = "--volume") -> MountSpec:
    """One SOURCE:TARGET[:ro|:rw]; a StackError naming the option and the syntax otherwise."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise StackError(f"{option} {text!r}: write {SYNTAX}", key=option)
    source, target = parts[0], parts[1]
    if source.startswith((".", "/")):
        source = str(Path(source).absolute())
    if not (_PATH.match(source) or _VOLUME_NAME.match(source)) or not _PATH.match(target):
        raise StackError(
            f"{option} {text!r}: SOURCE is an absolute path or a volume name, TARGET a path",
            key=option,
        )
    return MountSpec(source, target, read_only=parts[2:] == ["ro"])


def models_mount(folder: str | Path, option: str = "--models") -> MountSpec:
    """--models DIR: the mount it stands for, DIR:/models:ro, read as any other."""
    return parse_mount(f"{Path(folder).absolute()}:{MODELS_TARGET}:ro", option)
