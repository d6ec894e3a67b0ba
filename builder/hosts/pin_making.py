"""Making a pin: hosts/HOST.yaml for a tested image, refused unless its static checks passed,
it was pushed, and it served on the host's GPU kind (or --allow-unserved); the pin's options
(`pin`'s --gpus, --port, --volume, --env, --models, --api-key-file ...) read and checked, and
the pin's own cache volume named. The schema is builder/hosts/pin_schema.py; the files,
builder/hosts/pins.py.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from builder.engine.mounts import DEFAULT_MODELS, MODELS_TARGET, models_mount, parse_mount
from builder.engine.protocol import Mount
from builder.errors import StackError
from builder.hosts.hostcheck import requirements_for
from builder.hosts.pin_schema import (
    PIN_SCHEMA,
    Health,
    HostNeeds,
    Pin,
    check_host_name,
    exposure_findings,
)
from builder.image.names import local_ref
from builder.image.records import CPU, Record, require_tested
from builder.knowledge.cache_volume import cache_volume
from builder.manifest.resolve import ResolvedStack
from builder.manifest.serve import serve_argv

#: Runtime compile caches on a volume of the host, so a restart or a new container of the same
#: stack loads what the last one compiled instead of compiling again: vLLM's torch.compile
#: graphs, Inductor's and Triton's kernels, CuTe-DSL modules, FlashInfer's JIT workspace and
#: autotune results, the CUDA driver's PTX JIT (knowledge/cache_volume.yaml). The precompiled
#: FlashInfer modules load from the image's AOT copy, which this mount does not hide. A
#: warm-cache artifact fills the volume before the first start (builder/warm/).
CACHE_TARGET = cache_volume().mount
CACHE_ENV = cache_volume().environment()


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
    fields = _pin_fields(host, stack, content_hash, image, served_on, options, now)
    return _refuse_open_serve_port(_validated(fields))


def _pin_fields(
    host: str,
    stack: ResolvedStack,
    content_hash: str,
    image: str,
    served_on: str | None,
    options: PinOptions,
    now: datetime | None,
) -> dict[str, Any]:
    """The pin's fields from the stack's manifest and the options, before validation."""
    m = stack.manifest
    needs = requirements_for(list(m.gpus), stack.arch.min_driver)
    return dict(
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


def _validated(fields: dict[str, Any]) -> Pin:
    """The fields as a Pin; the first field the schema refuses is a StackError naming it."""
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


def _refuse_open_serve_port(pin: Pin) -> Pin:
    """The pin, unless it publishes the serve port beyond loopback with no key and no
    --no-auth."""
    exposed = exposure_findings(pin)
    if exposed and not pin.no_auth:
        raise StackError(
            f"{exposed[0]}: anyone who reaches the host could use its GPU",
            key="--port",
            hint="give the server a key (--api-key-file FILE on the host; clients send it as "
            "`Authorization: Bearer KEY`), publish on loopback (--port 127.0.0.1:H:C), or "
            "pass --no-auth to publish it open (recorded in the pin; drift reports it)",
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
    """--volume SOURCE:TARGET[:ro], read as every command reads a mount (engine/mounts.py)."""
    return parse_mount(text, "--volume")


def _pairs(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise StackError(f"--env {item!r}: write NAME=VALUE", key="--env")
        out[key] = value
    return out
