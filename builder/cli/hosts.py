"""Commands that pin serving hosts to tested images: pin, deploy, drift (`verify`: its old name,
deprecated).

Registered on the main `cli` group when builder.cli.app imports this module. Bad input exits 2
(user_errors); drift exits 1, since it describes the host, not the command line. A host's
prerequisites are `doctor`'s (cli/doctor.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import click

from builder.cli.app import (
    Settings,
    cli,
    engine_option,
    given_here,
    pass_settings,
    registry_option,
    user_errors,
)
from builder.cli.fleet import all_pins, deploy_pins, drift_pins
from builder.cli.keys import allow_unsigned_option
from builder.engine import address
from builder.engine.address import check_address
from builder.engine.hostprobe import gather, probe_for
from builder.engine.mounts import DEFAULT_MODELS, models_mount, parse_mount
from builder.errors import StackError
from builder.evidence.trust import TrustPolicy, host_policy
from builder.hosts.pins import Pin, PinOptions, load_pin, make_pin, write_pin
from builder.hosts.trustdrift import refuse_revoked
from builder.hosts.volume_owner import refuse_foreign_volumes
from builder.hosts.warm_target import WarmPolicy
from builder.image.records import Record, load_record
from builder.image.registry import Registry

EXIT_DRIFT = 1

#: The command's own --hosts-dir, kept as an alias of the global one (`sm120-stacks --hosts-dir
#: D deploy ...`) for the scripts that give it after the command; it wins where both are given.
hosts_dir_option = click.option(
    "--hosts-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Alias of the global --hosts-dir (folder of host pins).",
)


def hosts_folder(settings: Settings, value: Path | None) -> Path:
    return value if value is not None else settings.hosts_dir


@cli.command()
@click.argument("host")
@click.argument("stack")
@registry_option(
    "The registry the host pulls from, and whose evidence is read where this build folder has "
    "no record of the image; from the variable, only where the image was pushed there"
)
@click.option("--gpus", default="all", show_default=True, help="all, none, or indices: 0,1.")
@click.option(
    "--port",
    "ports",
    multiple=True,
    help="[IP:]HOST_PORT:CONTAINER_PORT (repeat); default: the serve port on 127.0.0.1 only. "
    "Any other address needs --api-key-file (or --no-auth).",
)
@click.option(
    "--volume",
    "volumes",
    multiple=True,
    help="SOURCE:TARGET[:ro] (repeat); default: /var/lib/sm120-stacks/models:/models.",
)
@click.option(
    "--models",
    "models_dir",
    metavar="DIR",
    help="The host's model folder, mounted read-only at /models as `test --models` mounts it "
    f"for the smoke (default: {DEFAULT_MODELS}).",
)
@click.option("--env", "env", multiple=True, help="NAME=VALUE added to the manifest's env.")
@click.option(
    "--restart",
    type=click.Choice(["always", "unless-stopped", "on-failure"]),
    default="unless-stopped",
    show_default=True,
)
@click.option(
    "--engine",
    "host_engine",
    metavar="ADDRESS",
    help="The host's Docker engine, kept in the pin for deploy and drift: "
    "ssh://[USER@]HOST[:PORT] (keys from your ssh agent), unix:///PATH or tcp://HOST:PORT. "
    "Default: the engine of the machine that deploys.",
)
@click.option(
    "--gpu-kind",
    metavar="NAME",
    help="The host's GPU as nvidia-smi names it (`sm120-stacks doctor` there prints it); "
    "default: read on the host through its engine. The pin needs the image's passing served "
    "verdict on it.",
)
@click.option(
    "--api-key-file",
    metavar="PATH",
    help="A file on the host holding the server's API key (its path goes into the pin, never "
    "the key): needed to publish the serve port beyond loopback; clients send "
    "`Authorization: Bearer KEY`.",
)
@click.option(
    "--user",
    metavar="UID[:GID]",
    help="Run the server as this user, not the image's (root): the models are read-only and "
    "the caches must be writable by it (a bind folder it owns).",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Publish the serve port beyond loopback with no API key (recorded; drift reports it).",
)
@click.option(
    "--allow-unserved",
    is_flag=True,
    help="Pin an image whose smoke never served on the host's GPU kind (the pin records it; "
    "`drift` and `list` show it).",
)
@allow_unsigned_option
@hosts_dir_option
@pass_settings
@user_errors
def pin(
    settings: Settings,
    host: str,
    stack: str,
    registry: str | None,
    gpus: str,
    ports: tuple[str, ...],
    volumes: tuple[str, ...],
    models_dir: str | None,
    env: tuple[str, ...],
    restart: str,
    host_engine: str | None,
    gpu_kind: str | None,
    api_key_file: str | None,
    user: str | None,
    no_auth: bool,
    allow_unserved: bool,
    allow_unsigned: bool,
    hosts_dir: Path | None,
) -> None:
    """Pin HOST to the tested, pushed image of STACK's current content: hosts/HOST.yaml.

    A stack that serves on a GPU needs the image's passing served verdict on the host's GPU
    kind. Where this build folder has no record of the image (tested and pushed elsewhere),
    the verdicts come from its evidence in the registry (--registry), checked.

    A pin that replaces a different one keeps it as hosts/previous/HOST.yaml: what
    `deploy --apply` (one host or all) puts the host back on when the new one fails its gate.
    """
    locked = settings.locked(stack, allow_floating=True)  # the lock read once, handed down
    resolved = locked.stack
    _check_inputs(volumes, models_dir, host_engine)  # before any record or registry is read
    content_hash = settings.render_locked(locked).content_hash()
    record = load_record(settings.build_dir, stack, content_hash)
    repository = Registry.parse(registry).repository if registry else None
    folder = hosts_folder(settings, hosts_dir)
    host_policy(folder)  # a bad policy: refused before anything is read
    record, evidence_keys, unsigned = _relied_on(
        registry, stack, content_hash, record, folder, allow_unsigned
    )
    repository = _chosen(repository, record)
    if gpu_kind is None and resolved.manifest.smoke.needs_gpu:
        gpu_kind = _host_gpu_kind(host_engine)
    options = PinOptions(
        gpus=gpus,
        ports=ports,
        volumes=volumes,
        models=models_dir,
        env=env,
        restart=restart,
        engine=host_engine,
        gpu_kind=gpu_kind,
        allow_unserved=allow_unserved,
        allow_unsigned=unsigned,
        evidence_keys=evidence_keys,
        api_key_file=api_key_file,
        no_auth=no_auth,
        user=user,
    )
    made = make_pin(host, resolved, content_hash, record, repository, options)
    _say_pinned(made, write_pin(hosts_folder(settings, hosts_dir), made), stack, gpu_kind)


def _check_inputs(volumes: tuple[str, ...], models_dir: str | None, engine: str | None) -> None:
    """pin's --volume, --models and --engine, refused for their form before anything is read."""
    for text in volumes:
        parse_mount(text, "--volume")
    if models_dir is not None:
        models_mount(models_dir)
    if engine is not None:
        check_address(engine, key="--engine")


