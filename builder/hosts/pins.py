"""Host pins: hosts/HOST.yaml says which tested image a serving host runs, and how.

A pin is a plain YAML file meant for git, one per host, so pins of different hosts never
conflict. It is self-contained: deploy, verify and doctor read only the pin (the stack's
requirements on the host are copied into it), so a serving host needs no stacks/ checkout.
Only an image whose tests passed and that was pushed can be pinned (builder.image.records).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from builder.engine import imageref
from builder.engine.address import ADDRESS_PATTERN
from builder.engine.protocol import Mount
from builder.errors import StackError
from builder.files import write_atomic
from builder.hosts.hostcheck import Requirements, requirements_for
from builder.image.names import local_ref
from builder.image.records import CPU, Record, require_tested
from builder.manifest.archflags import capabilities
from builder.manifest.cache_volume import cache_volume
from builder.manifest.knowledge import parse_document
from builder.manifest.model import ExactVersion, Identifier, SafeText, ServeArg, Sha256, Slug
from builder.manifest.mounts import (
    DEFAULT_MODELS,
    MODELS_TARGET,
    checked,
    models_mount,
    parse_mount,
)
from builder.manifest.resolve import ResolvedStack
from builder.manifest.serve import serve_argv
from builder.manifest.strict import Strict
from builder.manifest.yamlsafe import YamlDocument, load_yaml

#: 2: serve_port recorded, needs.targets maps each GPU target to its capability. Pins of schema 1
#: (earlier versions of this tool) are still read: see _from_schema_1.
PIN_SCHEMA = 2
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
HOST_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
#: Runtime compile caches on a volume of the host, so a restart or a new container of the same
#: stack loads what the last one compiled instead of compiling again: vLLM's torch.compile
#: graphs, Inductor's and Triton's kernels, CuTe-DSL modules, FlashInfer's JIT workspace and
#: autotune results, the CUDA driver's PTX JIT (knowledge/cache_volume.yaml). The precompiled
#: FlashInfer modules load from the image's AOT copy, which this mount does not hide. A
#: warm-cache artifact fills the volume before the first start (builder/warm/).
CACHE_TARGET = cache_volume().mount
CACHE_ENV = cache_volume().environment()
HEADER = (
    "# Pinned by `sm120-stacks pin {host} {stack}`. Deploy with `sm120-stacks deploy {host}`,\n"
    "# check the host with `sm120-stacks verify {host}`. Commit this file.\n"
)

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
#: Where the pin a host had before its current one is kept (what a failed roll goes back to).
PREVIOUS_DIR = "previous"


#: A pin's mount: the one Mount (YAML fields source, target, read_only), shape-checked as
#: `--volume` checks it (manifest/mounts.py).
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
    #: Pinned with --allow-unserved: `verify` shows it as a finding.
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
    #: Published beyond loopback without a key, as asked (--no-auth): `verify` shows it.
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


@dataclass(frozen=True)
class PinOptions:
    gpus: str = "all"
    ports: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    restart: str = "unless-stopped"
    #: The host's engine address, stored in the pin (None: the local engine).
    engine: str | None = None
    #: The host's GPU kind (`doctor` on the host names it; None: not known).
    gpu_kind: str | None = None
    #: Pin an image that never served on the host's GPU kind (recorded in the pin).
    allow_unserved: bool = False
    #: Rely on unsigned evidence under a trust policy (recorded in the pin).
    allow_unsigned: bool = False
    #: The key ids the evidence relied on was signed with.
    evidence_keys: tuple[str, ...] = ()
    #: The host's file holding the API key (its path goes into the pin, never the key).
    api_key_file: str | None = None
    #: The host's model folder (--models DIR), mounted read-only at /models as `test --models`
    #: mounts it for the smoke; None: DEFAULT_MODELS.
    models: str | None = None
    #: Publish beyond loopback without a key (recorded in the pin).
    no_auth: bool = False
    #: UID[:GID] the server runs as.
    user: str | None = None


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
    pin = parse_document(doc, Pin, _current_schema(doc, host))
    if pin.host != host:
        raise StackError(
            f"the file pins host {pin.host!r}, not {host!r}",
            file=path,
            key="host",
            line=doc.lines.get(("host",)),
            hint="a pin file is named after its host: hosts/HOST.yaml",
        )
    return pin


def _current_schema(doc: YamlDocument, host: str) -> Any:
    """The document's data as schema PIN_SCHEMA: a schema 1 pin upgraded; no or another
    schema version is an error saying to pin the host again."""
    data: Any = doc.data
    if not isinstance(data, dict):
        return data  # validation says what it should be
    version = data.get("schema_version")
    if type(version) is int and version == PIN_SCHEMA:
        return data
    again = f"pin the host again: sm120-stacks pin {host} {data.get('stack') or 'STACK'}"
    if type(version) is int and version == 1:
        return _from_schema_1(doc, data, again)
    found = "no schema_version" if version is None else f"schema_version {version!r}"
    raise StackError(
        f"{found}: this sm120-stacks reads pins of schema {PIN_SCHEMA} (and 1)",
        file=doc.path,
        key="schema_version",
        line=doc.lines.get(("schema_version",)),
        hint=again,
    )


def _from_schema_1(doc: YamlDocument, data: dict[str, Any], again: str) -> dict[str, Any]:
    """Schema 1 had no serve_port: the server listened on the serve command's last --port,
    which `pin` always wrote. Its GPU targets and their capabilities were two lists, the
    capabilities sorted (so not in the targets' order): each target's capability is taken by
    its name from the arch table instead."""
    command, needs = data.get("command"), data.get("needs")
    ports = [
        value
        for flag, value in itertools.pairwise(command if isinstance(command, list) else [])
        if flag == "--port" and isinstance(value, str) and value.isdigit()
    ]
    targets = needs.get("gpu_targets") if isinstance(needs, dict) else None
    if (
        not ports
        or not isinstance(needs, dict)
        or not isinstance(targets, list)
        or not all(isinstance(t, str) for t in targets)
    ):
        raise StackError(
            "a pin of schema 1 (an earlier sm120-stacks) without a serve command --port or a "
            "list of needs.gpu_targets: its serve port or GPU targets are unknown",
            file=doc.path,
            key="schema_version",
            line=doc.lines.get(("schema_version",)),
            hint=again,
        )
    kept = {k: v for k, v in needs.items() if k not in ("gpu_targets", "compute_capabilities")}
    return {
        **data,
        "schema_version": PIN_SCHEMA,
        "serve_port": int(ports[-1]),
        "needs": {**kept, "targets": capabilities(targets)},
    }


def write_pin(hosts_dir: Path, pin: Pin) -> Path:
    """Write hosts/HOST.yaml. A pin that replaces a different one keeps that one as
    hosts/previous/HOST.yaml first (what `deploy --all` puts the host back on when the new
    one fails); pinning the same thing again keeps the previous pin as it was."""
    path = pin_path(hosts_dir, pin.host)
    data = pin.model_dump(mode="json")
    if data.get("engine") is None:
        data.pop("engine", None)
    text = HEADER.format(host=pin.host, stack=pin.stack) + yaml.safe_dump(
        data, sort_keys=False, width=200
    )
    if path.is_file():
        old = path.read_text()
        if _without_time(old) != _without_time(text):
            write_atomic(previous_pin_path(hosts_dir, pin.host), old)
    write_atomic(path, text)
    return path


def previous_pin_path(hosts_dir: Path, host: str) -> Path:
    return hosts_dir / PREVIOUS_DIR / f"{check_host_name(host)}.yaml"


def load_previous_pin(hosts_dir: Path, host: str) -> Pin | None:
    """The pin the host had before its current one; None when it never had another."""
    if not previous_pin_path(hosts_dir, host).is_file():
        return None
    return load_pin(hosts_dir / PREVIOUS_DIR, host)


def pinned_hosts(hosts_dir: Path) -> list[str]:
    """Every host with a pin in hosts_dir, sorted."""
    if not hosts_dir.is_dir():
        return []
    return sorted(p.stem for p in hosts_dir.glob("*.yaml") if HOST_NAME.match(p.stem))


def _without_time(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("pinned_at:"))


# --- making a pin ------------------------------------------------------------------------------


def _served_on(stack: ResolvedStack, record: Record, options: PinOptions, ref: str) -> str | None:
    """The GPU kind whose passing served verdict the pin relies on; None where the image never
    served on the host's kind and --allow-unserved says to pin it anyway (or, for a CPU stack,
    whose smoke needs no GPU and whose static checks passed, where no served verdict was kept).
    A served verdict that failed there is refused: push let the image through on its static
    checks, a pin must not put it in service."""
    if not stack.manifest.smoke.needs_gpu:
        cpu = record.served_on(CPU)
        if cpu is not None and not cpu.passed:
            raise StackError(
                f"the smoke of {ref} failed (served on cpu, {cpu.source}, {cpu.at}); only its "
                "static checks passed",
                hint=f"fix the stack and run `sm120-stacks test {stack.name}` again, then push",
            )
        return CPU if cpu is not None and cpu.passed else None
    if options.gpus == "none":  # the container gets no GPU: what it served on CPU counts
        options = replace(options, gpu_kind=CPU)
    if options.gpu_kind is None:
        if options.allow_unserved:
            return None
        raise StackError(
            f"the GPU kind of the host is not known, so no served verdict of {ref} can be "
            "matched to it",
            key="--gpu-kind",
            hint="run the pin where the host's GPUs can be read (its engine: --engine), name "
            "the kind (`sm120-stacks doctor` on the host prints it) with --gpu-kind, or pin "
            "with --allow-unserved",
        )
    else:
        kind = options.gpu_kind
    verdict = record.served_on(kind)
    if verdict is not None and verdict.passed:
        return verdict.gpu_kind
    if options.allow_unserved:
        return None
    served = ", ".join(
        f"{v.gpu_kind} ({'passed' if v.passed else 'failed'})" for v in record.served
    )
    state = "failed" if verdict is not None else "never ran"
    raise StackError(
        f"{ref} has no passing served verdict on {kind}: its smoke there {state}"
        f" (served on: {served or 'no GPU kind'}); only its static checks passed",
        key="--gpu-kind",
        hint=f"run `sm120-stacks test {stack.name} --require-gpu` on a host of that kind (or "
        "`smoke --url URL --record` against one), then push; or pin with --allow-unserved",
    )


def make_pin(
    host: str,
    stack: ResolvedStack,
    content_hash: str,
    record: Record,
    repository: str | None,
    options: PinOptions,
    now: datetime | None = None,
) -> Pin:
    """A pin of the stack's current image; refused unless its static checks passed, it was
    pushed, and it served on the host's GPU kind (or --allow-unserved)."""
    check_host_name(host)
    ref = local_ref(stack.name, content_hash)
    require_tested(
        record,
        ref,
        "only an image whose static checks passed can be pinned",
        hint=f"run `sm120-stacks test {stack.name}` then push it",
    )
    image = _pushed_digest(record, repository, ref, stack.name)
    served_on = _served_on(stack, record, options, ref)
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
        serve_port=m.serve.port,
        env={**(CACHE_ENV if m.serve.engine == "vllm" else {}), **m.env, **_pairs(options.env)},
        gpus=_gpus(options.gpus),
        ports=list(options.ports) or [f"127.0.0.1:{m.serve.port}:{m.serve.port}"],
        volumes=_volumes(host, stack, options),
        shm_size=m.serve.shm_size,
        restart=options.restart,
        engine=options.engine,
        health=Health(start_period_s=m.smoke.health_timeout_s),
        served_on=served_on,
        allow_unserved=served_on is None and m.smoke.needs_gpu,
        allow_unsigned=options.allow_unsigned,
        evidence_keys=list(options.evidence_keys),
        api_key_file=_key_file(options.api_key_file),
        no_auth=options.no_auth,
        user=options.user,
        needs=HostNeeds(
            cuda=m.cuda,
            min_driver=needs.min_driver,
            targets=needs.targets,
        ),
    )
    try:
        pin = Pin.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise StackError(
            f"{first['msg']} (got {first.get('input')!r})",
            key=key,
            hint="check the --env/--port/--volume values",
        ) from None
    exposed = exposure_findings(pin)
    if exposed and not pin.no_auth:
        raise StackError(
            f"{exposed[0]}: anyone who reaches the host could use its GPU",
            key="--port",
            hint="give the server a key (--api-key-file FILE on the host; clients send it as "
            "`Authorization: Bearer KEY`), publish on loopback (--port 127.0.0.1:H:C), or "
            "pass --no-auth to publish it open (recorded in the pin; verify reports it)",
        )
    return pin


