"""Commands over stacks, from manifest to registry: list, show, check, render, build, push, pull."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from builder.cli.app import Settings, cli, out, pass_settings, user_errors
from builder.errors import StackError
from builder.image.build import BuildOptions, build_stack, stack_dir_lock
from builder.image.distribute import pull_stack, push_stack, registry_has_current
from builder.image.engine import detect_build_client, engine_api
from builder.image.names import HASH_CHARS
from builder.image.records import Record, load_record
from builder.image.registry import Registry
from builder.lock.lockfile import current_lock
from builder.render.context import render, write_context
from builder.spec.check import check_stack, violation_error
from builder.spec.manifest import Manifest
from builder.spec.resolve import stack_names


@cli.command("list")
@pass_settings
@user_errors
def list_stacks(settings: Settings) -> None:
    """Stacks with status, targets and whether their current content hash is built, tested
    and pushed."""
    table = Table(
        "stack",
        "status",
        "gpus",
        "cuda",
        "vllm",
        "moe backend",
        "check",
        "content",
        "built",
        "tested",
        "pushed",
    )
    for name in stack_names(settings.stacks_dir):
        try:
            stack = settings.resolve(name)
        except StackError:
            table.add_row(name, "invalid", "", "", "", "", f"`check {name}` says why")
            continue
        result = check_stack(stack)
        m = stack.manifest
        vllm = m.python.packages.get("vllm")
        content_hash = render(stack).content_hash()
        record = load_record(settings.build_dir, name, content_hash)
        table.add_row(
            name,
            m.status,
            " ".join(m.gpus),
            m.cuda,
            vllm.version if vllm else "-",
            m.serve.moe_backend or "-",
            "ok" if result.ok else f"rule: {result.violations[0].rule.id}",
            content_hash[:HASH_CHARS],
            "yes" if record.image_id else "no",
            _verdict(record),
            ", ".join(record.pushed) or "no",
        )
    out.print(table)


def _verdict(record: Record) -> str:
    if record.tests == "passed" and (record.smoke or "").startswith("skipped"):
        return "passed, smoke skipped"
    return record.tests or "no"


@cli.command()
@click.argument("stack")
@pass_settings
@user_errors
def show(settings: Settings, stack: str) -> None:
    """The resolved manifest (after extends) with its derived arch flags, as JSON."""
    click.echo(json.dumps(settings.resolve(stack).to_json(), indent=2, sort_keys=True))


@cli.command()
@click.argument("stacks", nargs=-1)
@pass_settings
@user_errors
def check(settings: Settings, stacks: tuple[str, ...]) -> None:
    """Validate stacks and their compatibility rules (all stacks when none are named)."""
    names = list(stacks) or stack_names(settings.stacks_dir)
    failures: list[StackError] = []
    for name in names:
        try:
            stack = settings.resolve(name)
            result = check_stack(stack)
            if not result.ok:
                raise violation_error(result)
            current_lock(stack)  # a lock that no longer matches its manifest is an error too
            click.echo(f"ok  {name}")
        except StackError as exc:
            click.echo(f"BAD {name}", err=True)
            failures.append(exc)
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise StackError(f"{len(failures)} stacks failed:\n" + "\n".join(map(str, failures)))


@cli.command("render")
@click.argument("stack")
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the Dockerfile only.")
@pass_settings
@user_errors
def render_cmd(settings: Settings, stack: str, to_stdout: bool) -> None:
    """Write the complete build context to BUILD_DIR/STACK/context and print its path."""
    rendered = render(settings.checked(stack))
    if to_stdout:
        click.echo(rendered.dockerfile, nl=False)
        return
    with stack_dir_lock(settings.build_dir / stack):
        click.echo(write_context(rendered, settings.build_dir / stack / "context"))


registry_option = click.option(
    "--registry",
    envvar="SM120_STACKS_REGISTRY",
    metavar="HOST[:PORT][/NAMESPACE]",
    help="Registry to push to / pull from (env SM120_STACKS_REGISTRY).",
)


def _ca_bundle(value: Path | None) -> Path | None:
    if value is not None and not value.is_file():
        raise StackError(f"CA bundle {value} does not exist", key="--ca-bundle")
    return value


@cli.command()
@click.argument("stack")
@click.option(
    "--pull-or-build",
    is_flag=True,
    help="Pull the image of this exact content hash when the registry has it.",
)
@registry_option
@click.option("--network", default="host", show_default=True, help="Network for RUN steps.")
@click.option(
    "--ca-bundle",
    type=click.Path(path_type=Path),
    envvar="SM120_STACKS_CA_BUNDLE",
    help="CA bundle of a TLS-intercepting proxy, passed as a BuildKit secret.",
)
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
@pass_settings
@user_errors
def build(
    settings: Settings,
    stack: str,
    pull_or_build: bool,
    registry: str | None,
    network: str,
    ca_bundle: Path | None,
    hf_token_file: Path | None,
    max_jobs: int | None,
    no_cache: bool,
) -> None:
    """Build the stack's image (nothing happens when its content hash is already built)."""
    resolved = settings.checked(stack)
    api = engine_api()
    if pull_or_build:
        target = Registry.parse(registry)
        if registry_has_current(resolved, api, target):
            ref = pull_stack(resolved, settings.build_dir, api, target)
            click.echo(f"pulled {ref} from {target.repository}")
            return
        click.echo(f"{target.repository} has no image of this content hash; building")
    options = BuildOptions(
        network=network,
        ca_bundle=_ca_bundle(ca_bundle),
        hf_token_file=hf_token_file,
        max_jobs=max_jobs,
        no_cache=no_cache,
    )
    outcome = build_stack(resolved, settings.build_dir, detect_build_client(), api, options)
    if outcome.reused:
        click.echo(f"up to date: {outcome.image_ref}")
    else:
        click.echo(f"built {outcome.image_ref} in {outcome.seconds:.0f}s\n  log: {outcome.log}")


@cli.command()
@click.argument("stack")
@registry_option
@click.option("--force", is_flag=True, help="Push even when the image's tests did not pass.")
@pass_settings
@user_errors
def push(settings: Settings, stack: str, registry: str | None, force: bool) -> None:
    """Push the stack's current image (content tag and moving tag); print its digest."""
    pushed = push_stack(
        settings.checked(stack),
        settings.build_dir,
        engine_api(),
        Registry.parse(registry),
        force=force,
    )
    click.echo(pushed.digest_ref)


@cli.command()
@click.argument("stack")
@registry_option
@pass_settings
@user_errors
def pull(settings: Settings, stack: str, registry: str | None) -> None:
    """Pull the image of the stack's current content hash."""
    click.echo(
        pull_stack(
            settings.checked(stack), settings.build_dir, engine_api(), Registry.parse(registry)
        )
    )


@cli.command()
def schema() -> None:
    """The manifest JSON Schema, for editors."""
    document = Manifest.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "sm120-stacks manifest"
    click.echo(json.dumps(document, indent=2, sort_keys=True))
