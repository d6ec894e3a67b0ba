"""The one mount syntax of the command line: SOURCE:TARGET[:ro|:rw], as `docker run -v` writes it.

`pin --volume` and `test --volume` (and `test --mount`, its spelling of one release ago) read
mounts through `parse_mount`, so one command cannot accept what the other refuses. SOURCE is a
host path (absolute, or starting with `.`, made absolute here) or a named volume; TARGET a
path inside the container. Each command then says what it allows: `test` binds host folders
only, `pin` keeps named volumes too.

A mount is the engine's `Mount` (builder/engine/protocol.py), the one mount type, whose `kind`
is the one bind rule; `checked` is the one shape check, here and for a pin's volumes.
"""

from __future__ import annotations

import re
from pathlib import Path

from builder.engine.protocol import Mount
from builder.errors import StackError

SYNTAX = "SOURCE:TARGET[:ro]"
#: The host's model folder, mounted read-only at MODELS_TARGET: by `pin` (its default volume,
#: or --models DIR) and by `test`'s smoke (--models DIR), so that a model the smoke found is
#: where the pinned server looks for it.
DEFAULT_MODELS = "/var/lib/sm120-stacks/models"
MODELS_TARGET = "/models"
_PATH = re.compile(r"^/[A-Za-z0-9_./+-]*$")
_VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: The longest path a pin holds (a YAML line a person can still read).
MAX_PATH = 1000


def checked(mount: Mount) -> Mount:
    """mount, if its source is an absolute path or a volume name and its target an absolute
    path (each at most MAX_PATH long); a ValueError saying what is wrong otherwise."""
    if len(mount.source) > MAX_PATH or len(mount.target) > MAX_PATH:
        raise ValueError(f"a mount path is longer than {MAX_PATH} characters")
    if not (_PATH.match(mount.source) or _VOLUME_NAME.match(mount.source)):
        raise ValueError(f"source {mount.source!r} is neither an absolute path nor a volume name")
    if not _PATH.match(mount.target):
        raise ValueError(f"target {mount.target!r} is not an absolute path")
    return mount


def parse_mount(text: str, option: str = "--volume") -> Mount:
    """One SOURCE:TARGET[:ro|:rw]; a StackError naming the option and the syntax otherwise."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise StackError(f"{option} {text!r}: write {SYNTAX}", key=option)
    source, target = parts[0], parts[1]
    if source.startswith((".", "/")):
        source = str(Path(source).absolute())
    try:
        return checked(Mount(source, target, read_only=parts[2:] == ["ro"]))
    except ValueError as exc:
        raise StackError(
            f"{option} {text!r}: SOURCE is an absolute path or a volume name, TARGET a path "
            f"({exc})",
            key=option,
        ) from None


def models_mount(folder: str | Path, option: str = "--models") -> Mount:
    """--models DIR: the mount it stands for, DIR:/models:ro, read as any other."""
    return parse_mount(f"{Path(folder).absolute()}:{MODELS_TARGET}:ro", option)