def _key_file(path: str | None) -> str | None:
    if path is None:
        return None
    if not path.startswith("/"):
        raise StackError(
            f"--api-key-file {path!r} is not an absolute path on the host",
            key="--api-key-file",
            hint="the file is read on the serving host: /etc/sm120-stacks/keys/HOST.key, say",
        )
    return path


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


def _volumes(host: str, stack: ResolvedStack, options: PinOptions) -> list[Mount]:
    """--volume as given, else the defaults; --models DIR is the models mount either way (one
    --volume at /models beside it would give the server two model folders: refused)."""
    given = [_volume(v) for v in options.volumes]
    if not given:
        return _default_volumes(host, stack, options.models)
    if options.models is None:
        return given
    if any(v.target == MODELS_TARGET for v in given):
        raise StackError(
            f"--models and a --volume at {MODELS_TARGET} both name the model folder",
            key="--models",
            hint=f"give one: --models DIR, or --volume DIR:{MODELS_TARGET}:ro",
        )
    return [models_mount(options.models), *given]


def _default_volumes(host: str, stack: ResolvedStack, models: str | None = None) -> list[Mount]:
    """Models from the host, read-only (the server reads them; its caches have their own
    volume); for vLLM, a named volume of this pin for the compile caches."""
    volumes = [models_mount(models or DEFAULT_MODELS)]
    if stack.manifest.serve.engine == "vllm":
        volumes.append(Mount(cache_volume_name(stack.name, host), CACHE_TARGET))
    return volumes


def cache_volume_name(stack: str, host: str) -> str:
    """The pin's own cache volume, by stack and host: two pins of one stack on one engine never
    write one live/ (two servers in one Triton folder, a restore swapping live/ under the other
    server; issue 34), and a re-pin of the host to the stack finds its caches again. The digest
    of the pair keeps it unique where names split alike (`a-b` on `c`, `a` on `b-c`) and bounds
    its length (a Docker volume's folder, a PersistentVolumeClaim's 253)."""
    pair = hashlib.sha256(f"{stack}\n{host}".encode()).hexdigest()[:8]
    return f"sm120-stacks-cache-{stack}-{host}"[:200] + f"-{pair}"


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


def _volume(text: str) -> Mount:
    """--volume SOURCE:TARGET[:ro], read as every command reads a mount (manifest/mounts.py)."""
    return parse_mount(text, "--volume")


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
