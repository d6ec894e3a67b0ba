"""Pin -> what runs on a host: a compose file, a systemd unit, or a container on this engine.

All three run exactly the pinned repo@sha256 with the manifest's serve command, the pin's GPUs,
shared memory, health check and restart policy. They are rendered from one pin so they cannot
disagree; `--apply` runs it through the engine's API (the docker SDK is always installed;
`docker compose` often is not) with the same settings the compose file gives it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Literal

import jinja2

from builder.errors import EngineError, StackError, ToolMissing
from builder.files import write_atomic
from builder.hosts.drift import config_drifts, state_drifts
from builder.hosts.pins import Pin, labels, port_parts
from builder.image.engine import ContainerSpec, Engine, HealthCheck, Mount, PortBinding
from builder.image.hostprobe import RUNTIME_FIX
from builder.render.context import TEMPLATES_DIR

SERVICE = "llm"
DOCKER = "/usr/bin/docker"
SYSTEMD_RESTART = {"always": "always", "unless-stopped": "always", "on-failure": "on-failure"}


def health_test(pin: Pin) -> list[str]:
    """Exec-form health check: the image's Python fetches the health path (no curl needed)."""
    url = f"http://127.0.0.1:{pin.serve_port}{pin.health.path}"
    code = f"import urllib.request as u; u.urlopen({url!r}, timeout={pin.health.timeout_s})"
    return ["CMD", "python", "-c", code]


def unit_name(pin: Pin) -> str:
    return f"{pin.container}.service"


def host_folders(pin: Pin) -> list[Path]:
    """The host folders the container writes to, its read-write bind mounts (the models folder,
    caches): the pin's own, so deploying makes them. A read-only bind is what the host provides
    (a model put there by hand); an empty folder made for it would only hide that it is missing.
    """
    return [Path(v.source) for v in pin.volumes if v.source.startswith("/") and not v.read_only]


def make_host_folders(pin: Pin) -> list[Path]:
    """Make the pin's missing host folders before its container starts (the engine refuses a
    bind mount of a path that does not exist); returns those made. A missing read-only source,
    or a folder this user may not make, is a StackError saying what to do."""
    for v in pin.volumes:
        if v.read_only and v.source.startswith("/") and not Path(v.source).exists():
            raise StackError(
                f"{v.source} does not exist on this host; the pin mounts it read-only at "
                f"{v.target}",
                key="volumes",
                hint=f"put what the server reads from {v.target} there (the model), or pin "
                "again with another --volume",
            )
    made = []
    for folder in host_folders(pin):
        if folder.exists():
            continue
        try:
            folder.mkdir(parents=True)
        except OSError as exc:
            raise StackError(
                f"cannot create {folder}, the host folder of the pin's bind mount: "
                f"{exc.strerror or exc}",
                key="volumes",
                hint=f"create it as root (`sudo mkdir -p {shlex.quote(str(folder))}`), then "
                "deploy again",
            ) from None
        made.append(folder)
    return made


def render_files(pin: Pin) -> dict[str, str]:
    """compose.yaml and the systemd unit for the pin, by file name."""
    env = _jinja_env()
    gpu_device: dict[str, Any] | None = None
    if pin.gpus != "none":
        gpu_device = {"driver": "nvidia", "capabilities": ["gpu"]}
        if pin.gpu_indices is None:
            gpu_device["count"] = "all"
        else:
            gpu_device["device_ids"] = [str(i) for i in pin.gpu_indices]
    volumes = [
        {"type": "bind" if v.source.startswith("/") else "volume", "source": v.source}
        | {"target": v.target, "read_only": v.read_only}
        for v in pin.volumes
    ]
    compose = env.get_template("deploy/compose.yaml.j2").render(
        pin=pin,
        project=f"sm120-stacks-{pin.host}".replace(".", "-"),
        service=SERVICE,
        volumes=volumes,
        health_test=health_test(pin),
        gpu_device=gpu_device,
        labels=labels(pin),
    )
    unit = env.get_template("deploy/unit.service.j2").render(
        pin=pin,
        unit_name=unit_name(pin),
        docker=DOCKER,
        run_args=docker_run_args(pin),
        systemd_restart=SYSTEMD_RESTART[pin.restart],
        folders=[str(folder) for folder in host_folders(pin)],
    )
    return {"compose.yaml": compose, unit_name(pin): unit}


