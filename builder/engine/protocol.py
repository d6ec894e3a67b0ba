"""The container engine as the pipeline uses it: a typed interface, not an SDK client.

Every step that talks to the engine (lock, build, push and pull, test, deploy, drift, doctor)
is written against `Engine`, which names the few operations the tool really performs. The docker
SDK stays behind one adapter (docker_engine.py), so its untyped objects and its exception
classes reach no step, and tests can hand a step a small fake instead of a daemon.
Whatever the SDK raised arrives as an EngineError carrying the engine's own words.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal, Protocol

from builder.engine.address import is_local
from builder.errors import EngineError, EngineNotFound, EngineUnreachable, RegistryUnreachable

INSTALL_HINT = (
    "install a Docker engine with BuildKit: on Debian `apt-get install docker.io` (12) or "
    "`apt-get install docker.io docker-buildx` (13+), then start dockerd"
)


#: How dockerd words a registry it could not reach at all (Go's network and TLS errors, which it
#: relays inside a 500). Only these are RegistryUnreachable; a refusal (authentication, a
#: registry speaking HTTP) stays an EngineError, an unknown image or tag is EngineNotFound.
UNREACHABLE = (
    "dial tcp",
    "no such host",
    "connection refused",
    "i/o timeout",
    "tls handshake timeout",
    "network is unreachable",
    "no route to host",
    "connection reset by peer",
    "client.timeout exceeded",
)


def registry_failure(error: EngineError) -> EngineError:
    """What a failed registry operation relayed by the engine really was, by type: the
    adapter's words classified once, so callers catch types instead of matching text."""
    if isinstance(error, EngineNotFound | EngineUnreachable):
        return error
    reason = " ".join(error.explanation.split()).lower()
    status = error.status_code
    client_error = isinstance(status, int) and 400 <= status < 500
    if not client_error and any(words in reason for words in UNREACHABLE):
        return RegistryUnreachable(error.explanation, status_code=status, retried=error.retried)
    if "manifest unknown" in reason or "not found" in reason:
        return EngineNotFound(error.explanation, status_code=status, retried=error.retried)
    return error


@dataclass(frozen=True)
class Image:
    """An image as the engine inspects it; `attrs` is the whole `docker image inspect`."""

    id: str
    attrs: dict[str, Any]

    @property
    def labels(self) -> dict[str, str]:
        return dict((self.attrs.get("Config") or {}).get("Labels") or {})

    @property
    def repo_digests(self) -> list[str]:
        """repo@sha256 of each registry the image was pushed to or pulled from."""
        return [str(entry) for entry in self.attrs.get("RepoDigests") or []]


