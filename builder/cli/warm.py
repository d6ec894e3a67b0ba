"""`cache capture HOST`, `cache list HOST`, `cache prove HOST`: a pinned host's warm caches.

`deploy --apply` restores (and `--require-warm` insists on) the artifact these commands make;
docs/warm-caches.md is the walk-through.
"""

from __future__ import annotations

import json
import sys

import click

from builder.cli.app import Settings, cli, engine_option, pass_settings, user_errors
from builder.cli.keys import read_signing_key, signing_key_option
from builder.engine.protocol import Engine
from builder.hosts import remote
from builder.hosts.pins import Pin, load_pin
from builder.hosts.trustdrift import refuse_ungated
from builder.hosts.warm_target import Candidate, candidates, capture_pin, require_target
from builder.warm.lifecycle import prove as prove_start

EXIT_COMPILED = 1


@cli.group("cache")
def cache_group() -> None:
    """A pinned host's runtime caches as a warm-cache artifact beside its image: capture once
    per GPU kind, restored by every `deploy --apply` whose key matches, proved at every start."""


def _pinned(settings: Settings, host: str) -> tuple[Pin, Engine]:
    """HOST's pin (from the global --hosts-dir) and its engine."""
    pin = load_pin(settings.hosts_dir, host)
    refuse_ungated(pin, settings.hosts_dir)  # no code of an image the policy refuses runs
    return pin, remote.connect(pin, settings.engine_address())


@cache_group.command("capture")
@click.argument("host")
@signing_key_option
@engine_option
@pass_settings
@user_errors
def capture(settings: Settings, host: str, signing_key: str | None) -> None:
    """Push what HOST's server wrote into its cache volume as one artifact beside its pinned
    image, keyed by the image, GPU, driver, model, serve command and mount path, and signed
    with --signing-key (hosts with a trust policy restore only what a key it names signed).

    Run it after a served smoke (`smoke STACK --url URL`), once warm-up has finished.
    """
    signer = read_signing_key(signing_key)  # before anything is read or pushed
    pin, engine = _pinned(settings, host)
    click.echo(capture_pin(pin, engine, settings.engine_address(), signer))


@cache_group.command("list")
@click.argument("host")
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON.")
@engine_option
@pass_settings
@user_errors
def list_caches(settings: Settings, host: str, as_json: bool) -> None:
    """The warm-cache artifacts of HOST's pinned image, and how each key differs from the
    host's own (the one `deploy --apply` would restore is marked `match`)."""
    pin, engine = _pinned(settings, host)
    key, found = candidates(pin, engine, settings.engine_address())
    refused = _refused_by_policy(settings, pin, found)
    if as_json:
        rows = [
            {
                "artifact": c.found.descriptor.digest,
                "captured_on": c.found.captured_on,
                "created": c.found.created,
                "match": c.match and c.found.descriptor.digest not in refused,
                "signed": c.found.envelope is not None,
                "refused": refused.get(c.found.descriptor.digest),
                "differences": c.differences,
            }
            for c in found
        ]
        click.echo(json.dumps({"host_key": key.model_dump(), "artifacts": rows}, indent=2))
        return
    click.echo(f"{host}: key {key.digest()[:19]} ({', '.join(key.gpus) or 'no GPU'})")
    if not found:
        click.echo("no warm-cache artifact for this image yet (`sm120-stacks cache capture HOST`)")
    for c in found:
        state = "match" if c.match else f"differs in {len(c.differences)}"
        why = refused.get(c.found.descriptor.digest)
        if why is not None:  # deploy --apply would not restore it, match or not
            state = f"refused by the trust policy ({why})" + ("" if c.match else f"; {state}")
        signed = "signed" if c.found.envelope is not None else "unsigned"
        where = f"from {c.found.captured_on} at {c.found.created}, {signed}"
        click.echo(f"{c.found.descriptor.digest[:19]} {where}: {state}")
        for line in c.differences:
            click.echo(f"  {line}")


def _refused_by_policy(settings: Settings, pin: Pin, found: list[Candidate]) -> dict[str, str]:
    """Artifact digest -> why the hosts' policy refuses it (what deploy --apply says)."""
    from builder.evidence.oci import ArtifactStore
    from builder.evidence.trust import host_policy
    from builder.warm.signed import vouched

    policy = host_policy(settings.hosts_dir)
    if policy is None or not found:
        return {}
    store = ArtifactStore.of_image(pin.image)
    refused: dict[str, str] = {}
    for candidate in found:
        _, lines = vouched(store, [candidate.found], policy)
        if lines:
            refused[candidate.found.descriptor.digest] = lines[0].split(": ", 1)[-1]
    return refused


@cache_group.command("prove")
@click.argument("host")
@click.option("--json", "as_json", is_flag=True, help="Print the proof as JSON.")
@engine_option
@pass_settings
@user_errors
def prove(settings: Settings, host: str, as_json: bool) -> None:
    """What HOST's server compiled since its last start: files in its cache volume that were
    not there when it started, by kind. Exit status 1 when it compiled anything."""
    pin, engine = _pinned(settings, host)
    proof = prove_start(engine, require_target(pin))
    if as_json:
        click.echo(json.dumps(proof.to_json(), indent=2))
    else:
        click.echo(f"{host}: {proof.summary()}")
        for example in proof.examples:
            click.echo(f"  new: {example}")
    if not proof.zero:
        sys.exit(EXIT_COMPILED)
