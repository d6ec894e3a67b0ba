"""Host pins: hosts/HOST.yaml says which tested image a serving host runs, and how.

A pin is a plain YAML file meant for git, one per host, so pins of different hosts never
conflict. It is self-contained: deploy, verify and doctor read only the pin (the stack's
requirements on the host are copied into it), so a serving host needs no stacks/ checkout.
Only an image whose tests passed and that was pushed can be pinned (builder.image.records).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from builder.errors import StackError
from builder.files import write_atomic
from builder.hosts.hostcheck import Requirements, requirements_for
from builder.image.names import local_ref
from builder.image.records import Record
from builder.spec.knowledge import parse_document
from builder.spec.manifest import ExactVersion, Identifier, SafeText, ServeArg, Sha256, Slug
from builder.spec.resolve import ResolvedStack
from builder.spec.serve import serve_argv
from builder.spec.yamlsafe import load_yaml

PIN_SCHEMA = 1
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
HOST_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
DEFAULT_MODELS = "/var/lib/sm120-stacks/models"
MODELS_TARGET = "/models"
HEADER = (
    "# Pinned by `sm120-stacks pin {host} {stack}`. Deploy with `sm120-stacks deploy {host}`,\n"
    "# check the host with `sm120-stacks verify {host}`. Commit this file.\n"
)

HostName = Annotated[str, StringConstraints(pattern=HOST_NAME.pattern, max_length=253)]
DigestRef = Annotated[
    str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._:/-]*@sha256:[0-9a-f]{64}$")
]
AbsPath = Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9_./+-]*$", max_length=1000)]
VolumeName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
#: [IP:]HOST_PORT:CONTAINER_PORT
PortMap = Annotated[
    str,
    StringConstraints(pattern=r"^((\d{1,3}\.){3}\d{1,3}:)?\d{1,5}:\d{1,5}$"),
]
ShmSize = Annotated[str, StringConstraints(pattern=r"^[0-9]+[kmg]?$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Volume(_Strict):
    #: An absolute host path (bind mount) or a named volume.
    source: AbsPath | VolumeName
    target: AbsPath
    read_only: bool = False


class Health(_Strict):
    #: GET this path on the serve port; any 2xx is healthy.
    path: Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9_./-]*$")] = "/health"
    interval_s: int = Field(default=30, ge=1)
    timeout_s: int = Field(default=10, ge=1)
    retries: int = Field(default=3, ge=1)
    #: How long the model may take to load before failures count (the smoke health timeout).
    start_period_s: int = Field(default=900, ge=0)


class HostNeeds(_Strict):
    cuda: ExactVersion
    min_driver: ExactVersion | None
    #: GPU targets of the stack (sm120, ...) and their compute capabilities (12.0, ...).
    gpu_targets: list[str]
    compute_capabilities: list[str]

    def requirements(self) -> Requirements:
        return Requirements(
            self.min_driver, tuple(self.compute_capabilities), tuple(self.gpu_targets)
        )


class Pin(_Strict):
    schema_version: Literal[1]
    host: HostName
    stack: Slug
    content_hash: Sha256
    #: The pushed image, by digest: the only reference deploy uses.
    image: DigestRef
    pinned_at: str
    container: Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")]
    command: list[ServeArg] = Field(min_length=1)
    env: dict[Identifier, SafeText] = Field(default_factory=dict)
    #: "all", "none", or GPU indices.
    gpus: Literal["all", "none"] | list[Annotated[int, Field(ge=0, le=255)]]
    ports: list[PortMap] = Field(default_factory=list)
    volumes: list[Volume] = Field(default_factory=list)
    shm_size: ShmSize
    restart: Literal["always", "unless-stopped", "on-failure"] = "unless-stopped"
    health: Health
    needs: HostNeeds

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

    @property
    def serve_port(self) -> int:
        """The container port the server listens on (the last number of the serve command)."""
        args = self.command
        for flag, value in itertools.pairwise(args):
            if flag == "--port" and value.isdigit():
                return int(value)
        return 8000


@dataclass(frozen=True)
class PinOptions:
    gpus: str = "all"
    ports: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    restart: str = "unless-stopped"


# --- files -------------------------------------------------------------------------------------


def check_host_name(host: str) -> str:
    if not HOST_NAME.match(host) or len(host) > 253:
        raise StackError(
            f"{host!r} is not a host name",
            key="HOST",
            hint="lower-case letters, digits, '-' and '.', as in gpu-node-07",
        )
    return host


def pin_path(hosts_dir: Path, host: str) -> Path:
    return hosts_dir / f"{check_host_name(host)}.yaml"


def load_pin(hosts_dir: Path, host: str) -> Pin:
    """The pin of host; unknown host or a malformed file is a StackError with file and key."""
    path = pin_path(hosts_dir, host)
    if not path.is_file():
        known = sorted(p.stem for p in hosts_dir.glob("*.yaml")) if hosts_dir.is_dir() else []
        raise StackError(
            f"no pin for host {host!r} in {hosts_dir}",
            key="HOST",
            hint=f"pinned hosts: {', '.join(known)}"
            if known
            else f"pin it first: sm120-stacks pin {host} STACK",
        )
    doc = load_yaml(path)
    pin = parse_document(doc, Pin)
    if pin.host != host:
        raise StackError(
            f"the file pins host {pin.host!r}, not {host!r}",
            file=path,
            key="host",
            line=doc.lines.get(("host",)),
            hint="a pin file is named after its host: hosts/HOST.yaml",
        )
    return pin


def write_pin(hosts_dir: Path, pin: Pin) -> Path:
    path = pin_path(hosts_dir, pin.host)
    body = yaml.safe_dump(pin.model_dump(mode="json"), sort_keys=False, width=200)
    write_atomic(path, HEADER.format(host=pin.host, stack=pin.stack) + body)
    return path


# --- making a pin ------------------------------------------------------------------------------


def make_pin(
    host: str,
    stack: ResolvedStack,
    content_hash: str,
    record: Record,
    repository: str | None,
    options: PinOptions,
    now: datetime | None = None,
) -> Pin:
    """A pin of the stack's current image; refused unless it was tested and pushed."""
    check_host_name(host)
    ref = local_ref(stack.name, content_hash)
    if record.tests != "passed":
        state = "failed" if record.tests == "failed" else "not been run"
        raise StackError(
            f"the tests of {ref} have {state}; only a tested image can be pinned",
            hint=f"run `sm120-stacks test {stack.name}` then push it",
        )
    image = _pushed_digest(record, repository, ref, stack.name)
    m = stack.manifest
    needs = requirements_for(list(m.gpus), stack.arch.min_driver)
    fields = dict(
        schema_version=PIN_SCHEMA,
        host=host,
        stack=stack.name,
        content_hash=content_hash,
        image=image,
        pinned_at=(now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        container=f"sm120-stacks-{host}",
        command=serve_argv(stack),
        env={**m.env, **_pairs(options.env)},
        gpus=_gpus(options.gpus),
        ports=list(options.ports) or [f"{m.serve.port}:{m.serve.port}"],
        volumes=[_volume(v) for v in options.volumes]
        or [Volume(source=DEFAULT_MODELS, target=MODELS_TARGET)],
        shm_size=m.serve.shm_size,
        restart=options.restart,
        health=Health(start_period_s=m.smoke.health_timeout_s),
        needs=HostNeeds(
            cuda=m.cuda,
            min_driver=needs.min_driver,
            gpu_targets=list(needs.targets),
            compute_capabilities=list(needs.capabilities),
        ),
    )
    try:
        return Pin.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise StackError(
            f"{first['msg']} (got {first.get('input')!r})",
            key=key,
            hint="check the --env/--port/--volume values",
        ) from None


def _pushed_digest(record: Record, repository: str | None, ref: str, stack: str) -> str:
    if not record.pushed:
        raise StackError(
            f"{ref} was never pushed; a host can only run an image from a registry",
            hint=f"sm120-stacks push {stack} --registry HOST[:PORT]",
        )
    if repository is not None:
        if repository not in record.pushed:
            raise StackError(
                f"{ref} was not pushed to {repository} (pushed to: {', '.join(record.pushed)})",
                key="--registry",
            )
        return record.pushed[repository]
    if len(record.pushed) > 1:
        raise StackError(
            f"{ref} was pushed to several registries: {', '.join(sorted(record.pushed))}",
            key="--registry",
            hint="say which one the host pulls from with --registry",
        )
    return next(iter(record.pushed.values()))


def _gpus(text: str) -> Literal["all", "none"] | list[int]:
    if text in ("all", "none"):
        return text  # type: ignore[return-value]
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise StackError(f"--gpus {text!r}: write all, none or indices like 0,1", key="--gpus")
    return [int(p) for p in parts]


def _volume(text: str) -> Volume:
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise StackError(f"--volume {text!r}: write SOURCE:TARGET[:ro]", key="--volume")
    source = str(Path(parts[0]).absolute()) if parts[0].startswith((".", "/")) else parts[0]
    try:
        return Volume(source=source, target=parts[1], read_only=parts[2:] == ["ro"])
    except ValueError:
        raise StackError(
            f"--volume {text!r}: SOURCE is an absolute path or a volume name, TARGET a path",
            key="--volume",
        ) from None


def _pairs(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise StackError(f"--env {item!r}: write NAME=VALUE", key="--env")
        out[key] = value
    return out


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
