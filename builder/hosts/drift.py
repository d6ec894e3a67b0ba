"""Drift: what runs on a host, compared with its pin. Read-only: it never changes anything.

Checked, most important first (validation_repro.md §5.2): the registry digest of the running
container's image (RepoDigests; an image ID is not a registry digest), a canonical run
configuration (command, entrypoint, env, GPUs, mounts, ports, shared memory), the container's
state, health and restart count, stray containers of the same host, and the host's prerequisites
(driver, GPU capability, NVIDIA runtime) when the pin uses GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from builder.engine.hostprobe import HostFacts
from builder.engine.protocol import ContainerSpec, Engine, Mount
from builder.hosts.container import describe
from builder.hosts.hostcheck import Finding, check
from builder.hosts.pins import LABEL_HOST, Pin, exposure_findings

UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
ANONYMOUS_VOLUME = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Drift:
    #: What drifted: image, command, entrypoint, env, gpus, mounts, ports, shm_size, state,
    #: health, restarts, container, stray, engine, driver, gpu, runtime; file (a rendered
    #: compose.yaml or unit edited away from the pin: hosts/rendered.py).
    name: str
    detail: str


@dataclass
class Report:
    host: str
    image: str
    drifts: list[Drift] = field(default_factory=list)
    #: What was compared and found as pinned (names), for the summary.
    clean: list[str] = field(default_factory=list)
    prerequisites: list[Finding] = field(default_factory=list)
    #: Warm or cold, and what the server compiled since its start (hosts/warm_target.py); None:
    #: the pin has no cache volume or nothing runs.
    warm: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "image": self.image,
            "warm": self.warm,
            "drifted": bool(self.drifts),
            "drifts": [{"name": d.name, "detail": d.detail} for d in self.drifts],
            "clean": self.clean,
            "prerequisites": [
                {"name": f.name, "ok": f.ok, "detail": f.detail, "fix": f.fix}
                for f in self.prerequisites
            ],
        }


# --- canonical run configuration ---------------------------------------------------------------


def expected_config(pin: Pin, image_config: dict[str, Any]) -> dict[str, Any]:
    """The canonical run configuration of the pin's container description (hosts/container.py,
    what deploy starts), on top of the image's own config."""
    spec = describe(pin)
    env = _env_dict(image_config.get("Env"))
    env.update(spec.environment)
    ports = sorted(
        f"{p.host_ip or '0.0.0.0'}:{p.host_port}->{p.container_port}/tcp" for p in spec.ports
    )
    return {
        "command": list(spec.command or ()),
        "entrypoint": list(spec.entrypoint or image_config.get("Entrypoint") or []),
        "env": env,
        "gpus": _spec_gpus(spec),
        "mounts": sorted(mount_text(m) for m in spec.mounts),
        "ports": ports,
        "shm_size": shm_bytes(spec.shm_size or "0"),
        "user": spec.user or str(image_config.get("User") or ""),
    }


def mount_text(mount: Mount) -> str:
    """KIND:SOURCE:TARGET:ro|rw, the canonical form of one mount on both sides of the
    comparison: a bind and a volume of the same name are different mounts."""
    return f"{mount.kind}:{mount.source}:{mount.target}:{'ro' if mount.read_only else 'rw'}"


def actual_config(attrs: dict[str, Any]) -> dict[str, Any]:
    """The same canonical form read from `docker inspect` of a container."""
    config = attrs.get("Config") or {}
    host = attrs.get("HostConfig") or {}
    ports = sorted(
        f"{b.get('HostIp') or '0.0.0.0'}:{b.get('HostPort')}->{port}"
        for port, bindings in (host.get("PortBindings") or {}).items()
        for b in bindings or []
    )
    mounts = []
    for m in attrs.get("Mounts") or []:
        kind = str(m.get("Type"))
        source = m.get("Source") if kind == "bind" else m.get("Name")
        if kind == "volume" and ANONYMOUS_VOLUME.match(str(source)):
            continue  # an image VOLUME nobody asked for; not part of the run configuration
        mounts.append(f"{kind}:{source}:{m.get('Destination')}:{'rw' if m.get('RW') else 'ro'}")
    return {
        "command": list(config.get("Cmd") or []),
        "entrypoint": list(config.get("Entrypoint") or []),
        "env": _env_dict(config.get("Env")),
        "gpus": _device_requests(host.get("DeviceRequests")),
        "mounts": sorted(mounts),
        "ports": ports,
        "shm_size": int(host.get("ShmSize") or 0),
        "user": str(config.get("User") or ""),
    }


def compare_config(expected: dict[str, Any], actual: dict[str, Any]) -> list[Drift]:
    """One drift per differing field; env is compared variable by variable."""
    drifts = []
    for key in expected:
        want, have = expected[key], actual.get(key)
        if want == have:
            continue
        if key == "env":
            drifts.append(Drift("env", _env_diff(want, have or {})))
        else:
            drifts.append(Drift(key, f"runs with {_show(have)}, pinned {_show(want)}"))
    return drifts


def shm_bytes(size: str) -> int:
    match = re.fullmatch(r"([0-9]+)([bkmg]?)", size.lower())
    if match is None:
        raise ValueError(f"not a size: {size!r}")
    return int(match.group(1)) * UNITS[match.group(2)]


# --- the container -----------------------------------------------------------------------------


