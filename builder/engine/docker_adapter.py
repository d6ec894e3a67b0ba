"""The Engine interface over the docker SDK (docker-py 7), and how to reach the engine.

Connecting happens when a command needs the engine, never at import time, and the SDK itself
is imported only then (this module is imported by every command). Every SDK call runs inside
`_engine_errors`, so what a step sees is an EngineError with the daemon's own message.
"""

# long: the one module allowed to import docker: Engine and Container over the SDK
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, BinaryIO

from builder.engine import imageref
from builder.engine.address import DEFAULT as DEFAULT_ADDRESS
from builder.engine.address import is_ssh, local_socket
from builder.engine.protocol import (
    INSTALL_HINT,
    Container,
    ContainerSpec,
    EngineHost,
    Image,
    LayerEvent,
    OnLayer,
    PortBinding,
    registry_failure,
)
from builder.engine.socket_api import SocketApi
from builder.errors import EngineError, EngineNotFound, EngineUnreachable, ToolMissing

#: Engine API timeout: a push or pull of a multi-GB layer is one slow request.
API_TIMEOUT_S = 600
#: A push or pull stream silent this long has stalled (_stall_limit); the variable is the one
#: the evidence client reads for a registry's answer (image/registry_http.py).
STALL_S = 120.0
STALL_ENV = "SM120_STACKS_REGISTRY_TIMEOUT"
NANOSECONDS = 1_000_000_000
#: The status line a push ends with: "TAG: digest: sha256:... size: N".
_PUSHED_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


def connect_engine(address: str | None) -> DockerEngine:
    """The engine at address (builder.engine.address; None: the local socket), once it answered
    a ping. The caller says which: the command line reads --engine or DOCKER_HOST once
    (`address.from_environment`). An ssh:// engine is reached through this machine's ssh
    client, as the docker CLI reaches it (the user's agent and ~/.ssh/config). A local socket
    is pinged without the SDK, which is imported only when an operation needs it."""
    socket_path = local_socket(address)
    if socket_path is not None:
        try:
            SocketApi(socket_path).ping()
        except EngineError as exc:
            raise _unreachable(address, exc) from None
        return DockerEngine(
            factory=lambda: _sdk_client(address or DEFAULT_ADDRESS),
            socket_path=socket_path,
            address=address,
        )
    return DockerEngine(_sdk_client(address, ping=True), address=address)


def _sdk_client(address: str | None, ping: bool = False) -> Any:
    import docker
    import requests
    from docker.errors import DockerException

    if is_ssh(address):
        _close_ssh_quietly()
    try:
        client = docker.DockerClient(
            base_url=address or DEFAULT_ADDRESS,
            timeout=API_TIMEOUT_S,
            use_ssh_client=is_ssh(address),
            tls=_tls(address),
        )
        if ping:
            client.ping()
    except (DockerException, requests.RequestException, OSError) as exc:
        raise _unreachable(address, exc) from None
    return client


def _close_ssh_quietly() -> None:
    """Let the SDK's ssh connection close when its ssh client has already exited.

    Over ssh the SDK talks to `docker system dial-stdio` on the host through an ssh process
    (docker/transport/sshconn.py, docker-py 7.1), and closing a connection writes to that
    process's stdin. A hijacked stream (an exec's output) ends with the engine closing the
    connection, the remote dial-stdio and then ssh exit, and that write is a BrokenPipeError:
    after the output was read, so every `exec` on an ssh engine failed (click took the
    EPIPE for a closed terminal and exited 1 without a word: `deploy --apply` with a warm
    cache on a namespace host, bench/warm-fleet.sh). A client that is gone has nothing to be
    told: its pipe is closed and it is stopped, as the SDK's own close would."""
    from docker.transport import sshconn

    close = sshconn.SSHSocket.close
    if getattr(close, "sm120_quiet", False):
        return

    def quiet(self: Any) -> None:
        try:
            close(self)
        except BrokenPipeError:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # its buffer's flush fails again; the pipe is closed
            self.proc.terminate()

    quiet.sm120_quiet = True  # type: ignore[attr-defined]
    sshconn.SSHSocket.close = quiet