def _relied_on(
    registry: str | None,
    stack: str,
    content_hash: str,
    record: Record,
    folder: Path,
    allow_unsigned: bool,
) -> tuple[Record, tuple[str, ...], bool]:
    """The record pin relies on: this build folder's where it says tested and pushed, else
    the verdicts of the image's evidence in the registry (with the keys that vouched for them,
    and whether unsigned documents were allowed)."""
    if record.tests == "passed" and record.pushed:
        return record, (), False
    return _record_from_registry(registry, stack, content_hash, record, folder, allow_unsigned)


def _chosen(repository: str | None, record: Record) -> str | None:
    """The registry the pin names: --registry as given; the variable's only where the image
    was pushed there (a variable set for other commands is not a choice)."""
    if repository not in (None, *record.pushed) and not given_here(
        click.get_current_context(), "registry"
    ):
        return None
    return repository


def _say_pinned(made: Pin, path: Path, stack: str, gpu_kind: str | None) -> None:
    click.echo(f"pinned {made.host} to {made.image}\n  {path}")
    if made.served_on is not None:
        click.echo(f"  relies on its served verdict on {made.served_on}")
    if made.allow_unserved:
        click.echo(
            f"warning: pinned with --allow-unserved: the image never served on "
            f"{gpu_kind or 'the host GPU kind'} (static checks only); run `sm120-stacks "
            f"test {stack} --require-gpu` on such a host before serving from it",
            err=True,
        )