def docker_run_args(pin: Pin) -> list[str]:
    """`docker run` arguments (after `docker`) equivalent to the compose service.

    systemd owns restarts here, so the container itself has no restart policy and --rm.
    """
    args = ["run", "--rm", "--name", pin.container, "--pull", "missing"]
    for key, value in labels(pin).items():
        args += ["--label", f"{key}={value}"]
    if pin.gpus == "all":
        args += ["--gpus", "all"]
    elif pin.gpu_indices:
        args += ["--gpus", '"device=' + ",".join(map(str, pin.gpu_indices)) + '"']
    args += ["--shm-size", pin.shm_size]
    for mapping in pin.ports:
        args += ["--publish", mapping]
    for v in pin.volumes:
        kind = "bind" if v.source.startswith("/") else "volume"
        ro = ",readonly" if v.read_only else ""
        args += ["--mount", f"type={kind},source={v.source},target={v.target}{ro}"]
    for key, value in pin.env.items():
        args += ["--env", f"{key}={value}"]
    args += ["--health-cmd", shlex.join(health_test(pin)[1:])]
    args += [
        f"--health-interval={pin.health.interval_s}s",
        f"--health-timeout={pin.health.timeout_s}s",
        f"--health-retries={pin.health.retries}",
        f"--health-start-period={pin.health.start_period_s}s",
    ]
    return [*args, pin.image, *pin.command]


def write_files(pin: Pin, out_dir: Path) -> list[Path]:
    written = []
    for name, text in render_files(pin).items():
        write_atomic(out_dir / name, text)
        written.append(out_dir / name)
    return written


def container_spec(pin: Pin) -> ContainerSpec:
    """The container `--apply` starts: the compose service's settings."""
    gpus: Literal["all"] | tuple[int, ...] | None = None
    if pin.gpus != "none":
        gpus = "all" if pin.gpu_indices is None else tuple(pin.gpu_indices)
    return ContainerSpec(
        image=pin.image,
        command=tuple(pin.command),
        name=pin.container,
        environment=dict(pin.env),
        labels=labels(pin),
        shm_size=pin.shm_size,
        ports=tuple(
            PortBinding(container, ip or None, host)
            for ip, host, container in map(port_parts, pin.ports)
        ),
        mounts=tuple(Mount(v.source, v.target, v.read_only) for v in pin.volumes),
        gpus=gpus,
        restart=pin.restart,
        healthcheck=HealthCheck(
            test=tuple(health_test(pin)),
            interval_s=pin.health.interval_s,
            timeout_s=pin.health.timeout_s,
            retries=pin.health.retries,
            start_period_s=pin.health.start_period_s,
        ),
    )


def apply(pin: Pin, engine: Engine) -> str:
    """Run the pin on this engine. A container that verify would find clean is left alone; any
    other (drifted, stopped, crash-looping, unhealthy) is replaced, so a fresh one starts with a
    zero restart count. Returns what was done, in words."""
    made = make_host_folders(pin)
    ensure_image(pin, engine)
    existing = engine.container(pin.container)
    if existing is not None:
        attrs = existing.attrs
        if not state_drifts(attrs) and not config_drifts(pin, engine, attrs):
            return f"{pin.container} already runs {pin.image} as pinned; nothing to do"
        existing.remove(force=True)
    try:
        container = engine.run(container_spec(pin))
    except EngineError as exc:
        if "device driver" in exc.explanation and "gpu" in exc.explanation:
            raise ToolMissing(
                f"this engine cannot give containers GPUs: {exc.explanation}",
                hint=RUNTIME_FIX + "; or pin with --gpus none for a CPU-only stack",
            ) from None
        raise StackError(f"the engine refused to start {pin.container}: {exc}") from None
    verb = "replaced" if existing is not None else "started"
    done = "".join(f"created {folder}\n" for folder in made)
    return f"{done}{verb} {pin.container} ({container.short_id}) running {pin.image}"


def ensure_image(pin: Pin, engine: Engine) -> None:
    """Pull the pinned digest unless the engine already has it."""
    if engine.image(pin.image) is not None:
        return
    repository, digest = pin.image.split("@", 1)
    try:
        engine.pull(repository, digest)
    except EngineError as exc:
        raise StackError(f"pulling {pin.image} failed: {exc.explanation}") from None


def _jinja_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["j"] = lambda value: json.dumps(value, ensure_ascii=True)
    env.filters["sd"] = systemd_quote
    return env


def systemd_quote(value: object) -> str:
    """One systemd ExecStart word: double-quoted, with \\, ", $ and % escaped."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    text = text.replace("%", "%%").replace("$", "$$")
    return f'"{text}"'
