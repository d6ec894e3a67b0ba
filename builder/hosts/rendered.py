"""The host's rendered files held to its pin: what `drift` reads besides the engine.

`deploy` writes compose.yaml and the systemd unit from the pin (hosts/deploy.py), and the unit
is installed under /etc/systemd/system. Both are plain text a person can edit, and an edit that
swaps the pinned `repo@sha256` for a tag (or for another digest) is not seen in what runs
until the next start, when Compose or the unit runs whatever the tag then names. So `drift`
reads the files too and reports, with the file and line, an image that is not the pin's and a
named volume that is not the pin's at its path. A file that is absent is not a drift: a host
deployed with `deploy --apply` alone runs no unit or Compose.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.engine import address
from builder.errors import StackError
from builder.hosts.container import volumes
from builder.hosts.deploy import unit_name
from builder.hosts.drift import Drift
from builder.hosts.pins import Pin
from builder.knowledge.yamlsafe import YamlDocument, load_yaml

COMPOSE_FILE = "compose.yaml"
#: Where the unit's install comment puts it (templates/deploy/unit.service.j2).
SYSTEMD_DIR = Path("/etc/systemd/system")
#: `docker run` options that take a value as the next word (the rest are flags or KEY=VALUE).
_RUN_VALUE_OPTIONS = frozenset(
    "-e --env --env-file -l --label --mount -v --volume -p --publish --name --pull --gpus "
    "--shm-size -u --user --health-cmd --network --entrypoint -w --workdir --restart --runtime "
    "--device --ipc --ulimit --cpus -m --memory -h --hostname --add-host --log-driver "
    "--log-opt --cap-add --cap-drop --security-opt --tmpfs --platform".split()
)
_PULL = re.compile(r"\bdocker\s+pull\s+(?P<image>[^\s\"']+)")


@dataclass(frozen=True)
class Found:
    """One image or named volume a file names, and where."""

    line: int
    key: str
    value: str
    #: For a volume: the container path it is mounted at.
    target: str = ""


def rendered_files(
    pin: Pin, render_dir: Path, default_engine: str | None, unit_dir: Path = SYSTEMD_DIR
) -> list[Path]:
    """The pin's rendered files that exist: compose.yaml and the unit where deploy wrote them,
    and the installed unit when the pin's engine is this machine's (a remote host's unit is on
    that host)."""
    places = [render_dir / COMPOSE_FILE, render_dir / unit_name(pin)]
    if address.is_local(pin.engine or default_engine or address.from_environment()):
        places.append(unit_dir / unit_name(pin))
    return [path for path in places if path.is_file()]


def file_drifts(pin: Pin, paths: list[Path]) -> list[Drift]:
    """One `file` drift per image or named volume in the files that is not the pin's."""
    drifts: list[Drift] = []
    for path in paths:
        if path.name == COMPOSE_FILE:
            try:
                images, mounts = _compose_names(load_yaml(path))
            except StackError as exc:
                drifts.append(Drift("file", f"{path}: cannot be read ({exc.message}){_again(pin)}"))
                continue
        else:
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                drifts.append(Drift("file", f"{path}: cannot be read ({exc.strerror})"))
                continue
            images, mounts = _unit_names(text)
        drifts += [_image_drift(pin, path, found) for found in images if found.value != pin.image]
        drifts += _volume_drifts(pin, path, mounts)
    return drifts


def _again(pin: Pin) -> str:
    return f"; render it again with `sm120-stacks deploy {pin.host}` (edit the pin, not this file)"


def _image_drift(pin: Pin, path: Path, found: Found) -> Drift:
    what = "another digest" if "@sha256:" in found.value else "a tag, not a digest"
    return Drift(
        "file",
        f"{path}:{found.line}: {found.key} is {found.value} ({what}), pinned {pin.image}: the "
        "next start runs whatever that names" + _again(pin),
    )


def _volume_drifts(pin: Pin, path: Path, mounts: list[Found]) -> list[Drift]:
    pinned = {m.target: m.source for m in volumes(pin) if not m.bind}
    drifts = []
    for found in mounts:
        want = pinned.get(found.target)
        if want is not None and found.value != want:
            drifts.append(
                Drift(
                    "file",
                    f"{path}:{found.line}: {found.key} mounts volume {found.value} at "
                    f"{found.target}, pinned {want}: the server would start on another "
                    "volume's caches" + _again(pin),
                )
            )
    return drifts


# --- compose.yaml ------------------------------------------------------------------------------