def _record_from_registry(
    registry: str | None,
    stack: str,
    content_hash: str,
    local: Record,
    folder: Path,
    allow_unsigned: bool = False,
) -> tuple[Record, tuple[str, ...], bool]:
    """What the registry's evidence says of the image, where this build folder knows less,
    under the hosts' trust policy (or trusted on first use: evidence/decision.py); the key ids
    it was signed with, and whether a document was relied on unsigned (--allow-unsigned)."""
    from builder.cli.evidence import print_verdicts
    from builder.evidence.decision import relied_evidence
    from builder.evidence.reader import has_image

    if registry is None:
        return local, (), False  # make_pin says what is missing, and how to get it
    source = Registry.parse(registry)
    if not has_image(source, stack, content_hash):
        return local, (), False  # not in that registry either: make_pin says what is missing
    relied = relied_evidence(
        folder, source, stack, content_hash, allow_unsigned=allow_unsigned, tool="pin"
    )
    evidence = relied.evidence
    print_verdicts(evidence)
    say_trust(relied.said)
    if evidence.signed_by:
        click.echo(f"  signed by: {', '.join(_key_names(relied.policy, evidence.signed_by))}")
    if evidence.unsigned:
        click.echo(
            f"warning: relied on {len(evidence.unsigned)} unsigned documents (--allow-unsigned, "
            "recorded in the pin; drift reports it)",
            err=True,
        )
    return evidence.record(), tuple(evidence.signed_by), bool(evidence.unsigned)


def say_trust(lines: list[str]) -> None:
    """What a first use trusted (or that nothing was), on stderr where warnings go."""
    for line in lines:
        click.echo(line, err=True)


def _key_names(trust: TrustPolicy | None, key_ids: list[str]) -> list[str]:
    names = [trust.name_of(k) if trust else None for k in key_ids]
    return [f"{name or 'key'} ({key[:16]})" for name, key in zip(names, key_ids, strict=True)]


def _host_gpu_kind(host_engine: str | None) -> str | None:
    """The host's GPU as nvidia-smi names it, read on the host (through its engine's
    machine: here, or over ssh); None where none can be read."""
    facts = gather(None, None, probe_for(host_engine or address.from_environment()))
    return facts.gpus[0].name if facts.gpus else None


@cli.command()
@click.argument("host", required=False)
@click.option("--all", "every", is_flag=True, help="Every pinned host (hosts/*.yaml).")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where to write the files (default: BUILD_DIR/hosts/HOST).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["compose", "k8s"]),
    default="compose",
    show_default=True,
    help="compose: compose.yaml and a systemd unit; k8s: a Deployment and a Service "
    "(k8s.yaml, checked against the Kubernetes schema; then `kubectl apply -f`).",
)
@click.option(
    "--apply",
    "apply_now",
    is_flag=True,
    help="Also run the pin on the host's engine (the pin's `engine`, else this one), one host "
    "at a time, each gated by its health path and smoke through its URL (a pin publishing no "
    "serve port reachable from here: its container's state); a host that fails goes back on "
    "its previous pin, and with --all the roll stops there.",
)
@click.option(
    "--no-smoke",
    is_flag=True,
    help="With --apply: gate on the health path alone, not the stack's smoke.",
)
@click.option(
    "--gate-timeout",
    type=click.FloatRange(1, None),
    default=None,
    help="With --apply: seconds a host may take to answer its health path "
    "(default: the pin's health start period).",
)
@click.option(
    "--require-warm",
    is_flag=True,
    help="With --apply: refuse to start a host whose cache volume cannot be filled from a "
    "warm-cache artifact of exactly its key (`cache list HOST` shows why); a host that "
    "compiled anything at its start also fails its gate.",
)
@click.option(
    "--cold",
    is_flag=True,
    help="With --apply: start without restoring a warm-cache artifact (the volume as it is).",
)
@click.option("--gpu-product", help="k8s: the node label nvidia.com/gpu.product to run on.")
@click.option("--json", "as_json", is_flag=True, help="With --apply: the roll as JSON.")
@engine_option
@hosts_dir_option
@pass_settings
@user_errors
def deploy(
    settings: Settings,
    host: str | None,
    every: bool,
    out: Path | None,
    fmt: str,
    apply_now: bool,
    no_smoke: bool,
    gate_timeout: float | None,
    require_warm: bool,
    cold: bool,
    gpu_product: str | None,
    as_json: bool,
    hosts_dir: Path | None,
) -> None:
    """Render HOST's compose file and systemd unit from its pin; --apply runs it there.

    --all deploys every pinned host. With --apply, one host or all are rolled alike: one at a
    time, each gated and rolled back on a failure. Exit status 1 when the roll stopped at a
    gate, 2 at bad input (a cache volume that is not the pin's own, the warm-cache restore
    refused, a pull that failed).
    """
    folder = hosts_folder(settings, hosts_dir)
    _one_or_all(host, every)
    _apply_only(
        apply_now,
        no_smoke=no_smoke,
        gate_timeout=gate_timeout,
        require_warm=require_warm,
        cold=cold,
        json=as_json,
    )
    if gpu_product is not None and fmt != "k8s":
        raise StackError(
            "--gpu-product selects a Kubernetes node: it applies with --format k8s only",
            key="--gpu-product",
            hint="add --format k8s, or leave out --gpu-product",
        )
    pins = all_pins(folder) if every else [load_pin(folder, str(host))]
    refuse_foreign_volumes(pins, folder, settings.engine_address())  # before anything is written
    base = settings.build_dir / "hosts"

    def out_of(pin: Pin) -> Path:
        """--all: a folder per host under --out; one host: --out is its folder."""
        return (out or base) / pin.host if every else out or base / pin.host

    if fmt == "k8s":
        _deploy_k8s(pins, out_of, gpu_product, apply_now)
        return
    warm = WarmPolicy(
        require=require_warm,
        cold=cold,
        default_engine=settings.engine_address(),
        trust=host_policy(folder) if apply_now else None,
    )
    refuse_revoked(pins, warm.trust)
    deploy_pins(
        settings, folder, pins, out_of, apply_now, not no_smoke, gate_timeout, as_json, warm
    )


