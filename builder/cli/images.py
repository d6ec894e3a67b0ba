"""Commands that make and move images: build, push, pull."""

from __future__ import annotations

from pathlib import Path

import click

from builder.cli.app import (
    Settings,
    allow_floating_option,
    ca_bundle_option,
    cli,
    engine_option,
    given_here,
    pass_settings,
    registry_option,
    user_errors,
)
from builder.cli.keys import allow_unsigned_option, read_signing_key, signing_key_option
from builder.engine.progress import LayerProgress
from builder.engine.protocol import Engine
from builder.errors import StackError
from builder.evidence.keys import fingerprint
from builder.image.build import BuildOptions, BuildOutcome
from builder.image.buildclient import client_memo
from builder.image.cabundle import resolve_ca_bundle
from builder.image.make import BuildRequest, inputs_taken, make_image
from builder.image.names import content_tag
from builder.image.registry import Registry
from builder.render.context import RenderedContext

#: How long a second build of a stack waits for the first: longer than the longest cold build
#: measured (vllm-0.17-flashinfer-cutlass, 69 min on 2 cores), with room for a slower machine.
BUILD_WAIT_S = 6 * 3600


def registry_unused(registry: str | None, pull_or_build: bool) -> bool:
    """build's --registry written on its command line without --pull-or-build: it would be
    ignored (the variable set for push is not refused)."""
    return (
        registry is not None
        and not pull_or_build
        and given_here(click.get_current_context(), "registry")
    )


def layer_lines(action: str, ref: str) -> LayerProgress:
    """A push's or pull's progress on stderr: each moving layer's bytes and percent, a line
    every few seconds (stdout keeps what a script reads: the digest, the pulled reference)."""
    return LayerProgress(action, ref, lambda line: click.echo(line, err=True))


@cli.command()
@click.argument("stack")
@click.option(
    "--pull-or-build",
    is_flag=True,
    help="Pull the image of this exact content hash when the registry has it.",
)
@registry_option("With --pull-or-build: the registry to pull from")
@click.option("--network", default="host", show_default=True, help="Network for RUN steps.")
@ca_bundle_option
@click.option(
    "--hf-token-file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    envvar="SM120_STACKS_HF_TOKEN_FILE",
    help="Hugging Face token, as a secret.",
)
@click.option(
    "--max-jobs",
    type=click.IntRange(1, 256),
    default=None,
    help="Compile jobs for the JIT cache (default: the manifest's).",
)
@click.option(
    "--no-cache",
    is_flag=True,
    help="Rebuild every layer. BuildKit also hands such a build fresh cache mounts, so FlashInfer "
    "compiles start from nothing and later builds see the new mount, not the old one.",
)
@click.option(
    "--cache-from-registry",
    "cache_registry",
    envvar="SM120_STACKS_CACHE_REGISTRY",
    metavar="HOST[:PORT][/NAMESPACE]",
    help="Reuse the layers of this stack's images in that registry (its content and moving "
    "tags, and those of the stacks it extends) where their build steps match: a fresh machine "
    "skips what another one built and pushed, FlashInfer compiles included. With "
    "--pull-or-build, --registry is used when this is not given (env "
    "SM120_STACKS_CACHE_REGISTRY).",
)
@click.option(
    "--cache-to-registry",
    "cache_export",
    is_flag=True,
    help="Also write every stage's layers to a cache image there (STACK's buildcache- tag, "
    "mode=max): needs buildx with a builder that exports cache (docker buildx create --use).",
)
@click.option(
    "--wait",
    "wait_s",
    type=click.IntRange(0, None),
    default=BUILD_WAIT_S,
    show_default=True,
    envvar="SM120_STACKS_BUILD_WAIT",
    metavar="SECONDS",
    help="While another build of this stack runs, wait this long for it (then use its image "
    "when it built this content hash) before failing; 0: fail at once (env "
    "SM120_STACKS_BUILD_WAIT).",
)
@allow_unsigned_option
@engine_option
@allow_floating_option
@pass_settings
@user_errors
def build(
    settings: Settings,
    stack: str,
    pull_or_build: bool,
    registry: str | None,
    network: str,
    ca_bundle: str | None,
    hf_token_file: Path | None,
    max_jobs: int | None,
    no_cache: bool,
    cache_registry: str | None,
    cache_export: bool,
    wait_s: int,
    allow_unsigned: bool,
    allow_floating: bool,
) -> None:
    """Build the stack's image (nothing happens when its content hash is already built).

    --engine (or DOCKER_HOST) builds on another engine, ssh://USER@HOST included: the build
    context goes there, the image stays there, and `push` with the same --engine pushes it
    from there.
    """
    if registry_unused(registry, pull_or_build):
        raise StackError(
            "--registry is where --pull-or-build looks for the image: without it a build asks "
            "no registry (--cache-from-registry reuses a registry's layers)",
            key="--registry",
            hint="add --pull-or-build, or leave out --registry",
        )
    options = BuildOptions(
        network=network,
        ca_bundle=resolve_ca_bundle(ca_bundle),
        hf_token_file=hf_token_file,
        max_jobs=max_jobs,
        no_cache=no_cache,
        lock_wait_s=wait_s,
    )
    request = BuildRequest(
        options=options,
        pull_from=Registry.parse(registry) if pull_or_build else None,
        cache_from=Registry.parse(cache_registry) if cache_registry else None,
        cache_export=cache_export,
    )
    taken = inputs_taken(settings.stacks_dir)
    locked = settings.locked(stack, allow_floating)
    rendered = settings.render_locked(locked)
    engine = settings.connect()
    folders = (settings.build_dir, settings.stacks_dir)

    made = make_image(locked, rendered, request, engine, folders, taken, click.echo)
    if made.pull_from is not None:  # the registry has it: pulled with its evidence, said
        source = made.pull_from
        said = f"pulled {{ref}} from {source.repository}"
        _pull(settings, rendered, engine, source, said, allow_unsigned)
    if made.outcome is not None:
        _say_made(made.outcome, made.cache_sources)