def _compose_names(doc: YamlDocument) -> tuple[list[Found], list[Found]]:
    """Each service's image and named-volume mounts (the volume's real name: its top-level
    `name:`, else its key)."""
    services = doc.data.get("services")
    declared = doc.data.get("volumes") if isinstance(doc.data.get("volumes"), dict) else {}
    images: list[Found] = []
    mounts: list[Found] = []
    for service, body in (services or {}).items() if isinstance(services, dict) else ():
        if not isinstance(body, dict):
            continue
        where = ("services", service, "image")
        line = doc.line_of(where) or 1
        images.append(Found(line, ".".join(where), str(body.get("image", "(none)"))))
        for index, entry in enumerate(body.get("volumes") or []):
            source, target = _compose_mount(entry)
            if source is None or source.startswith(("/", ".", "~")):
                continue  # a bind mount, not a named volume
            entry_of = declared.get(source) if isinstance(declared, dict) else None
            name = str(entry_of.get("name", source)) if isinstance(entry_of, dict) else source
            key = ("services", service, "volumes", index)
            mounts.append(Found(doc.line_of(key) or 1, _dotted(key), name, target))
    return images, mounts


def _compose_mount(entry: Any) -> tuple[str | None, str]:
    """(source, target) of a service volume in its long or short syntax."""
    if isinstance(entry, dict):
        if entry.get("type", "volume") != "volume":
            return None, ""
        return str(entry.get("source") or "") or None, str(entry.get("target") or "")
    parts = str(entry).split(":")
    return (parts[0], parts[1]) if len(parts) >= 2 else (None, parts[0])


def _dotted(key: tuple[str | int, ...]) -> str:
    return ".".join(str(part) for part in key)


# --- the systemd unit --------------------------------------------------------------------------


def _unit_names(text: str) -> tuple[list[Found], list[Found]]:
    """The image ExecStart's `docker run` starts and every `docker pull` of a pre-start line;
    ExecStart's named-volume mounts."""
    images: list[Found] = []
    mounts: list[Found] = []
    for start, key, value, block in _exec_lines(text):
        if key == "ExecStartPre":
            images += [
                Found(_line_of(m.group(0), start, block), key, m.group("image"))
                for m in _PULL.finditer(value)
            ]
            continue
        try:
            words = shlex.split(value.replace("$$", "$").replace("%%", "%"))
        except ValueError:
            continue  # unbalanced quotes: systemd itself refuses the line
        if "run" not in words:
            continue
        image, found = _run_image_and_mounts(words[words.index("run") + 1 :])
        if image is not None:
            line = _line_of(image, start, block)
            images.append(Found(line, f"{key} (docker run's image)", image))
        mounts += [
            Found(_line_of(name, start, block), f"{key} ({flag})", name, target)
            for flag, name, target in found
        ]
    return images, mounts


def _exec_lines(text: str) -> Iterator[tuple[int, str, str, list[str]]]:
    """(line, key, value, physical lines) of each ExecStartPre/ExecStart, continuation lines
    joined, the value's `-`/`@`/`+` prefixes dropped and `sh -c '...'` words left as written."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        start = index
        joined = lines[index]
        while joined.endswith("\\") and index + 1 < len(lines):
            index += 1
            joined = joined[:-1] + " " + lines[index]
        index += 1
        key, sep, value = joined.partition("=")
        if sep and key.strip() in ("ExecStartPre", "ExecStart"):
            yield start + 1, key.strip(), value.strip().lstrip("-@+!:"), lines[start:index]


def _line_of(word: str, start: int, block: list[str]) -> int:
    """The line of the block (starting at `start`) where word is written; else its first."""
    return start + next((i for i, text in enumerate(block) if word in text), 0)


def _run_image_and_mounts(
    args: list[str],
) -> tuple[str | None, list[tuple[str, str, str]]]:
    """`docker run`'s image (its first word that is not an option) and its named-volume
    mounts as (option, volume, target)."""
    mounts: list[tuple[str, str, str]] = []
    index = 0
    while index < len(args):
        word = args[index]
        if not word.startswith("-"):
            return word, mounts
        option, eq, inline = word.partition("=")
        value = inline if eq else (args[index + 1] if index + 1 < len(args) else "")
        if option in _RUN_VALUE_OPTIONS and not eq:
            index += 1
        index += 1
        mount = _run_mount(option, value)
        if mount is not None:
            mounts.append((option, *mount))
    return None, mounts


def _run_mount(option: str, value: str) -> tuple[str, str] | None:
    """(volume, target) of a --mount type=volume or a -v NAME:TARGET; None for anything else."""
    if option == "--mount":
        fields = dict(part.partition("=")[::2] for part in value.split(","))
        source = fields.get("source") or fields.get("src")
        target = fields.get("target") or fields.get("dst") or fields.get("destination")
        if fields.get("type", "volume") == "volume" and source and target:
            return source, target
    if option in ("-v", "--volume"):
        parts = value.split(":")
        if len(parts) >= 2 and not parts[0].startswith("/"):
            return parts[0], parts[1]
    return None
