"""Pin -> what runs on a host: a compose file, a systemd unit, or a container on this engine.

All three run exactly the pinned repo@sha256 with the manifest's serve command, the pin's GPUs,
shared memory, health check and restart policy. They are rendered from one pin so they cannot
disagree; `--apply` runs it through the engine's API (the docker SDK is always installed;
`docker compose` often is not) with the same settings the compose file gives it.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2

from builder.engine import imageref
from builder.engine.hostprobe import RUNTIME_FIX
from builder.engine.protocol import ContainerSpec, Engine, PortBinding
from builder.errors import EngineError, StackError, ToolMissing
from builder.files import write_atomic
from builder.hosts.container import SECRET_TARGET, describe, volumes
from builder.hosts.drift import config_drifts, state_drifts
from builder.hosts.pins import Pin
from builder.render.context import TEMPLATES_DIR

SERVICE = "llm"
DOCKER = "/usr/bin/docker"
SYSTEMD_RESTART = {"always": "always", "unless-stopped": "always", "on-failure": "on-failure"}


def unit_name(pin: Pin) -> str:
    return f"{pin.container}.service"


def host_folders(pin: Pin) -> list[Path]:
    """The host folders the container writes to, its read-write bind mounts: the pin's own, so
    deploying makes them. A read-only bind is what the host provides (the models, the API key
    file); an empty folder made for it would only hide that it is missing."""
    return [Path(v.source) for v in volumes(pin) if v.bind and not v.read_only]


def make_host_folders(pin: Pin) -> list[Path]:
    """Make the pin's missing host folders before its container starts (the engine refuses a
    bind mount of a path that does not exist); returns those made. A missing read-only source,
    or a folder this user may not make, is a StackError saying what to do."""
    for v in volumes(pin):
        if v.read_only and v.bind and not Path(v.source).exists():
            what = "its API key" if v.target == SECRET_TARGET else "the model"
            raise NotStarted(
                f"{v.source} does not exist on this host; the pin mounts it read-only at "
                f"{v.target}",
                key="api_key_file" if v.target == SECRET_TARGET else "volumes",
                hint=f"put what the server reads from {v.target} there ({what}), or pin " "again",
            )
    made = []
    for folder in host_folders(pin):
        if folder.exists():
            continue
        try:
            folder.mkdir(parents=True)
        except OSError as exc:
            raise NotStarted(
                f"cannot create {folder}, the host folder of the pin's bind mount: "
                f"{exc.strerror or exc}",
                key="volumes",
                hint=f"create it as root (`sudo mkdir -p {shlex.quote(str(folder))}`), then "
                "deploy again",
            ) from None
        made.append(folder)
    return made


def render_files(pin: Pin) -> dict[str, str]:
    """compose.yaml and the systemd unit for the pin, by file name: both from its container
    description (hosts/container.py)."""
    env = _jinja_env()
    spec = describe(pin)
    gpu_device: dict[str, Any] | None = None
    if spec.gpus is not None:
        gpu_device = {"driver": "nvidia", "capabilities": ["gpu"]}
        if spec.gpus == "all":
            gpu_device["count"] = "all"
        else:
            gpu_device["device_ids"] = [str(i) for i in spec.gpus]
    mounts = [
        {"type": m.kind, "source": m.source, "target": m.target, "read_only": m.read_only}
        for m in spec.mounts
    ]
    named = sorted({m.source for m in spec.mounts if not m.bind})
    compose = env.get_template("deploy/compose.yaml.j2").render(
        pin=pin,
        spec=spec,
        command=list(spec.command or ()),
        environment=dict(spec.environment),
        ports=[_port_text(p) for p in spec.ports],
        project=f"sm120-stacks-{pin.host}".replace(".", "-"),
        service=SERVICE,
        volumes=mounts,
        named_volumes=named,
        health_test=list(spec.healthcheck.test) if spec.healthcheck else [],
        gpu_device=gpu_device,
        labels=dict(spec.labels),
    )
    unit = env.get_template("deploy/unit.service.j2").render(
        pin=pin,
        unit_name=unit_name(pin),
        docker=DOCKER,
        run_args=docker_run_args(pin),
        systemd_restart=SYSTEMD_RESTART[pin.restart],
        pull_if_absent=pull_if_absent(pin),
        folders=[str(folder) for folder in host_folders(pin)],
    )
    return {"compose.yaml": compose, unit_name(pin): unit}


def pull_if_absent(pin: Pin) -> str:
    """The unit's pre-start shell line: pull the pinned digest only when the engine lacks it.

    A digest on disk is the image itself, so a reboot during a registry outage still starts the
    server; the unit runs it with systemd's `-`, so a failed pull never fails the start either
    (`docker run --pull missing` then says what is missing, and Restart= tries again).
    """
    image = shlex.quote(pin.image)
    return (
        f"{DOCKER} image inspect --format . {image} >/dev/null 2>&1 || exec {DOCKER} pull {image}"
    )


def docker_run_args(pin: Pin) -> list[str]:
    """`docker run` arguments (after `docker`) of the pin's container description.

    systemd owns restarts here, so the container itself has no restart policy and --rm.
    """
    spec = describe(pin)
    args = ["run", "--rm", "--name", pin.container, "--pull", "missing"]
    for key, value in spec.labels.items():
        args += ["--label", f"{key}={value}"]
    if spec.gpus == "all":
        args += ["--gpus", "all"]
    elif spec.gpus:
        args += ["--gpus", '"device=' + ",".join(map(str, spec.gpus)) + '"']
    args += ["--shm-size", pin.shm_size]
    if spec.user is not None:
        args += ["--user", spec.user]
    for port in spec.ports:
        args += ["--publish", _port_text(port)]
    for m in spec.mounts:
        ro = ",readonly" if m.read_only else ""
        args += ["--mount", f"type={m.kind},source={m.source},target={m.target}{ro}"]
    for key, value in spec.environment.items():
        args += ["--env", f"{key}={value}"]
    if spec.healthcheck is not None:
        check = spec.healthcheck
        args += ["--health-cmd", shlex.join(check.test[1:])]
        args += [
            f"--health-interval={check.interval_s}s",
            f"--health-timeout={check.timeout_s}s",
            f"--health-retries={check.retries}",
            f"--health-start-period={check.start_period_s}s",
        ]
    return [*args, spec.image, *(spec.command or ())]


def _port_text(port: PortBinding) -> str:
    """[IP:]HOST:CONTAINER as docker and compose write it."""
    ip = f"{port.host_ip}:" if port.host_ip else ""
    return f"{ip}{port.host_port}:{port.container_port}"


def write_files(pin: Pin, out_dir: Path) -> list[Path]:
    written = []
    for name, text in render_files(pin).items():
        write_atomic(out_dir / name, text)
        written.append(out_dir / name)
    return written


def container_spec(pin: Pin) -> ContainerSpec:
    """The container `--apply` starts: the pin's container description."""
    return describe(pin)