def _deploy_k8s(
    pins: list[Pin], out_of: Callable[[Pin], Path], gpu_product: str | None, apply_now: bool
) -> None:
    """deploy --format k8s: each pin's Deployment and Service written, their paths printed."""
    if apply_now:
        raise StackError(
            "--apply runs a pin on a Docker engine, not on Kubernetes",
            key="--apply",
            hint="render with --format k8s, then `kubectl apply -f FILE`",
        )
    from builder.hosts.k8s import write_k8s

    for pinned in pins:
        click.echo(write_k8s(pinned, out_of(pinned), gpu_product))


def _apply_only(apply_now: bool, **given: object) -> None:
    """Options that judge a start mean nothing without --apply: refused (exit 2), not ignored."""
    named = [name for name, value in given.items() if value not in (False, None)]
    if named and not apply_now:
        option = "--" + named[0].replace("_", "-")
        raise StackError(
            f"{option} applies to a deploy that starts the server: nothing is started without "
            "--apply",
            key=option,
            hint=f"add --apply, or leave out {option}",
        )


@cli.command()
@click.argument("host", required=False)
@click.option("--all", "every", is_flag=True, help="Every pinned host, in one table.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--files",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where deploy wrote the host's compose.yaml and unit (deploy's --out; default: "
    "BUILD_DIR/hosts/HOST; with --all, DIR/HOST). The unit installed under "
    "/etc/systemd/system is read too.",
)
@engine_option
@hosts_dir_option
@pass_settings
@user_errors
def drift(
    settings: Settings,
    host: str | None,
    every: bool,
    as_json: bool,
    files: Path | None,
    hosts_dir: Path | None,
) -> None:
    """Compare what runs on HOST (on its pin's engine) with its pin; every drift is reported,
    nothing changed. --all: every pinned host. The host's rendered compose.yaml and systemd
    unit are read too: an image edited into them that is not the pinned digest (a tag), or a
    named volume that is not the pin's, is a drift.

    Exit status: 0 as pinned, 1 drift, 2 bad input.
    """
    folder = hosts_folder(settings, hosts_dir)
    _one_or_all(host, every)
    pins = all_pins(folder) if every else [load_pin(folder, str(host))]
    base = settings.build_dir / "hosts"

    def files_of(pin: Pin) -> Path:
        """Where deploy wrote the pin's files, as deploy's --out names them."""
        return (files or base) / pin.host if every else files or base / pin.host

    policy = host_policy(folder)
    drift_pins(pins, as_json, settings.engine_address(), every, policy, files_of)


#: `verify` was this command's name until 2026-12-02, when builder/verify/ (which implements
#: `test` and `smoke`) made the word mean two things; kept as an alias for one release.
_verify_alias = copy.copy(drift)
_verify_alias.name = "verify"
_verify_alias.deprecated = True
_verify_alias.help = "The old name of `drift` (kept for one release). " + (drift.help or "")
cli.add_command(_verify_alias)


def _one_or_all(host: str | None, every: bool) -> None:
    if every and host:
        raise StackError("give HOST or --all, not both", key="HOST")
    if not every and not host:
        raise StackError("name a HOST, or pass --all for every pinned host", key="HOST")
