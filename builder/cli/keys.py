"""`keys`: make signing keys, name them by key id, check the trust policy."""

from __future__ import annotations

import json
from pathlib import Path

import click

from builder.cli.app import Settings, cli, pass_settings, user_errors
from builder.evidence.keys import (
    SIGNING_KEY_ENV,
    SigningKey,
    generate_key_pair,
    load_public_key,
    load_signing_key,
    signing_key_path,
)
from builder.evidence.trust import load_policy, policy_path, policy_schema


@cli.group("keys")
def keys_group() -> None:
    """Signing keys (ECDSA P-256, the kind cosign makes) and the trust policy naming them."""


@keys_group.command("generate")
@click.argument("name")
@click.option(
    "--dir",
    "folder",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("."),
    show_default=True,
    help="Where NAME.key and NAME.pub are written.",
)
@user_errors
def generate_cmd(name: str, folder: Path) -> None:
    """Write NAME.key (private, mode 0600, never printed) and NAME.pub (PEM `PUBLIC KEY`, what
    `cosign verify-attestation --key` reads); prints the key id. Refuses to replace a key."""
    private_path, public_path, key_id = generate_key_pair(folder, name)
    click.echo(f"key id {key_id}")
    click.echo(f"  public:  {public_path}  (list it under keys: in the hosts' trust.yaml)")
    click.echo(f"  private: {private_path}  (mode 0600: keep it on the signing machine only)")


@keys_group.command("id")
@click.argument("public_key", type=click.Path(path_type=Path, dir_okay=False))
@user_errors
def id_cmd(public_key: Path) -> None:
    """The key id of a PEM public key: sha256 of its DER SubjectPublicKeyInfo, hex."""
    click.echo(load_public_key(public_key).key_id)


@keys_group.command("schema")
def schema_cmd() -> None:
    """The trust policy's JSON Schema (HOSTS_DIR/trust.yaml)."""
    click.echo(json.dumps(policy_schema(), indent=2))


@keys_group.command("check")
@click.option(
    "--policy",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The trust policy  [default: trust.yaml in the hosts folder]",
)
@pass_settings
@user_errors
def check_cmd(settings: Settings, policy: Path | None) -> None:
    """Read the trust policy (every key file too) and print who may vouch for what."""
    loaded = load_policy(policy or policy_path(settings.hosts_dir))
    click.echo(f"{loaded.path}: {len(loaded.keys)} keys")
    for name, key in loaded.keys.items():
        click.echo(f"  {name}: {key.key_id}")
    click.echo(f"build: {', '.join(loaded.build) or 'nobody'}")
    for purpose, per_kind in (("served", loaded.served), ("warm", loaded.warm)):
        for kind, names in per_kind.items():
            click.echo(f"{purpose} on {kind}: {', '.join(names) or 'nobody'}")


#: How a signing command is given its private key: the path of a FILE (a mounted secret, a
#: file of mode 0600), never the key; the variable names a file too.
signing_key_option = click.option(
    "--signing-key",
    "signing_key",
    metavar="FILE",
    envvar=SIGNING_KEY_ENV,
    help="The private key (NAME.key of `keys generate`) to sign with: a file path, never the "
    f"key itself (env {SIGNING_KEY_ENV}, also a path).",
)


def read_signing_key(value: str | None) -> SigningKey | None:
    """The key --signing-key (or its variable) names; None when neither is set."""
    path = signing_key_path(value, "--signing-key")
    return None if path is None else load_signing_key(path)


#: Migration only: rely on evidence the trust policy would refuse as unsigned (recorded in the
#: pin; `drift` reports it as a drift named `unsigned`).
allow_unsigned_option = click.option(
    "--allow-unsigned",
    is_flag=True,
    help="Rely on unsigned evidence although the hosts' trust policy (trust.yaml) asks for "
    "signatures: for migration only (a pin records it; drift reports it).",
)
