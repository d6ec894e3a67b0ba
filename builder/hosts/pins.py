"""Host pins: hosts/HOST.yaml says which tested image a serving host runs, and how; this module
reads and writes those files (a pin of schema 1 upgraded on read, the pin a host had before
kept under hosts/previous/) and is where other packages import the pin's names from.

A pin is a plain YAML file meant for git, one per host, so pins of different hosts never
conflict. It is self-contained: deploy, drift and doctor read only the pin (the stack's
requirements on the host are copied into it), so a serving host needs no stacks/ checkout.
Only an image whose tests passed and that was pushed can be pinned (builder.image.records).
The schema is builder/hosts/pin_schema.py; making a pin, builder/hosts/pin_making.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml

from builder.engine.mounts import DEFAULT_MODELS
from builder.errors import StackError
from builder.evidence.trust import POLICY_FILE
from builder.files import write_atomic
from builder.hosts.pin_making import (
    CACHE_ENV,
    CACHE_TARGET,
    PinOptions,
    cache_volume_name,
    make_pin,
)
from builder.hosts.pin_schema import (
    HOST_NAME,
    LABEL_CONTENT,
    LABEL_HOST,
    LABEL_STACK,
    PIN_SCHEMA,
    Pin,
    check_host_name,
    exposure_findings,
    labels,
    port_parts,
)
from builder.knowledge.archflags import capabilities
from builder.knowledge.loader import parse_document
from builder.knowledge.yamlsafe import YamlDocument, load_yaml

__all__ = [
    "CACHE_ENV",
    "CACHE_TARGET",
    "DEFAULT_MODELS",
    "HOST_NAME",
    "LABEL_CONTENT",
    "LABEL_HOST",
    "LABEL_STACK",
    "PIN_SCHEMA",
    "PREVIOUS_DIR",
    "Pin",
    "PinOptions",
    "cache_volume_name",
    "check_host_name",
    "exposure_findings",
    "labels",
    "load_pin",
    "load_previous_pin",
    "make_pin",
    "pin_path",
    "pinned_hosts",
    "port_parts",
    "previous_pin_path",
    "write_pin",
]

HEADER = (
    "# Pinned by `sm120-stacks pin {host} {stack}`. Deploy with `sm120-stacks deploy {host}`,\n"
    "# check the host with `sm120-stacks drift {host}`. Commit this file.\n"
)
#: Where the pin a host had before its current one is kept (what a failed roll goes back to).
PREVIOUS_DIR = "previous"


def pin_path(hosts_dir: Path, host: str) -> Path:
    return hosts_dir / f"{check_host_name(host)}.yaml"


def load_pin(hosts_dir: Path, host: str) -> Pin:
    """The pin of host; unknown host or a malformed file is a StackError with file and key."""
    path = pin_path(hosts_dir, host)
    if not path.is_file():
        known = sorted(p.stem for p in _pin_files(hosts_dir)) if hosts_dir.is_dir() else []
        raise StackError(
            f"no pin for host {host!r} in {hosts_dir}",
            key="HOST",
            hint=f"pinned hosts: {', '.join(known)}"
            if known
            else f"pin it first: sm120-stacks pin {host} STACK",
        )
    doc = load_yaml(path)
    pin = parse_document(doc, Pin, _current_schema(doc, host))
    if pin.host != host:
        raise StackError(
            f"the file pins host {pin.host!r}, not {host!r}",
            file=path,
            key="host",
            line=doc.lines.get(("host",)),
            hint="a pin file is named after its host: hosts/HOST.yaml",
        )
    return pin


def _current_schema(doc: YamlDocument, host: str) -> Any:
    """The document's data as schema PIN_SCHEMA: a schema 1 pin upgraded; no or another
    schema version is an error saying to pin the host again."""
    data: Any = doc.data
    if not isinstance(data, dict):
        return data  # validation says what it should be
    version = data.get("schema_version")
    if type(version) is int and version == PIN_SCHEMA:
        return data
    again = f"pin the host again: sm120-stacks pin {host} {data.get('stack') or 'STACK'}"
    if type(version) is int and version == 1:
        return _from_schema_1(doc, data, again)
    found = "no schema_version" if version is None else f"schema_version {version!r}"
    raise StackError(
        f"{found}: this sm120-stacks reads pins of schema {PIN_SCHEMA} (and 1)",
        file=doc.path,
        key="schema_version",
        line=doc.lines.get(("schema_version",)),
        hint=again,
    )


def _from_schema_1(doc: YamlDocument, data: dict[str, Any], again: str) -> dict[str, Any]:
    """Schema 1 had no serve_port: the server listened on the serve command's last --port,
    which `pin` always wrote. Its GPU targets and their capabilities were two lists, the
    capabilities sorted (so not in the targets' order): each target's capability is taken by
    its name from the arch table instead."""
    command, needs = data.get("command"), data.get("needs")
    ports = [
        value
        for flag, value in itertools.pairwise(command if isinstance(command, list) else [])
        if flag == "--port" and isinstance(value, str) and value.isdigit()
    ]
    targets = needs.get("gpu_targets") if isinstance(needs, dict) else None
    if (
        not ports
        or not isinstance(needs, dict)
        or not isinstance(targets, list)
        or not all(isinstance(t, str) for t in targets)
    ):
        raise StackError(
            "a pin of schema 1 (an earlier sm120-stacks) without a serve command --port or a "
            "list of needs.gpu_targets: its serve port or GPU targets are unknown",
            file=doc.path,
            key="schema_version",
            line=doc.lines.get(("schema_version",)),
            hint=again,
        )
    kept = {k: v for k, v in needs.items() if k not in ("gpu_targets", "compute_capabilities")}
    return {
        **data,
        "schema_version": PIN_SCHEMA,
        "serve_port": int(ports[-1]),
        "needs": {**kept, "targets": capabilities(targets)},
    }


def write_pin(hosts_dir: Path, pin: Pin) -> Path:
    """Write hosts/HOST.yaml. A pin that replaces a different one keeps that one as
    hosts/previous/HOST.yaml first (what `deploy --all` puts the host back on when the new
    one fails); pinning the same thing again keeps the previous pin as it was."""
    path = pin_path(hosts_dir, pin.host)
    data = pin.model_dump(mode="json")
    if data.get("engine") is None:
        data.pop("engine", None)
    text = HEADER.format(host=pin.host, stack=pin.stack) + yaml.safe_dump(
        data, sort_keys=False, width=200
    )
    if path.is_file():
        old = path.read_text()
        if _without_time(old) != _without_time(text):
            write_atomic(previous_pin_path(hosts_dir, pin.host), old)
    write_atomic(path, text)
    return path


def previous_pin_path(hosts_dir: Path, host: str) -> Path:
    return hosts_dir / PREVIOUS_DIR / f"{check_host_name(host)}.yaml"


def load_previous_pin(hosts_dir: Path, host: str) -> Pin | None:
    """The pin the host had before its current one; None when it never had another."""
    if not previous_pin_path(hosts_dir, host).is_file():
        return None
    return load_pin(hosts_dir / PREVIOUS_DIR, host)


def pinned_hosts(hosts_dir: Path) -> list[str]:
    """Every host with a pin in hosts_dir, sorted."""
    if not hosts_dir.is_dir():
        return []
    return sorted(p.stem for p in _pin_files(hosts_dir) if HOST_NAME.match(p.stem))


def _pin_files(hosts_dir: Path) -> list[Path]:
    """The hosts folder's YAML files but its trust policy (trust.yaml, which trust on first
    use writes there: it is no host's pin)."""
    return [p for p in hosts_dir.glob("*.yaml") if p.name != POLICY_FILE]


def _without_time(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("pinned_at:"))