def image_drift(pin: Pin, image_attrs: dict[str, Any] | None) -> list[Drift]:
    """The running image must carry the pinned repo@sha256 among its RepoDigests."""
    if image_attrs is None:
        return [Drift("image", "the container's image is gone from this engine")]
    digests = list(image_attrs.get("RepoDigests") or [])
    if pin.image in digests:
        return []
    label = ((image_attrs.get("Config") or {}).get("Labels") or {}).get("sm120-stacks.content-hash")
    runs = ", ".join(digests) if digests else f"{image_attrs.get('Id')} (no registry digest)"
    stack = f"; its content hash is {label[:16]}" if label else ""
    return [Drift("image", f"runs {runs}{stack}, pinned {pin.image}")]


def state_drifts(attrs: dict[str, Any]) -> list[Drift]:
    state = attrs.get("State") or {}
    drifts = []
    status = state.get("Status")
    if state.get("Restarting"):
        drifts.append(Drift("state", "restarting (it keeps exiting)"))
    elif status != "running":
        code = state.get("ExitCode")
        drifts.append(Drift("state", f"{status}" + (f" (exit code {code})" if code else "")))
    restarts = int(attrs.get("RestartCount") or 0)
    if restarts:
        drifts.append(
            Drift("restarts", f"restarted {restarts} times since it was created (crash loop?)")
        )
    health = (state.get("Health") or {}).get("Status")
    if health == "unhealthy" and status == "running":  # a stopped container reads unhealthy
        log = (state.get("Health") or {}).get("Log") or [{}]
        output = " ".join(str(log[-1].get("Output", "")).split())[:160]
        drifts.append(Drift("health", f"unhealthy: {output}" if output else "unhealthy"))
    return drifts


def config_drifts(pin: Pin, engine: Engine, attrs: dict[str, Any]) -> list[Drift]:
    """Image and run-configuration drift of a container (not its state): what deploy compares."""
    image_attrs = _image_attrs(engine, attrs.get("Image"))
    pinned_attrs = _image_attrs(engine, pin.image) or image_attrs or {}
    drifts = image_drift(pin, image_attrs)
    expected = expected_config(pin, pinned_attrs.get("Config") or {})
    return drifts + compare_config(expected, actual_config(attrs))


def verify(pin: Pin, engine: Engine | None, engine_error: str | None, facts: HostFacts) -> Report:
    """Every drift between the host and its pin; prerequisites only when the pin uses GPUs."""
    report = Report(pin.host, pin.image)
    for exposed in exposure_findings(pin):
        report.drifts.append(Drift("exposed", f"{exposed} (pinned with --no-auth)"))
    if pin.allow_unserved:
        report.drifts.append(
            Drift(
                "unserved",
                "pinned with --allow-unserved: the image never served on this host's GPU kind "
                "(static checks only)",
            )
        )
    if pin.gpus == "none":
        report.prerequisites = [
            Finding("gpu", True, "the pin gives the container no GPU: driver and GPU not needed")
        ]
    else:
        report.prerequisites = check(facts, pin.needs.requirements(), pin.gpu_indices)
        report.drifts += [Drift(f.name, f.detail) for f in report.prerequisites if not f.ok]
    if engine is None:
        if not any(d.name == "engine" for d in report.drifts):
            report.drifts.append(Drift("engine", f"cannot reach the Docker engine: {engine_error}"))
        return report
    container = engine.container(pin.container)
    if container is None:
        report.drifts.append(Drift("container", f"no container named {pin.container} on this host"))
        report.drifts += _strays(pin, engine)
        return report
    attrs = container.attrs
    found = config_drifts(pin, engine, attrs) + state_drifts(attrs)
    found += _strays(pin, engine)
    report.drifts += found
    compared = ["image", *expected_config(pin, {}).keys(), "state", "restarts", "health", "stray"]
    names = {d.name for d in found}
    report.clean = [name for name in compared if name not in names]
    return report


def _strays(pin: Pin, engine: Engine) -> list[Drift]:
    others = engine.containers(label=f"{LABEL_HOST}={pin.host}")
    names = sorted(c.name for c in others if c.name != pin.container)
    if not names:
        return []
    return [Drift("stray", f"other containers deployed for {pin.host}: {', '.join(names)}")]


def _image_attrs(engine: Engine, ref: str | None) -> dict[str, Any] | None:
    image = engine.image(ref) if ref else None
    return None if image is None else image.attrs


def _env_dict(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, _, value = item.partition("=")
        out[key] = value
    return out


def _env_diff(want: dict[str, str], have: dict[str, str]) -> str:
    parts = []
    for key in sorted(want.keys() | have.keys()):
        if key not in have:
            parts.append(f"{key} is not set (pinned {want[key]!r})")
        elif key not in want:
            parts.append(f"{key}={have[key]!r} is set but not pinned")
        elif want[key] != have[key]:
            parts.append(f"{key} is {have[key]!r}, pinned {want[key]!r}")
    return "; ".join(parts)


def _spec_gpus(spec: ContainerSpec) -> str:
    if spec.gpus is None:
        return "none"
    return _gpus_text(None if spec.gpus == "all" else list(spec.gpus))


def _gpus_text(indices: list[int] | None) -> str:
    if indices is None:
        return "all"
    return ",".join(map(str, sorted(indices))) if indices else "none"


def _device_requests(requests: list[dict[str, Any]] | None) -> str:
    ids: list[int] = []
    for request in requests or []:
        if ["gpu"] not in (request.get("Capabilities") or []):
            continue
        if request.get("Count") == -1:
            return "all"
        ids += [int(i) for i in request.get("DeviceIDs") or [] if str(i).isdigit()]
    return _gpus_text(ids) if ids else "none"


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]" if value else "nothing"
    return str(value)
