"""Which run made a container, and the containers of runs that died before removing theirs.

Every container the tool starts for itself (a smoke's, a check's, each throwaway of
throwaway.py, a warm-volume helper) is removed by the run that started it. When that run dies
first (the engine restarted under it: bench/FAULTS.md; the tool SIGKILLed mid-`test`), the
container stays, exited, once its command ends. No one else removes it: two users' runs on one
engine must never remove each other's live containers. So each container carries its run's
identity (OWNER_LABEL = host:pid@boot), and the next smoke, check or throwaway on that host
removes the ones whose run is a dead process of this host: stopped or still running (a push
killed mid-listing left its listing container running: bench/results/kill-sweep/). A running
one is removed only when its label names this very boot of this machine (the kernel's boot id):
a pid means nothing across a reboot or another machine that happens to share the hostname. A
container whose owner lives, or whose label names another host, is left alone: a live run
removes its own. Labels written before the boot id (host:pid) are judged as before: stopped
ones only.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from builder.engine.protocol import Container, ContainerSpec, Engine
from builder.errors import EngineError

#: Which run made a container: two users' (or two clones') runs on one engine tell theirs
#: apart by it, and clean up only their own.
OWNER_LABEL = "sm120-stacks.owner"
#: The states of a container that no process works in any more (`docker ps -a` STATUS).
STOPPED = frozenset({"created", "exited", "dead"})


def owner() -> str:
    """This process, on this machine, in this boot: the identity of the run that starts a
    container."""
    return f"{socket.gethostname()}:{os.getpid()}@{boot_id()}"


def boot_id() -> str:
    """The kernel's id of this boot (Linux), shortened; "" where there is none."""
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text()
    except OSError:
        return ""
    return text.strip().replace("-", "")[:16]


def owned(spec: ContainerSpec) -> ContainerSpec:
    """spec labelled with this run as its owner, so that the one reaper finds it if this run
    dies before removing it."""
    return replace(spec, labels={**spec.labels, OWNER_LABEL: owner()})


@dataclass(frozen=True)
class Orphan:
    """A container removed because the run that made it died."""

    name: str
    owner: str
    state: str


def dead_owner(label: str, host: str | None = None) -> bool:
    """Whether label (host:pid) names a process of this host that no longer exists. A label
    of another host, or one not of that form, is never judged dead: its pid means nothing here."""
    name, _, pid_text = label.partition("@")[0].rpartition(":")
    if name != (host or socket.gethostname()) or not pid_text.isdigit() or int(pid_text) <= 0:
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, under another user
    return False


def reap_orphans(engine: Engine, log: Callable[[str], None] = print) -> list[Orphan]:
    """Remove this tool's containers whose run is a dead process of this host (running ones
    only when labelled with this boot); the ones removed. The engine failing to list or remove
    one is not this run's failure: what is left is tried again by the next run."""
    try:
        found = engine.containers(label=OWNER_LABEL)
    except EngineError:
        return []
    removed = []
    for container in found:
        orphan = _orphan(container)
        if orphan is None:
            continue
        try:
            container.remove(force=True)
        except EngineError:
            continue
        removed.append(orphan)
        log(
            f"removed {orphan.name} ({orphan.state}): its run {orphan.owner} ended without "
            "removing it (the engine was down then?)"
        )
    return removed


def _orphan(container: Container) -> Orphan | None:
    attrs = container.attrs
    label = str(((attrs.get("Config") or {}).get("Labels") or {}).get(OWNER_LABEL) or "")
    state = str((attrs.get("State") or {}).get("Status") or "")
    if not dead_owner(label):
        return None
    this_boot = bool(boot_id()) and label.partition("@")[2] == boot_id()
    if state not in STOPPED and not this_boot:
        return None
    return Orphan(container.name, label, state)
