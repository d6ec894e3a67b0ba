"""`sm120-stacks pin HOST STACK`: pin a serving host to the tested, pushed image of a stack's
current content (hosts/HOST.yaml), relying on this build folder's record or, where it knows
less, on the image's evidence in the registry, checked under the hosts' trust policy.

`deploy` and `drift` read what this writes (cli/hosts.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from builder.cli.app import (
    Settings,
    cli,
    given_here,
    pass_settings,
    registry_option,
    user_errors,
)
from builder.cli.hosts import hosts_dir_option, hosts_folder
from builder.cli.keys import allow_unsigned_option
from builder.engine import address
from builder.engine.address import check_address
from builder.engine.hostprobe import gather, probe_for
from builder.engine.mounts import DEFAULT_MODELS, models_mount, parse_mount
from builder.evidence.trust import TrustPolicy, host_policy
from builder.hosts.pins import Pin, PinOptions, make_pin, write_pin
from builder.image.records import Record, load_record
from builder.image.registry import Registry
from builder.lock.locked import LockedStack


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
    folder = hosts_folder(settings, hosts_dir)
    relied = _image_relied_on(settings, locked, stack, registry, folder, allow_unsigned)
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
        allow_unsigned=relied.unsigned,
        evidence_keys=relied.evidence_keys,
        api_key_file=api_key_file,
        no_auth=no_auth,
        user=user,
    )
    made = make_pin(host, resolved, relied.content_hash, relied.record, relied.repository, options)
    _say_pinned(made, write_pin(folder, made), stack, gpu_kind)


@dataclass(frozen=True)
class _Relied:
    """The image a pin rests on: its content hash, the record that vouches for it (this build
    folder's, or the registry's evidence as one), the repository the pin names, and the keys
    and unsigned reliance of that evidence."""

    content_hash: str
    record: Record
    repository: str | None
    evidence_keys: tuple[str, ...]
    unsigned: bool


def _image_relied_on(
    settings: Settings,
    locked: LockedStack,
    stack: str,
    registry: str | None,
    folder: Path,
    allow_unsigned: bool,
) -> _Relied:
    """What the pin relies on for the stack's current content, in this order: the build
    folder's record, --registry's form, the hosts' policy in folder (a bad one refused before
    the registry is read), then the registry's evidence where the record knows less."""
    content_hash = settings.render_locked(locked).content_hash()
    record = load_record(settings.build_dir, stack, content_hash)
    repository = Registry.parse(registry).repository if registry else None
    host_policy(folder)  # a bad policy: refused before anything is read
    record, evidence_keys, unsigned = _relied_on(
        registry, stack, content_hash, record, folder, allow_unsigned
    )
    return _Relied(content_hash, record, _chosen(repository, record), evidence_keys, unsigned)


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