#: A step between the old container's removal and the new one's start (the warm-cache
#: restore, hosts/warm_target.py): what it did, in words, or None.
BeforeStart = Callable[[Pin, Engine], "str | None"]


#: Why a container that runs as pinned must restart all the same (its cache volume holds what
#: the trust policy refuses: hosts/warm_target.py), in words; None: it may run on.
MustRestart = Callable[[Pin, Engine], "str | None"]


def apply(
    pin: Pin,
    engine: Engine,
    before_start: BeforeStart | None = None,
    must_restart: MustRestart | None = None,
) -> str:
    """Run the pin on this engine. A container that drift would find clean is left alone
    unless must_restart names a reason (then before_start purges what it must); any other
    (drifted, stopped, crash-looping, unhealthy) is replaced, so a fresh one starts with a
    zero restart count. Returns what was done, in words."""
    made = make_host_folders(pin)
    ensure_image(pin, engine)
    existing = engine.container(pin.container)
    restart_why = None
    if existing is not None:
        attrs = existing.attrs
        if not state_drifts(attrs) and not config_drifts(pin, engine, attrs):
            restart_why = must_restart(pin, engine) if must_restart is not None else None
            if restart_why is None:
                return f"{pin.container} already runs {pin.image} as pinned; nothing to do"
        existing.remove(force=True)
    prepared = before_start(pin, engine) if before_start is not None else None
    try:
        container = engine.run(container_spec(pin))
    except EngineError as exc:
        if "device driver" in exc.explanation and "gpu" in exc.explanation:
            raise ToolMissing(
                f"this engine cannot give containers GPUs: {exc.explanation}",
                hint=RUNTIME_FIX + "; or pin with --gpus none for a CPU-only stack",
            ) from None
        raise StackError(
            f"the engine refused to start {pin.container}: {separated(exc.explanation)}"
        ) from None
    verb = "restarted" if restart_why else "replaced" if existing is not None else "started"
    done = "".join(f"created {folder}\n" for folder in made)
    done += f"{restart_why}\n" if restart_why else ""
    done += f"{prepared}\n" if prepared else ""
    return f"{done}{verb} {pin.container} ({container.short_id}) running {pin.image}"


class NotStarted(StackError):
    """`apply` stopped before it touched any container of the host (the image could not be
    had, a host folder could not be made): what ran there runs on, so there is nothing to roll
    back."""


def ensure_image(pin: Pin, engine: Engine) -> None:
    """Pull the pinned digest unless the engine already has it."""
    if engine.image(pin.image) is not None:
        return
    repository = imageref.parse(pin.image).tagged  # a pin is repository[:tag]@sha256:...
    try:
        engine.pull(repository, imageref.digest_of(pin.image))
    except EngineError as exc:
        raise NotStarted(
            f"pulling {pin.image} failed: {separated(exc.explanation)}",
            hint="the engine has no copy of the pinned digest and could not pull it: fix what "
            "it said (a registry down or out of reach, a login), then deploy again; the host's "
            "containers were not touched",
        ) from None


#: Where the engine runs one error's text into the next ("…connection refusedError response
#: from daemon: …"): each starts again after "; ".
_RUN_TOGETHER = re.compile(r"(?<=[^\s;])(?=Error response from daemon: )")


def separated(explanation: str) -> str:
    """The engine's errors one after another, each readable: "A; Error response from …"."""
    return _RUN_TOGETHER.sub("; ", explanation.strip())


def _jinja_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["c"] = compose_value
    env.filters["sd"] = systemd_quote
    return env


def systemd_quote(value: object) -> str:
    """One systemd ExecStart word: double-quoted, with \\, ", $ and % escaped."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    text = text.replace("%", "%%").replace("$", "$$")
    return f'"{text}"'


def compose_value(value: object) -> str:
    """A compose value as JSON (valid YAML) with every `$` in its strings written `$$`.

    Compose interpolates `${VAR}` and `$VAR` in every value, so the API-key wrapper's
    `$(cat ...)`, `$0` and `$@` would be expanded, or refused (docker-compose 1.x), before the
    container sees them; `$$` is Compose's literal `$`. Keys are not interpolated.
    """
    return json.dumps(_dollars_doubled(value), ensure_ascii=True)


def _dollars_doubled(value: object) -> object:
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {key: _dollars_doubled(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_dollars_doubled(item) for item in value]
    return value