def _tls(address: str | None) -> Any:
    """TLS for a tcp:// engine as the docker CLI sets it up (DOCKER_TLS_VERIFY and
    DOCKER_CERT_PATH); none otherwise."""
    if not (address or "").startswith("tcp://") or not os.environ.get("DOCKER_TLS_VERIFY"):
        return False
    from docker.tls import TLSConfig

    certs = os.environ.get("DOCKER_CERT_PATH") or os.path.expanduser("~/.docker")
    return TLSConfig(
        client_cert=(os.path.join(certs, "cert.pem"), os.path.join(certs, "key.pem")),
        ca_cert=os.path.join(certs, "ca.pem"),
        verify=True,
    )


def _unreachable(where: str | None, exc: Exception) -> ToolMissing:
    at = f" at {where}" if where else ""
    return ToolMissing(
        f"cannot reach a Docker engine{at} ({exc.__class__.__name__}: {str(exc)[:200]})",
        hint=INSTALL_HINT + "; set DOCKER_HOST (or --engine) if it listens elsewhere",
    )


def split_tag(ref: str) -> tuple[str, str | None]:
    """'host:5000/repo:tag' -> ('host:5000/repo', 'tag') by the one grammar (engine/imageref.py:
    a port is not a tag); a reference with a digest, or none the grammar accepts, is handed to
    the engine whole, for it to tag or refuse."""
    try:
        parts = imageref.parse(ref)
    except ValueError:
        return ref, None
    if parts.digest is not None:
        return ref, None
    return parts.repository, parts.tag


def engine_reachable(address: str | None) -> bool:
    try:
        connect_engine(address)
    except ToolMissing:
        return False
    return True


class LayerStates:
    """Each layer's last status in a push or pull stream: a stall with layers still "Waiting"
    (queued by the engine, which moves a few layers at a time over every transfer it runs) is
    said as such, not only as a registry that stopped answering."""

    def __init__(self) -> None:
        self.last: dict[str, str] = {}

    def see(self, line: Mapping[str, Any]) -> None:
        layer, status = line.get("id"), line.get("status")
        if isinstance(layer, str) and isinstance(status, str) and layer:
            self.last[layer] = status

    def waiting(self) -> int:
        return sum(status == "Waiting" for status in self.last.values())


def parse_progress_stream(
    lines: Iterable[Mapping[str, Any]],
    progress: OnLayer | None = None,
    states: LayerStates | None = None,
) -> str:
    """Read a push or pull progress stream; the digest it names ("" if none).

    The engine answers a push or pull with success as soon as it starts, so whatever fails
    later (a refused layer, a dropped connection, an auth error from the registry) arrives only
    as a line of the stream, anywhere in it: every line is checked, and the first error line
    ends the operation as an EngineError with the registry's message. When the engine said it
    was retrying before that ("Retrying in 5 seconds"), the error says so (`retried`).
    """
    digest = ""
    retried = False
    for line in lines:
        if states is not None:
            states.see(line)
        if progress is not None:
            progress(layer_event(line))
        if "error" in line or "errorDetail" in line:
            detail = line.get("errorDetail")
            message = detail.get("message") if isinstance(detail, Mapping) else None
            raise EngineError(str(message or line.get("error") or line), retried=retried)
        retried = retried or str(line.get("status", "")).startswith("Retrying in ")
        aux = line.get("aux")
        if isinstance(aux, Mapping) and aux.get("Digest"):
            digest = str(aux["Digest"])
        if match := _PUSHED_DIGEST.search(str(line.get("status", ""))):
            digest = digest or match.group(1)
    return digest