def _say_made(outcome: BuildOutcome, cache_sources: tuple[str, ...]) -> None:
    """build's lines on stdout: up to date, or built with its log and cache sources."""
    if outcome.reused:
        click.echo(f"up to date: {outcome.image_ref}")
    else:
        click.echo(f"built {outcome.image_ref} in {outcome.seconds:.0f}s\n  log: {outcome.log}")
        if cache_sources:
            click.echo(f"  cache from: {', '.join(cache_sources)}")


@cli.command()
@click.argument("stack")
@registry_option("The registry to push to")
@click.option(
    "--force", is_flag=True, help="Push even when the image's static checks did not pass."
)
@signing_key_option
@engine_option
@pass_settings
@user_errors
def push(
    settings: Settings, stack: str, registry: str | None, force: bool, signing_key: str | None
) -> None:
    """Push the stack's current image (content tag and moving tag) and its evidence beside it
    (verdicts and test report, SBOM, provenance), each signed with --signing-key (the build
    key); print its digest. Recorded as pushed only once every document is in the registry."""
    from builder.evidence.publish import publish
    from builder.image.buildclient import detect_build_client

    signer = read_signing_key(signing_key)  # a bad key file: refused before anything moves
    locked = settings.locked(stack, allow_floating=True)
    resolved, rendered = locked.stack, settings.render_locked(locked)
    engine = settings.connect()
    target = Registry.parse(registry)
    layers = layer_lines("push", target.ref(content_tag(stack, rendered.content_hash())))
    client = detect_build_client(memo=client_memo(settings.build_dir)).kind
    again = (*(("--signing-key", signing_key) if signing_key else ()), *_engine_given(settings))
    published = publish(
        engine, target, resolved, rendered, settings.build_dir, client, force, layers, signer, again
    )
    layers.finish()
    click.echo(published.digest_ref)
    for artifact in published.artifacts:
        kind = artifact.annotation("dev.sm120-stacks.kind")
        click.echo(f"evidence: {kind} {artifact.digest}", err=True)
    if signer is not None:
        click.echo(
            f"signed by key {signer.key_id} (fingerprint {fingerprint(signer.key_id)}); its "
            "public key is published beside each document for hosts to trust on first use",
            err=True,
        )
    else:
        click.echo(
            "unsigned: hosts refuse it unless --allow-unsigned (push --signing-key FILE)",
            err=True,
        )


def _engine_given(settings: Settings) -> tuple[str, ...]:
    """`--engine ADDR` as the user gave it, for a command a hint repeats; () when not given."""
    engine = settings.engine_address() if settings.engine_given else None
    return ("--engine", engine) if engine else ()


@cli.command()
@click.argument("stack")
@registry_option("The registry to pull from")
@allow_unsigned_option
@engine_option
@pass_settings
@user_errors
def pull(settings: Settings, stack: str, registry: str | None, allow_unsigned: bool) -> None:
    """Pull the image of the stack's current content hash, with the verdicts its evidence in
    the registry gives (checked: they must name the image and be intact, and with a trust
    policy in the hosts folder, signed by keys it trusts); they are recorded here, so `pin`
    can rely on them."""
    rendered = settings.render_locked(settings.locked(stack, allow_floating=True))
    source = Registry.parse(registry)
    _pull(settings, rendered, settings.connect(), source, "{ref}", allow_unsigned)


def _pull(
    settings: Settings,
    rendered: RenderedContext,
    engine: Engine,
    source: Registry,
    said: str,
    allow_unsigned: bool = False,
) -> None:
    """`pull`'s and `build --pull-or-build`'s pull: the image with its evidence (read, checked
    and recorded by evidence/pull.py), its progress on stderr, said (with {ref}) and the
    verdicts on stdout."""
    from builder.cli.evidence import print_verdicts
    from builder.evidence.pull import pull_with_evidence

    layers = layer_lines("pull", source.ref(content_tag(rendered.stack, rendered.content_hash())))
    pulled = pull_with_evidence(
        rendered, settings.build_dir, engine, source, layers, settings.hosts_dir, allow_unsigned
    )
    layers.finish()
    for line in pulled.said:
        click.echo(line, err=True)
    click.echo(said.format(ref=pulled.ref))
    print_verdicts(pulled.evidence)
