"""The `sm120-stacks` command line: thin wrappers over the pipeline modules.

Every command turns StackError into a one-paragraph message and exit status 2; anything else
escaping is a bug in this tool and keeps its traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from builder.check import check_stack, violation_error
from builder.errors import EXIT_BAD_INPUT, StackError
from builder.manifest import Manifest
from builder.render import render, write_context
from builder.resolve import ResolvedStack, resolve, stack_names

F = TypeVar("F", bound=Callable[..., Any])

out = Console(highlight=False, width=120)


def user_errors(func: F) -> F:
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except StackError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


class Settings:
    def __init__(self, stacks_dir: Path, build_dir: Path) -> None:
        self.stacks_dir = stacks_dir
        self.build_dir = build_dir

    def resolve(self, name: str) -> ResolvedStack:
        return resolve(name, self.stacks_dir)


pass_settings = click.make_pass_decorator(Settings)


@click.group()
@click.option(
    "--stacks-dir",
    type=click.Path(path_type=Path),
    default=Path("stacks"),
    show_default=True,
    help="Folder of stack manifests (NAME.yaml).",
)
@click.option(
    "--build-dir",
    type=click.Path(path_type=Path),
    default=Path("build"),
    show_default=True,
    help="Where build contexts, logs and reports go.",
)
@click.version_option(package_name="sm120-stacks")
@click.pass_context
def cli(ctx: click.Context, stacks_dir: Path, build_dir: Path) -> None:
    """Build, test and pin vLLM + FlashInfer images for NVIDIA sm120/sm121 GPUs."""
    ctx.obj = Settings(stacks_dir, build_dir)


@cli.command("list")
@pass_settings
@user_errors
def list_stacks(settings: Settings) -> None:
    """Stacks with their status, targets and serve backend."""
    table = Table("stack", "status", "gpus", "cuda", "vllm", "moe backend", "check")
    for name in stack_names(settings.stacks_dir):
        try:
            stack = settings.resolve(name)
            result = check_stack(stack)
            m = stack.manifest
            vllm = m.python.packages.get("vllm")
            table.add_row(
                name,
                m.status,
                " ".join(m.gpus),
                m.cuda,
                vllm.version if vllm else "-",
                m.serve.moe_backend or "-",
                "ok" if result.ok else f"rule: {result.violations[0].rule.id}",
            )
        except StackError as exc:
            table.add_row(name, "invalid", "", "", "", "", f"`check {name}` says why")
            del exc
    out.print(table)


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
            result = check_stack(settings.resolve(name))
            if not result.ok:
                raise violation_error(result)
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
    resolved = settings.resolve(stack)
    result = check_stack(resolved)
    if not result.ok:
        raise violation_error(result)
    rendered = render(resolved)
    if to_stdout:
        click.echo(rendered.dockerfile, nl=False)
        return
    click.echo(write_context(rendered, settings.build_dir / stack / "context"))


@cli.command()
def schema() -> None:
    """The manifest JSON Schema, for editors."""
    document = Manifest.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "sm120-stacks manifest"
    click.echo(json.dumps(document, indent=2, sort_keys=True))


def main() -> None:
    cli(prog_name="sm120-stacks")
