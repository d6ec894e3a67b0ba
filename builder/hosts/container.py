"""The one container a pin describes; every rendering of a pin is made from it.

The compose file, the systemd unit's `docker run` arguments, the engine-API container that
`deploy --apply` starts and the Kubernetes Deployment (hosts/deploy.py, hosts/k8s.py) all read
`describe(pin)`, and `drift` compares a running container with it (hosts/drift.py): four
renderings cannot disagree about what runs. Its mounts are the one `Mount`, whose `kind` says
which are binds (tests/test_mount_rule.py renders one pin every way and compares).

It is also where a pin's API key reaches the server, and nowhere else: the pin names a file on
the host (`api_key_file`), mounted read-only at SECRET_TARGET. vLLM takes the key as
VLLM_API_KEY (read in vLLM 0.22.1 and 0.33.0: envs.py VLLM_API_KEY, entrypoints/openai
api_server.py, which `--api-key` overrides); the serve command is wrapped in `sh -c` that
exports it from the file and execs the server, so the key is in no pin, rendered file, image
layer, label, `docker inspect` (Config.Env, Args) or process list; it stays readable in the
server's own /proc/PID/environ (root and the server's user only), which no wrapper avoids
short of a patch to vLLM. `transformers serve` has no key option: its pin runs
templates/tools/auth_proxy.py (in every image) on the serve port in front of the server,
which then listens on a private loopback port.
"""

from __future__ import annotations

from typing import Literal

from builder.engine.protocol import ContainerSpec, HealthCheck, Mount, PortBinding
from builder.hosts.pins import Pin, labels, port_parts

SECRET_TARGET = "/run/secrets/sm120-stacks-api-key"
#: The in-image key gate for an engine without one (templates/tools/, copied into every image).
AUTH_PROXY = "/opt/sm120-stacks/tools/auth_proxy.py"
#: Where `transformers serve` listens behind the gate (loopback inside the container).
GATED_PORT = 18080
_EXPORT_KEY = f'VLLM_API_KEY="$(cat {SECRET_TARGET})" exec "$0" "$@"'


def health_test(pin: Pin) -> list[str]:
    """Exec-form health check: the image's Python fetches the health path (no curl needed)."""
    url = f"http://127.0.0.1:{pin.serve_port}{pin.health.path}"
    code = f"import urllib.request as u; u.urlopen({url!r}, timeout={pin.health.timeout_s})"
    return ["CMD", "python", "-c", code]


def run_command(pin: Pin) -> list[str]:
    """The serve command as the container runs it: the pin's, behind its API key if it has
    one (see the module's docstring)."""
    command = list(pin.command)
    if pin.api_key_file is None:
        return command
    if command[:1] == ["transformers"]:
        inner = _retarget(command, "127.0.0.1", GATED_PORT)
        listen = ["--listen", str(pin.serve_port), "--upstream", str(GATED_PORT)]
        return ["python", AUTH_PROXY, *listen, "--key-file", SECRET_TARGET, "--", *inner]
    return ["sh", "-c", _EXPORT_KEY, *command]


def volumes(pin: Pin) -> list[Mount]:
    """The pin's mounts and, with an API key, its file read-only at SECRET_TARGET."""
    found = list(pin.volumes)
    if pin.api_key_file is not None:
        found.append(Mount(pin.api_key_file, SECRET_TARGET, read_only=True))
    return found


def describe(pin: Pin) -> ContainerSpec:
    gpus: Literal["all"] | tuple[int, ...] | None = None
    if pin.gpus != "none":
        gpus = "all" if pin.gpu_indices is None else tuple(pin.gpu_indices)
    return ContainerSpec(
        image=pin.image,
        command=tuple(run_command(pin)),
        name=pin.container,
        environment=dict(pin.env),
        labels=labels(pin),
        shm_size=pin.shm_size,
        ports=tuple(
            PortBinding(container, ip or None, host)
            for ip, host, container in map(port_parts, pin.ports)
        ),
        mounts=tuple(volumes(pin)),
        gpus=gpus,
        restart=pin.restart,
        user=pin.user,
        healthcheck=HealthCheck(
            test=tuple(health_test(pin)),
            interval_s=pin.health.interval_s,
            timeout_s=pin.health.timeout_s,
            retries=pin.health.retries,
            start_period_s=pin.health.start_period_s,
        ),
    )


def _retarget(command: list[str], host: str, port: int) -> list[str]:
    """command with its --host and --port values replaced (the serve command has both)."""
    out = list(command)
    for flag, value in (("--host", host), ("--port", str(port))):
        if flag in out and out.index(flag) + 1 < len(out):
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


__all__ = [
    "AUTH_PROXY",
    "SECRET_TARGET",
    "describe",
    "health_test",
    "run_command",
    "volumes",
]
