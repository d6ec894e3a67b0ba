"""Pin -> what runs on a host: a compose file, a systemd unit, or a container on this engine.

All three run exactly the pinned repo@sha256 with the manifest's serve command, the pin's GPUs,
shared memory, health check and restart policy. They are rendered from one pin so they cannot
disagree; `--apply` uses the docker SDK (always installed; `docker compose` often is not) and
gives the container the same settings the compose file does.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import jinja2

from builder.errors import StackError, ToolMissing
from builder.files import write_atomic
from builder.hosts.drift import config_drifts, state_drifts
from builder.hosts.hostcheck import RUNTIME_FIX
from builder.hosts.pins import Pin, labels, port_parts
from builder.render.context import TEMPLATES_DIR

SERVICE = "llm"
DOCKER = "/usr/bin/docker"
SYSTEMD_RESTART = {"always": "always", "unless-stopped": "always", "on-failure": "on-failure"}
NANOSECONDS = 1_000_000_000


def health_test(pin: Pin) -> list[str]:
    """Exec-form health check: the image's Python fetches the health path (no curl needed)."""
    url = f"http://127.0.0.1:{pin.serve_port}{pin.health.path}"
    code = f"import urllib.request as u; u.urlopen({url!r}, timeout={pin.health.timeout_s})"
    return ["CMD", "python", "-c", code]


def unit_name(pin: Pin) -> str:
    return f"{pin.container}.service"


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


def sdk_run_kwargs(pin: Pin) -> dict[str, Any]:
    """docker SDK `containers.run` arguments equivalent to the compose service."""
    from docker.types import DeviceRequest, Mount

    kwargs: dict[str, Any] = {
        "image": pin.image,
        "command": list(pin.command),
        "name": pin.container,
        "detach": True,
        "environment": dict(pin.env),
        "labels": labels(pin),
        "shm_size": pin.shm_size,
        "restart_policy": {"Name": pin.restart},
        "ports": {f"{c}/tcp": (ip, h) if ip else h for ip, h, c in map(port_parts, pin.ports)},
        "mounts": [
            Mount(
                target=v.target,
                source=v.source,
                type="bind" if v.source.startswith("/") else "volume",
                read_only=v.read_only,
            )
            for v in pin.volumes
        ],
        "healthcheck": {
            "test": health_test(pin),
            "interval": pin.health.interval_s * NANOSECONDS,
            "timeout": pin.health.timeout_s * NANOSECONDS,
            "retries": pin.health.retries,
            "start_period": pin.health.start_period_s * NANOSECONDS,
        },
    }
    if pin.gpus != "none":
        ids = pin.gpu_indices
        kwargs["device_requests"] = [
            DeviceRequest(
                count=-1 if ids is None else 0,
                device_ids=None if ids is None else [str(i) for i in ids],
                capabilities=[["gpu"]],
            )
        ]
    return kwargs


def apply(pin: Pin, api: Any) -> str:
    """Run the pin on this engine. A container that verify would find clean is left alone; any
    other (drifted, stopped, crash-looping, unhealthy) is replaced, so a fresh one starts with a
    zero restart count. Returns what was done, in words."""
    from docker.errors import APIError, NotFound

    ensure_image(pin, api)
    try:
        existing = api.containers.get(pin.container)
    except NotFound:
        existing = None
    if existing is not None:
        if not state_drifts(existing.attrs) and not config_drifts(pin, api, existing.attrs):
            return f"{pin.container} already runs {pin.image} as pinned; nothing to do"
        existing.remove(force=True)
    try:
        container = api.containers.run(**sdk_run_kwargs(pin))
    except APIError as exc:
        if "device driver" in str(exc) and "gpu" in str(exc):
            raise ToolMissing(
                f"this engine cannot give containers GPUs: {exc.explanation or exc}",
                hint=RUNTIME_FIX + "; or pin with --gpus none for a CPU-only stack",
            ) from None
        raise StackError(f"the engine refused to start {pin.container}: {exc}") from None
    verb = "replaced" if existing is not None else "started"
    return f"{verb} {pin.container} ({container.short_id}) running {pin.image}"


def ensure_image(pin: Pin, api: Any) -> None:
    """Pull the pinned digest unless the engine already has it."""
    from docker.errors import APIError, ImageNotFound

    try:
        api.images.get(pin.image)
        return
    except ImageNotFound:
        pass
    repository, digest = pin.image.split("@", 1)
    try:
        for line in api.api.pull(repository, tag=digest, stream=True, decode=True):
            if "error" in line or "errorDetail" in line:
                detail = line.get("errorDetail", {}).get("message") or line.get("error")
                raise StackError(f"pulling {pin.image} failed: {detail}")
    except APIError as exc:
        raise StackError(f"pulling {pin.image} failed: {exc}") from None


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
