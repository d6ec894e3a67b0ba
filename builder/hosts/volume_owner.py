"""A pin's cache volume is its own: checked before deploy writes or starts anything.

The volume the server compiles into (the pin's named volume at the cache path) is shared by the
pin's systemd unit, its compose file and `deploy --apply`, and by nothing else: two servers in
one volume write one live/ folder, and a restore swaps it under the other (issue 34; shown by
bench/results/faults/leftovers/two-pins-with-one-shared-volume.txt). A pin edited by hand (or
copied from another host's) can name a volume that is not its own. `deploy` refuses it, exit 2,
naming the pin file, key and line, before any file is rendered or any container touched.
"""

from __future__ import annotations

import re
from pathlib import Path

from builder.errors import StackError
from builder.hosts import remote
from builder.hosts.pins import (
    CACHE_TARGET,
    Pin,
    cache_volume_name,
    load_pin,
    pin_path,
    pinned_hosts,
)
from builder.knowledge.yamlsafe import load_yaml

#: The shape of a name `pin` gives a cache volume (pin_making.cache_volume_name): one made for
#: a stack and host; a name of this shape made for another pair is another pin's volume.
_MADE_FOR_A_PIN = re.compile(r"^sm120-stacks-cache-.+-[0-9a-f]{8}$")


def refuse_foreign_volumes(pins: list[Pin], hosts_dir: Path, default: str | None) -> None:
    """StackError (exit 2) for the first pin whose cache volume is not its own: a volume name
    `pin` made for another stack or host, or the volume another pin of the folder mounts
    read-write on the same engine. The folder's other pins are read only when a pin's volume
    is not its own by name (the usual deploy reads no other pin)."""
    everyone: list[Pin] | None = None
    for pin in pins:
        found = _cache_volume(pin)
        if found is None:
            continue
        index, volume = found
        own = cache_volume_name(pin.stack, pin.host)
        if volume == own:
            continue  # its own by name: a pin that mounts it too is the one refused
        everyone = _loadable_pins(hosts_dir) if everyone is None else everyone
        owner = _other_owner(pin, volume, everyone, default)
        if owner is None and not _MADE_FOR_A_PIN.match(volume):
            continue
        whose = f"the cache volume of host {owner}'s pin" if owner else "another pin's"
        raise StackError(
            f"the pin mounts volume {volume} at {CACHE_TARGET}, {whose}, not its own: two "
            "servers would compile into one live/ folder; nothing was rendered or started",
            file=pin_path(hosts_dir, pin.host),
            key=f"volumes.{index}.source",
            line=_line(hosts_dir, pin.host, index),
            hint=f"give it its own: set volumes[{index}].source to {own} (what `pin` names "
            f"it), or pin the host again (`sm120-stacks pin {pin.host} {pin.stack}`), then "
            "deploy",
        )


def _cache_volume(pin: Pin) -> tuple[int, str] | None:
    """(index in the pin's volumes, name) of its named volume at the cache path."""
    for index, mount in enumerate(pin.volumes):
        if mount.target == CACHE_TARGET and not mount.bind:
            return index, mount.source
    return None


def _other_owner(pin: Pin, volume: str, everyone: list[Pin], default: str | None) -> str | None:
    """The host of another pin on the same engine that mounts volume read-write, or whose
    own cache volume it is by name."""
    here = remote.engine_address(pin, default)
    for other in everyone:
        if other.host == pin.host:
            continue
        if volume == cache_volume_name(other.stack, other.host):
            return other.host
        writes = any(m.source == volume and not m.read_only for m in other.volumes)
        if writes and remote.engine_address(other, default) == here:
            return other.host
    return None


def _loadable_pins(hosts_dir: Path) -> list[Pin]:
    """Every pin of the folder that loads (another host's malformed pin is its own deploy's
    error, not this one's)."""
    pins = []
    for host in pinned_hosts(hosts_dir):
        try:
            pins.append(load_pin(hosts_dir, host))
        except StackError:
            continue
    return pins


def _line(hosts_dir: Path, host: str, index: int) -> int | None:
    return load_yaml(pin_path(hosts_dir, host)).line_of(("volumes", index, "source"))