class Container(Protocol):
    """A container the engine created; `attrs` is its `docker inspect` as of the last reload."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def short_id(self) -> str: ...

    @property
    def attrs(self) -> dict[str, Any]: ...

    def reload(self) -> None: ...

    def logs(self, *, stdout: bool = True, stderr: bool = True) -> bytes: ...

    def wait(self, timeout: float) -> int:
        """Block until the container exits; its exit status."""
        ...

    def memory_bytes(self) -> int | None:
        """Memory in use now, as `docker stats` counts it (inactive page cache left out);
        None when the engine cannot say (the container stopped, no memory controller)."""
        ...

    def remove(self, *, force: bool = False) -> None: ...

    def exec(self, argv: list[str]) -> tuple[int, str]:
        """Run argv in the running container: (exit status, stdout and stderr)."""
        ...

    def read_archive(self, path: str) -> Iterator[bytes]:
        """A tar stream of path in the container (its volumes included), `docker cp` out."""
        ...

    def write_archive(self, path: str, data: BinaryIO) -> None:
        """Unpack a tar stream into path, an existing folder in the container (`docker cp`)."""
        ...


@dataclass(frozen=True)
class Mount:
    """The one mount type: what `--volume` parses (engine/mounts.py), what a pin holds
    (hosts/pins.py, its YAML fields are these three) and what every rendering of a pin reads
    (hosts/container.py). `kind` is the one place that says which mounts are binds, so compose,
    the unit, the SDK, Kubernetes and drift cannot disagree (tests/test_mount_rule.py)."""

    #: An absolute host path is bind-mounted; anything else names a volume.
    source: str
    target: str
    read_only: bool = False

    @property
    def kind(self) -> Literal["bind", "volume"]:
        return "bind" if self.source.startswith("/") else "volume"

    @property
    def bind(self) -> bool:
        return self.kind == "bind"


@dataclass(frozen=True)
class PortBinding:
    container_port: int
    #: None: every address of the host.
    host_ip: str | None = None
    #: None: a free port the engine picks (read back from the container's attrs).
    host_port: int | None = None


@dataclass(frozen=True)
class HealthCheck:
    #: Exec form, starting with "CMD".
    test: tuple[str, ...]
    interval_s: int
    timeout_s: int
    retries: int
    start_period_s: int


@dataclass(frozen=True)
class ContainerSpec:
    """A container to start (detached), in the tool's terms rather than the SDK's keywords."""

    image: str
    #: None keeps the image's CMD / ENTRYPOINT.
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    name: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    shm_size: str | None = None
    ports: tuple[PortBinding, ...] = ()
    mounts: tuple[Mount, ...] = ()
    #: None: no GPU; "all"; or these device indices.
    gpus: Literal["all"] | tuple[int, ...] | None = None
    #: Restart policy name (always, unless-stopped, on-failure); None: never restarted.
    restart: str | None = None
    healthcheck: HealthCheck | None = None
    network_mode: str | None = None
    #: UID[:GID] the process runs as; None: the image's user.
    user: str | None = None


@dataclass(frozen=True)
class LayerEvent:
    """One line of a push or pull as it streams in: which layer, what the engine says it is
    doing with it ("Pushing", "Downloading", "Pull complete", ...) and, while bytes move, how
    many of how many. Lines about the whole image have no layer."""

    layer: str
    status: str
    current: int | None = None
    total: int | None = None


#: Called with each LayerEvent of a push or pull (builder.engine.progress.LayerProgress).
OnLayer = Callable[[LayerEvent], None]


@dataclass(frozen=True)
class EngineHost:
    """The machine an engine runs on, as the engine itself says (`docker info`): what sizes a
    build there (`max_jobs: auto`) and gives its containers GPUs, which need not be this one."""

    #: Where the engine listens; None: this machine's local socket.
    address: str | None
    cpus: int | None
    memory_bytes: int | None
    os_type: str | None
    architecture: str | None
    runtimes: tuple[str, ...] = ()

    @property
    def local(self) -> bool:
        """Whether the engine runs on this machine (a unix socket here)."""
        return is_local(self.address)


class Engine(Protocol):
    """The operations the tool performs on a container engine, and no others."""

    #: Where the engine listens (None: the local socket).
    address: str | None

    def ping(self) -> None: ...

    def host(self) -> EngineHost:
        """The engine's machine: CPUs, memory, OS and architecture, runtimes."""
        ...

    def image(self, ref: str) -> Image | None:
        """The local image under ref (a name, repo@digest or an image ID); None if absent."""
        ...

    def tag(self, image: str, ref: str) -> None:
        """Point ref (repository[:tag]) at image (an ID or a reference)."""
        ...

    def images(self, *, label: str) -> list[Image]:
        """Every image with this label (`key` or `key=value`)."""
        ...

    def remove_image(self, image_id: str) -> None:
        """Delete the image with all its names; the engine refuses (EngineError) while a
        container uses it."""
        ...

    def untag(self, ref: str) -> None:
        """Remove the name ref (repository:tag) from its image, which stays while another name
        holds it (a failed push's registry tag: builder.image.registry.push)."""
        ...

    def push(self, repository: str, tag: str, progress: OnLayer | None = None) -> str:
        """Push repository:tag; the pushed manifest's digest ("" if the engine named none).
        progress: told each layer event as it streams in."""
        ...

    def pull(self, repository: str, tag: str, progress: OnLayer | None = None) -> None:
        """Pull repository:tag (a tag or a sha256 digest) from its registry."""
        ...

    def registry_digest(self, ref: str) -> str:
        """The registry's manifest digest for ref, without pulling it (EngineNotFound if none)."""
        ...

    def run(self, spec: ContainerSpec) -> Container: ...

    def container(self, name: str) -> Container | None: ...

    def containers(self, *, label: str | None = None, volume: str | None = None) -> list[Container]:
        """Every container, running or not, with this label (`key` or `key=value`) and/or
        mounting this volume."""
        ...


def nvidia_runtimes(engine: Engine) -> list[str]:
    """The engine's registered NVIDIA runtimes (`nvidia`, and `nvidia-cdi` and the like that
    `nvidia-ctk runtime configure` adds). An engine that cannot answer raises EngineError: not
    knowing is not the same as having none, and is reported as what went wrong."""
    return sorted(name for name in engine.host().runtimes if "nvidia" in name)
