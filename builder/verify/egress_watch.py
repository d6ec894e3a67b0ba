"""The egress watch inside a smoke's server: mounted as `sitecustomize.py` on PYTHONPATH, so
every Python process of the container (the server, its engine core, its workers, anything they
spawn with the same environment) loads it at interpreter start, before the server's own code.

It adds an audit hook (PEP 578) that sees every socket connect, datagram send and name lookup
made through Python's socket module (requests, urllib3, httpx, aiohttp, asyncio and
huggingface_hub all go through it) and appends one JSON line per attempt to a destination that
is not the container itself to the file named by SM120_EGRESS_LOG, with the module that asked.
Each process also writes one "watching" line when it starts, so a watch that never loaded (a
server started with `python -I`, `-E`, `-S`, or with PYTHONPATH replaced) reads as that, not
as "no egress". builder/verify/egress.py judges the file.

What it cannot see: connections a C or C++ library makes by itself (ZMQ, NCCL, gloo's TCP
store, libcurl), a server that is not Python, and what a `.pth` line of an installed
package does (Python's `site` runs those just before it imports sitecustomize). It imports
nothing outside the standard library: it runs inside the image's interpreter, where the tool
is not installed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from types import FrameType
from typing import Any

LOG_ENV = "SM120_EGRESS_LOG"
#: Audit events of an attempt to reach another host (the socket module's own names).
CONNECTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})
LOOKUPS = frozenset({"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"})
#: Top-level packages that carry a request rather than make one: the caller named is the first
#: frame outside them (vllm.utils.flashinfer, not urllib3.connection).
PLUMBING = frozenset(
    {
        "socket",
        "ssl",
        "selectors",
        "asyncio",
        "urllib",
        "urllib3",
        "requests",
        "http",
        "httpx",
        "httpcore",
        "anyio",
        "aiohttp",
        "aiohappyeyeballs",
        "h11",
        "h2",
        "concurrent",
        "threading",
        "socks",
        "builder",
        "sitecustomize",
    }
)
LOCAL_NAMES = frozenset({"", "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
STACK_DEPTH = 8


def _is_local(host: object) -> bool:
    """Loopback, the unspecified address (a bind), or a name that means this machine."""
    if host is None:
        return True
    text = host.decode(errors="replace") if isinstance(host, bytes) else str(host)
    text = text.strip("[]").lower().split("%")[0]
    if text in LOCAL_NAMES or text.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def _is_numeric(host: object) -> bool:
    try:
        ipaddress.ip_address(str(host).strip("[]").split("%")[0])
    except ValueError:
        return False
    return True


def _callers(frame: FrameType | None) -> tuple[str, list[str]]:
    """The first module outside the networking plumbing (module:line), and the modules of the
    stack, innermost first."""
    modules: list[str] = []
    caller = ""
    while frame is not None and len(modules) < 64:
        name = str(frame.f_globals.get("__name__", "?"))
        if not modules or modules[-1] != name:
            modules.append(name)
        if not caller and name.split(".")[0] not in PLUMBING:
            caller = f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return caller or (modules[-1] if modules else "?"), modules[:STACK_DEPTH]


def _protocol(sock: Any) -> str:
    kind = getattr(sock, "type", None)
    if kind == socket.SOCK_STREAM:
        return "tcp"
    if kind == socket.SOCK_DGRAM:
        return "udp"
    return str(kind)


class _Watch:
    def __init__(self, path: str) -> None:
        self.path = path
        self.process = " ".join(sys.argv)[:200] if sys.argv else sys.executable

    def write(self, record: dict[str, Any]) -> None:
        record.update(pid=os.getpid(), process=self.process)
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in CONNECTS and event not in LOOKUPS:
            return
        try:
            record = self._record(event, args)
            if record is not None:
                record["caller"], record["modules"] = _callers(sys._getframe(1))
                self.write(record)
        except Exception:  # the watch must never change what the server does
            return

    def _record(self, event: str, args: tuple[Any, ...]) -> dict[str, Any] | None:
        if event in LOOKUPS:
            host = args[0]
            if _is_local(host) or _is_numeric(host):
                return None  # a numeric address is no query; its connect is the attempt
            return {"event": "lookup", "to": str(host), "proto": "dns", "via": event}
        sock, address = args[0], args[-1]
        if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
            return None  # a Unix socket or netlink: not the network
        if not isinstance(address, tuple) or not address or _is_local(address[0]):
            return None
        port = address[1] if len(address) > 1 else "?"
        kind = "connect" if event == "socket.connect" else "send"
        return {"event": kind, "to": f"{address[0]}:{port}", "proto": _protocol(sock), "via": event}


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this file shadows (the image's own, if it has one)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def install() -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            watch = _Watch(path)
            watch.write({"event": "watching", "python": sys.version.split()[0]})
            sys.addaudithook(watch.hook)
        except Exception as exc:  # a broken watch reads as "never loaded"
            sys.stderr.write(f"sm120-stacks egress watch not installed: {exc}\n")
    _chain_next_sitecustomize()


if __name__ == "sitecustomize":
    install()
