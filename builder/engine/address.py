"""Where a Docker engine listens: the addresses DOCKER_HOST takes, checked before use.

One address reaches the same engine through both of the tool's paths to it: the docker SDK
(every engine operation: inspect, tag, push, pull, run) and the build client it starts for
BuildKit (which is given DOCKER_HOST in its environment). `--engine ADDRESS` (else DOCKER_HOST,
else the local socket) is read once by the command line and handed to both explicitly, never
written into this process's environment; a pin's `engine` names the address of its host.

- `unix:///PATH`: an engine's socket on this machine (the default, /var/run/docker.sock).
- `ssh://[USER@]HOST[:PORT]`: an engine on another machine. Both paths run this machine's `ssh`
  client (`ssh ... HOST docker system dial-stdio`), so keys come from the user's agent and
  ~/.ssh/config, and nothing is stored by this tool; the remote user must be allowed to use its
  engine and have the docker client installed.
- `tcp://HOST:PORT`: an engine's TCP socket (TLS from DOCKER_TLS_VERIFY/DOCKER_CERT_PATH when
  DOCKER_HOST names it; plain otherwise: only on a network you trust).
"""

from __future__ import annotations

import os
import re

from builder.errors import StackError

ENV = "DOCKER_HOST"
#: The local engine's socket, and its address: the engine meant wherever an address is None.
DEFAULT_SOCKET = "/var/run/docker.sock"
DEFAULT = f"unix://{DEFAULT_SOCKET}"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]"
ADDRESS = re.compile(
    r"^(?:unix://(?P<path>/[A-Za-z0-9_./+-]+)"
    rf"|ssh://(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]{{0,31}})@)?(?P<ssh_host>{_HOST})(?::(?P<ssh_port>\d{{1,5}}))?"
    rf"|tcp://(?P<tcp_host>{_HOST}):(?P<tcp_port>\d{{1,5}}))$"
)
#: What a pin file accepts as `engine` (the same forms, for its schema).
ADDRESS_PATTERN = ADDRESS.pattern
HINT = "unix:///PATH, ssh://[USER@]HOST[:PORT] or tcp://HOST:PORT"


def check_address(text: str, key: str = "--engine") -> str:
    """The address if it is one of the forms above; a StackError naming key otherwise."""
    if ADDRESS.match(text) is None:
        raise StackError(f"{text!r} is not an engine address", key=key, hint=f"write {HINT}")
    return text


def from_environment() -> str | None:
    """DOCKER_HOST, checked, as the default of a command given no --engine; None: the local
    socket. Read when a command starts, never at import."""
    value = os.environ.get(ENV) or None
    return None if value is None else check_address(value, key=ENV)


def client_env(address: str | None) -> dict[str, str]:
    """What a client this tool starts (the build client) needs to reach the same engine."""
    return {ENV: address} if address else {}


def local_socket(address: str | None) -> str | None:
    """The path of the unix socket an engine on this machine listens on (None: the default);
    None for an engine elsewhere (ssh://, tcp://) or an address of no known form."""
    if address is None:
        return DEFAULT_SOCKET
    return address.removeprefix("unix://") if address.startswith("unix://") else None


def is_local(address: str | None) -> bool:
    """Whether the engine runs on this machine (a unix socket here): its host's devices,
    files and processes are this machine's."""
    return local_socket(address) is not None


def is_ssh(address: str | None) -> bool:
    return bool(address) and str(address).startswith("ssh://")


def ssh_destination(address: str) -> tuple[str, str | None]:
    """`[USER@]HOST` and the port (None: ssh's default) of an ssh:// address."""
    match = ADDRESS.match(address)
    if match is None or match.group("ssh_host") is None:
        raise ValueError(f"not an ssh:// engine address: {address!r}")
    user = match.group("user")
    host = match.group("ssh_host")
    return (f"{user}@{host}" if user else host), match.group("ssh_port")


def host_of(address: str | None) -> str:
    """The machine an engine's published ports are reached on from here: the ssh or tcp host,
    this machine's loopback for a local socket."""
    if not address:
        return "127.0.0.1"
    match = ADDRESS.match(address)
    if match is None:
        raise ValueError(f"not an engine address: {address!r}")
    host = match.group("ssh_host") or match.group("tcp_host")
    return host.strip("[]") if host else "127.0.0.1"
