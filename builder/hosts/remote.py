"""Reaching a pinned host: its engine (the pin's `engine` address), its server URL, and its
prerequisites (nvidia-smi run there, over ssh, for an ssh:// host).

A pin without `engine` means the engine this command would use anyway (DOCKER_HOST, else the
local socket): `deploy HOST` on the serving host itself, as before pins named engines. ssh://
hosts are reached with this machine's ssh client, so keys come from the user's agent and
~/.ssh/config; this tool stores none.
"""

from __future__ import annotations

from builder.engine import address
from builder.engine.docker_adapter import connect_engine
from builder.engine.hostprobe import Probe, probe_for
from builder.engine.protocol import Engine
from builder.errors import StackError, ToolMissing
from builder.hosts.pins import Pin, port_parts

#: Addresses a published port may be bound to that are not reachable from another machine.
LOOPBACK = ("127.", "::1", "localhost")


def engine_address(pin: Pin, default: str | None = None) -> str | None:
    """The pin's engine, else the command's (--engine), else DOCKER_HOST; None: the local
    socket."""
    return pin.engine or default or address.from_environment()


def describe(pin: Pin, default: str | None = None) -> str:
    return engine_address(pin, default) or address.DEFAULT


def connect(pin: Pin, default: str | None = None) -> Engine:
    """The pin's engine (ToolMissing, naming it, when it does not answer)."""
    return connect_engine(engine_address(pin, default))


def try_connect(pin: Pin, default: str | None = None) -> tuple[Engine | None, str | None]:
    """The pin's engine, or None and why it could not be reached."""
    try:
        return connect(pin, default), None
    except ToolMissing as exc:
        return None, exc.message


def server_url(pin: Pin, default: str | None = None) -> str:
    """Where the pinned server answers from this machine: the host port published for the
    serve port, on the address it is bound to, else on the engine's host. A StackError when
    the pin publishes no such port, or only on a remote host's loopback."""
    chosen = [
        (ip, host) for ip, host, inside in map(port_parts, pin.ports) if inside == pin.serve_port
    ]
    if not chosen:
        raise StackError(
            f"the pin of {pin.host} publishes no host port for its serve port {pin.serve_port}",
            key="ports",
            hint=f"pin it again with --port HOST_PORT:{pin.serve_port}",
        )
    ip, port = chosen[0]
    where = engine_address(pin, default)
    remote = where is not None and not where.startswith("unix:")
    if ip and ip != "0.0.0.0":
        if remote and ip.startswith(LOOPBACK):
            raise StackError(
                f"the pin of {pin.host} publishes its serve port on {ip} only: unreachable "
                "from this machine",
                key="ports",
                hint=f"pin it again with --port {port}:{pin.serve_port} (every address) or "
                f"--port ADDRESS:{port}:{pin.serve_port}, and --api-key-file FILE",
            )
        host = ip
    else:
        host = address.host_of(where)
    return f"http://{_bracket(host)}:{port}"


def probe(pin: Pin, default: str | None = None) -> Probe:
    """How the host's prerequisites are read: here, or over ssh for an ssh:// engine."""
    return probe_for(engine_address(pin, default))


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
