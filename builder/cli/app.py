"""The `sm120-stacks` command line: thin wrappers over the pipeline modules.

Every command turns StackError into a one-paragraph message and exit status 2; anything else
escaping is a bug in this tool and keeps its traceback.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from builder.errors import EXIT_BAD_INPUT, StackError
from builder.image.build import BuildFailed
from builder.image.registry import RegistryError
from builder.spec.check import check_stack, violation_error
from builder.spec.resolve import ResolvedStack, resolve
from builder.spec.substitute import ENV_VAR as SUBSTITUTE_ENV
from builder.spec.substitute import Substitutions

F = TypeVar("F", bound=Callable[..., Any])

out = Console(highlight=False, width=160)


def user_errors(func: F) -> F:
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except StackError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except (BuildFailed, RegistryError) as exc:
            click.echo(f"failed: {exc}", err=True)
            sys.exit(1)
        except Terminated:
            click.echo("terminated", err=True)
            sys.exit(128 + signal.SIGTERM)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(128 + signal.SIGINT)

    return wrapper  # type: ignore[return-value]


class Terminated(KeyboardInterrupt):
    """SIGTERM (systemd, CI runners, `kill`) stops a build the way Ctrl-C does: the build and
    its client are stopped and nothing is tagged. Shells start background jobs with SIGINT
    ignored, so SIGTERM is often the only signal that reaches us."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


class Settings:
    def __init__(self, stacks_dir: Path, build_dir: Path, substitutions: Substitutions) -> None:
        self.stacks_dir = stacks_dir
        self.build_dir = build_dir
        self.substitutions = substitutions

    def resolve(self, name: str) -> ResolvedStack:
        return resolve(name, self.stacks_dir, self.substitutions)

    def checked(self, name: str) -> ResolvedStack:
        """A resolved stack that passed every compatibility rule."""
        stack = self.resolve(name)
        result = check_stack(stack)
        if not result.ok:
            raise violation_error(result)
        return stack


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
@click.option(
    "--substitute-base",
    "substitute",
    multiple=True,
    metavar="FROM=TO",
    envvar=SUBSTITUTE_ENV,
    help="Build FROM a mirror or local image instead (every stack; env "
    f"{SUBSTITUTE_ENV}, comma-separated).",
)
@click.version_option(package_name="sm120-stacks")
@click.pass_context
def cli(ctx: click.Context, stacks_dir: Path, build_dir: Path, substitute: tuple[str, ...]) -> None:
    """Build, test and pin vLLM + FlashInfer images for NVIDIA sm120/sm121 GPUs."""
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        substitutions = Substitutions.parse(substitute)
    except StackError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    ctx.obj = Settings(stacks_dir, build_dir, substitutions)