def layer_event(line: Mapping[str, Any]) -> LayerEvent:
    """A stream line as the interface's LayerEvent (byte counts where the line has them)."""
    detail = line.get("progressDetail")
    counts = detail if isinstance(detail, Mapping) else {}
    current, total = counts.get("current"), counts.get("total")
    return LayerEvent(
        layer=str(line.get("id") or ""),
        status=str(line.get("status") or ""),
        current=current if isinstance(current, int) else None,
        total=total if isinstance(total, int) and total > 0 else None,
    )


def run_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """The SDK's `containers.run` keywords for spec (detached)."""
    from docker.types import DeviceRequest
    from docker.types import Mount as SdkMount

    kwargs: dict[str, Any] = {
        "image": spec.image,
        "detach": True,
        "environment": dict(spec.environment),
        "labels": dict(spec.labels),
    }
    optional = {
        "command": list(spec.command) if spec.command is not None else None,
        "entrypoint": list(spec.entrypoint) if spec.entrypoint is not None else None,
        "name": spec.name,
        "shm_size": spec.shm_size,
        "network_mode": spec.network_mode,
        "restart_policy": {"Name": spec.restart} if spec.restart else None,
        "user": spec.user,
    }
    kwargs |= {key: value for key, value in optional.items() if value is not None}
    if spec.ports:
        kwargs["ports"] = {f"{p.container_port}/tcp": _host_binding(p) for p in spec.ports}
    if spec.mounts:
        kwargs["mounts"] = [
            SdkMount(target=m.target, source=m.source, type=m.kind, read_only=m.read_only)
            for m in spec.mounts
        ]
    if spec.healthcheck is not None:
        check = spec.healthcheck
        kwargs["healthcheck"] = {
            "test": list(check.test),
            "interval": check.interval_s * NANOSECONDS,
            "timeout": check.timeout_s * NANOSECONDS,
            "retries": check.retries,
            "start_period": check.start_period_s * NANOSECONDS,
        }
    if spec.gpus is not None:
        every = spec.gpus == "all"
        kwargs["device_requests"] = [
            DeviceRequest(
                count=-1 if every else 0,
                device_ids=None if every else [str(i) for i in spec.gpus],
                capabilities=[["gpu"]],
            )
        ]
    return kwargs


def _host_binding(port: PortBinding) -> tuple[str] | tuple[str, int] | int | None:
    """The SDK's forms: (ip, port), (ip,) for a free port on ip, port, or None for any."""
    if port.host_ip:
        return (port.host_ip,) if port.host_port is None else (port.host_ip, port.host_port)
    return port.host_port


