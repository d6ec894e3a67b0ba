"""The pin's schema: what hosts/HOST.yaml holds (Pin, its health check and host needs), the
labels a pinned container carries, and what a pin's published ports say (`port_parts`, and
`exposure_findings`: a serve port open beyond loopback without a key).

A pin is self-contained: deploy, drift and doctor read only the pin (the stack's requirements
on the host are copied into it), so a serving host needs no stacks/ checkout. Reading and
writing the files is builder/hosts/pins.py; making a pin from a tested image is
builder/hosts/pin_making.py.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints, field_validator

from builder.engine import imageref
from builder.engine.address import ADDRESS_PATTERN
from builder.engine.mounts import checked
from builder.engine.protocol import Mount
from builder.errors import StackError
from builder.evidence.trust import POLICY_FILE
from builder.hosts.hostcheck import Requirements
from builder.knowledge.strict import Strict
from builder.knowledge.text import Identifier, SafeText, ServeArg, Sha256, Slug
from builder.manifest.model import ExactVersion

#: 2: serve_port recorded, needs.targets maps each GPU target to its capability. Pins of schema 1
#: (earlier versions of this tool) are still read: see pins.py's _from_schema_1.
PIN_SCHEMA = 2
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
HOST_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
HostName = Annotated[str, StringConstraints(pattern=HOST_NAME.pattern, max_length=253)]
DigestRef = Annotated[str, StringConstraints(pattern=imageref.PINNED)]
#: [IP:]HOST_PORT:CONTAINER_PORT
PortMap = Annotated[
    str,
    StringConstraints(pattern=r"^((\d{1,3}\.){3}\d{1,3}:)?\d{1,5}:\d{1,5}$"),
]
ShmSize = Annotated[str, StringConstraints(pattern=r"^[0-9]+[kmg]?$")]
Capability = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$")]
EngineAddress = Annotated[str, StringConstraints(pattern=ADDRESS_PATTERN, max_length=300)]

#: A pin's mount: the one Mount (YAML fields source, target, read_only), shape-checked as
#: `--volume` checks it (engine/mounts.py).
PinMount = Annotated[Mount, AfterValidator(checked)]


class Health(Strict):
    #: GET this path on the serve port; any 2xx is healthy.
    path: Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9_./-]*$")] = "/health"
    interval_s: int = Field(default=30, ge=1)
    timeout_s: int = Field(default=10, ge=1)
    retries: int = Field(default=3, ge=1)
    #: How long the model may take to load before failures count (the smoke health timeout).
    start_period_s: int = Field(default=900, ge=0)


class HostNeeds(Strict):
    cuda: ExactVersion
    min_driver: ExactVersion | None
    #: Each GPU target of the stack (sm120, ...) with its compute capability (12.0, ...).
    targets: dict[Slug, Capability]

    def requirements(self) -> Requirements:
        return Requirements(self.min_driver, dict(self.targets))


class Pin(Strict):
    schema_version: Literal[2]
    host: HostName
    stack: Slug
    content_hash: Sha256
    #: The pushed image, by digest: the only reference deploy uses.
    image: DigestRef
    pinned_at: str
    container: Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")]
    command: list[ServeArg] = Field(min_length=1)
    #: The port the server listens on in the container (the manifest's serve.port): what the
    #: health check asks.
    serve_port: int = Field(ge=1, le=65535)
    env: dict[Identifier, SafeText] = Field(default_factory=dict)
    #: "all", "none", or GPU indices.
    gpus: Literal["all", "none"] | list[Annotated[int, Field(ge=0, le=255)]]
    ports: list[PortMap] = Field(default_factory=list)
    volumes: list[PinMount] = Field(default_factory=list)
    shm_size: ShmSize
    restart: Literal["always", "unless-stopped", "on-failure"] = "unless-stopped"
    #: The GPU kind whose served verdict the pin relies on ("cpu" for a CPU stack); None: the
    #: image never served on this host's kind and the pin was made with --allow-unserved.
    served_on: Annotated[str, StringConstraints(max_length=200)] | None = None
    #: Pinned with --allow-unserved: `drift` shows it as a finding.
    allow_unserved: bool = False
    #: Pinned with --allow-unsigned (evidence the trust policy would refuse): `drift` shows
    #: it as a drift named `unsigned`.
    allow_unsigned: bool = False
    #: The key ids the registry evidence it rests on was signed with (issue 35): a key taken
    #: out of the trust policy makes `drift` report the pin as `revoked`.
    evidence_keys: list[Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]] = Field(
        default_factory=list
    )
    #: A file on the host holding the server's API key (never the key itself): mounted
    #: read-only into the container, read by vLLM (VLLM_API_KEY) or the in-image key gate
    #: (hosts/container.py). Needed to publish the serve port beyond loopback.
    api_key_file: Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9_./-]+$")] | None = None
    #: Published beyond loopback without a key, as asked (--no-auth): `drift` shows it.
    no_auth: bool = False
    #: UID[:GID] the server runs as (--user); None: the image's own (root: the images' caches
    #: and the named cache volume are root's).
    user: Annotated[str, StringConstraints(pattern=r"^[0-9]{1,10}(:[0-9]{1,10})?$")] | None = None
    health: Health
    needs: HostNeeds
    #: The host's Docker engine (builder.engine.address): ssh://USER@HOST for a remote host,
    #: reached with the user's ssh agent; absent: the engine of the machine deploy runs on.
    engine: EngineAddress | None = None

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, value: object) -> object:
        if isinstance(value, list) and (not value or len(set(value)) != len(value)):
            raise ValueError("list distinct GPU indices, or write all / none")
        return value

    @property
    def gpu_indices(self) -> list[int] | None:
        """Indices the container gets; None for all GPUs, [] for none."""
        if self.gpus == "all":
            return None
        return [] if self.gpus == "none" else list(self.gpus)


#: Names whose pin, HOSTS_DIR/NAME.yaml, would be another file of the hosts folder.
RESERVED_HOSTS = {POLICY_FILE.removesuffix(".yaml"): f"{POLICY_FILE}, the hosts' trust policy"}


def check_host_name(host: str) -> str:
    if not HOST_NAME.match(host) or len(host) > 253:
        raise StackError(
            f"{host!r} is not a host name",
            key="HOST",
            hint="lower-case letters, digits, '-' and '.', as in gpu-node-07",
        )
    if host in RESERVED_HOSTS:
        raise StackError(
            f"{host!r} cannot be a host name here: its pin would be {RESERVED_HOSTS[host]}",
            key="HOST",
            hint=f"name the host otherwise, as in {host}-01 or gpu-{host}",
        )
    return host


def exposure_findings(pin: Pin) -> list[str]:
    """Why the pin's server answers more than it should: a port published beyond this host's
    loopback with no API key (allowed only by --no-auth, and then still a finding)."""
    wide = [m for m in pin.ports if port_parts(m)[2] == pin.serve_port and not _loopback(m)]
    if wide and pin.api_key_file is None:
        return [f"{', '.join(wide)} publishes the serve port beyond loopback with no API key"]
    return []


def _loopback(mapping: str) -> bool:
    ip = port_parts(mapping)[0]
    return bool(ip) and ip.startswith("127.")


#: Labels every deployed container carries: who pinned it and from which pin.
LABEL_HOST = "sm120-stacks.host"
LABEL_STACK = "sm120-stacks.stack"
LABEL_CONTENT = "sm120-stacks.pinned-content-hash"


def labels(pin: Pin) -> dict[str, str]:
    return {LABEL_HOST: pin.host, LABEL_STACK: pin.stack, LABEL_CONTENT: pin.content_hash}


def port_parts(mapping: str) -> tuple[str, int, int]:
    """'[IP:]HOST:CONTAINER' -> (ip, host port, container port); ip '' means every address."""
    parts = mapping.split(":")
    ip = parts[0] if len(parts) == 3 else ""
    return ip, int(parts[-2]), int(parts[-1])