class DockerEngine:
    """Engine over a docker SDK client, made when first needed; with a local socket, ping,
    inspect and tag go over it directly (engine_socket.py: the whole of a no-op build)."""

    def __init__(
        self,
        client: Any = None,
        *,
        factory: Callable[[], Any] | None = None,
        socket_path: str | None = None,
        address: str | None = None,
    ) -> None:
        self._sdk = client
        self._factory = factory
        self._socket = SocketApi(socket_path) if socket_path is not None else None
        #: Where the engine listens (None: the local socket): what a client this tool starts
        #: must be pointed at, and whose host the facts below describe.
        self.address = address

    @property
    def sdk(self) -> Any:
        """The SDK client (also for tests that set up what the interface deliberately cannot)."""
        if self._sdk is None:
            if self._factory is None:
                raise EngineUnreachable("no engine client and no way to make one")
            self._sdk = self._factory()
        return self._sdk

    def ping(self) -> None:
        if self._socket is not None:
            self._socket.ping()
            return
        with _engine_errors():
            self.sdk.ping()

    def host(self) -> EngineHost:
        with _engine_errors():
            info = self.sdk.info() or {}
        return EngineHost(
            address=self.address,
            cpus=int(info.get("NCPU") or 0) or None,
            memory_bytes=int(info.get("MemTotal") or 0) or None,
            os_type=str(info.get("OSType") or "") or None,
            architecture=str(info.get("Architecture") or "") or None,
            runtimes=tuple(sorted(str(name) for name in info.get("Runtimes") or {})),
        )

    def image(self, ref: str) -> Image | None:
        if self._socket is not None:
            return self._socket.image(ref)
        try:
            with _engine_errors():
                found = self.sdk.images.get(ref)
                return Image(str(found.id), dict(found.attrs))
        except EngineNotFound:
            return None

    def tag(self, image: str, ref: str) -> None:
        repository, tag = split_tag(ref)
        if self._socket is not None:
            self._socket.tag(image, repository, tag)
            return
        with _engine_errors():
            self.sdk.api.tag(image, repository, tag=tag)

    def images(self, *, label: str) -> list[Image]:
        with _engine_errors():
            found = self.sdk.images.list(filters={"label": label})
        return [Image(str(image.id), dict(image.attrs)) for image in found]

    def remove_image(self, image_id: str) -> None:
        with _engine_errors():
            self.sdk.api.remove_image(image_id, force=False, noprune=False)

    def untag(self, ref: str) -> None:
        with _engine_errors():
            # noprune: untagging never deletes the image's untagged parent layers.
            self.sdk.api.remove_image(ref, noprune=True)

    def push(self, repository: str, tag: str, progress: OnLayer | None = None) -> str:
        states = LayerStates()
        with _engine_errors(), _stall_limit(self.sdk.api, "push", states):
            return parse_progress_stream(
                self.sdk.api.push(repository, tag=tag, stream=True, decode=True), progress, states
            )

    def pull(self, repository: str, tag: str, progress: OnLayer | None = None) -> None:
        states = LayerStates()
        with _engine_errors(), _stall_limit(self.sdk.api, "pull", states):
            parse_progress_stream(
                self.sdk.api.pull(repository, tag=tag, stream=True, decode=True), progress, states
            )

    def registry_digest(self, ref: str) -> str:
        try:
            with _engine_errors():
                answer = self.sdk.api.inspect_distribution(ref)
        except EngineError as exc:
            raise registry_failure(exc) from exc
        return str(answer["Descriptor"]["digest"])

    def run(self, spec: ContainerSpec) -> Container:
        with _engine_errors():
            return DockerContainer(self.sdk.containers.run(**run_kwargs(spec)))

    def container(self, name: str) -> Container | None:
        try:
            with _engine_errors():
                return DockerContainer(self.sdk.containers.get(name))
        except EngineNotFound:
            return None

    def containers(self, *, label: str | None = None, volume: str | None = None) -> list[Container]:
        filters = {"label": label} if label is not None else {}
        if volume is not None:
            filters["volume"] = volume
        with _engine_errors():
            # ignore_removed: one removed between the listing and its inspect (a run's own,
            # or another run's reaper at work) is not an error, it is simply not there.
            found = self.sdk.containers.list(all=True, filters=filters, ignore_removed=True)
        return [DockerContainer(c) for c in found]


class DockerContainer:
    """Container over an SDK container object."""

    def __init__(self, container: Any) -> None:
        self._container = container

    @property
    def id(self) -> str:
        return str(self._container.id)

    @property
    def name(self) -> str:
        return str(self._container.name)

    @property
    def short_id(self) -> str:
        return str(self._container.short_id)

    @property
    def attrs(self) -> dict[str, Any]:
        return dict(self._container.attrs)

    def reload(self) -> None:
        with _engine_errors():
            self._container.reload()

    def logs(self, *, stdout: bool = True, stderr: bool = True) -> bytes:
        with _engine_errors():
            return bytes(self._container.logs(stdout=stdout, stderr=stderr))

    def wait(self, timeout: float) -> int:
        with _engine_errors():
            answer = self._container.wait(timeout=timeout)
        return int(answer.get("StatusCode", -1))

    def remove(self, *, force: bool = False) -> None:
        with _engine_errors():
            self._container.remove(force=force)

    def exec(self, argv: list[str]) -> tuple[int, str]:
        with _engine_errors():
            code, output = self._container.exec_run(argv, demux=False)
        return int(code), bytes(output or b"").decode("utf-8", errors="replace")

    def read_archive(self, path: str) -> Iterator[bytes]:
        with _engine_errors():
            stream, _ = self._container.get_archive(path, chunk_size=1 << 20)
        with _engine_errors():
            yield from stream

    def write_archive(self, path: str, data: BinaryIO) -> None:
        with _engine_errors():
            if not self._container.put_archive(path, data):
                raise EngineError(f"the engine did not unpack the archive into {path}")

    def memory_bytes(self) -> int | None:
        with _engine_errors():
            stats = self.sdk_stats()
        return memory_in_use(stats.get("memory_stats") or {})

    def sdk_stats(self) -> dict[str, Any]:
        """One sample of the engine's stats (one_shot: without waiting for a second one)."""
        return dict(self._container.stats(stream=False, one_shot=True) or {})


def memory_in_use(memory: Mapping[str, Any]) -> int | None:
    """Usage less the inactive page cache, as the docker CLI counts it: `total_inactive_file`
    under cgroup v1, `inactive_file` under v2. None without a usage (a stopped container)."""
    usage = memory.get("usage")
    if not isinstance(usage, int):
        return None
    stats = memory.get("stats") or {}
    cache = stats.get("total_inactive_file", stats.get("inactive_file", 0))
    return usage - cache if isinstance(cache, int) and cache < usage else usage


@contextmanager
def _engine_errors() -> Iterator[None]:
    """SDK and transport exceptions as EngineError, with the daemon's message alone."""
    import requests
    import urllib3
    from docker.errors import APIError, DockerException, NotFound

    try:
        yield
    except NotFound as exc:
        raise EngineNotFound(_explanation(exc), status_code=404) from exc
    except APIError as exc:
        raise EngineError(_explanation(exc), status_code=exc.status_code) from exc
    except requests.exceptions.ConnectionError as exc:
        raise EngineUnreachable(f"the engine's API dropped the connection: {exc}") from exc
    except (urllib3.exceptions.ProtocolError, requests.exceptions.ChunkedEncodingError) as exc:
        # A streamed answer (push, pull, logs) cut off: the engine stopped or restarted under it.
        raise EngineUnreachable(
            f"the engine's API dropped the connection mid-stream: {exc}"
        ) from exc
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise EngineError(f"{exc.__class__.__name__}: {exc}") from exc


@contextlib.contextmanager
def _stall_limit(api: Any, action: str, states: LayerStates | None = None) -> Iterator[None]:
    """A push or pull whose stream goes quiet for STALL seconds ends, instead of waiting the
    API's 600 s per read: the engine reports every few hundred kB moved, so silence means the
    registry stopped answering (frozen, or a half-open connection). Closing our end makes the
    engine cancel the transfer. An error marked `retried`: asking again waits as long."""
    import requests
    import urllib3

    stall = _stall_seconds()
    kept, api.timeout = api.timeout, stall
    try:
        yield
    except (requests.exceptions.ConnectionError, urllib3.exceptions.ReadTimeoutError) as exc:
        if "timed out" not in str(exc).lower():
            raise
        waiting = states.waiting() if states is not None else 0
        why = (
            f"{waiting} layer(s) still waiting their turn: the engine moves a few layers at a "
            "time over every push and pull it runs, so other transfers on it held them, or the "
            "registry stopped answering"
            if waiting
            else "the registry stopped answering"
        )
        raise EngineError(
            f"the {action} stalled: the engine reported no progress for {stall:g} s ({why}; "
            f"{STALL_ENV} sets how long to wait)",
            retried=True,
        ) from exc
    finally:
        api.timeout = kept


def _stall_seconds() -> float:
    """SM120_STACKS_REGISTRY_TIMEOUT (the evidence client's too), read at the call; a value
    that is no positive number leaves the default (the evidence client refuses it first)."""
    try:
        value = float(os.environ.get(STALL_ENV, ""))
    except ValueError:
        return STALL_S
    return value if value > 0 else STALL_S


def _explanation(exc: Any) -> str:
    return str(exc.explanation or exc)
