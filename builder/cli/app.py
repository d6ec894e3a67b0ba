"""The `sm120-stacks` command line: thin wrappers over the pipeline modules.

Every command turns StackError into a one-paragraph message and exit status 2; anything else
escaping is a bug in this tool and keeps its traceback.
"""

from __future__ import annotations

import errno
import importlib
import pkgutil
import signal
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from builder.cli import DEFAULT_BUILD_DIR, DEFAULT_STACKS_DIR, console_width
from builder.engine import address
from builder.engine.protocol import Engine
from builder.errors import (
    EXIT_BAD_INPUT,
    EngineError,
    EngineUnreachable,
    OperationFailed,
    StackError,
    ToolMissing,
    engine_lost,
)
from builder.image.cabundle import ENV_VAR as CA_BUNDLE_ENV
from builder.image.cabundle import OPT_OUT as CA_BUNDLE_OPT_OUT
from builder.image.registry import REGISTRY_ENV
from builder.judge.judgement import Judgement, judge
from builder.lock.locked import LockedStack, lock_stack
from builder.manifest.check import violation_error
from builder.manifest.resolve import ResolvedStack, resolve
from builder.manifest.substitute import ENV_VAR as SUBSTITUTE_ENV
from builder.manifest.substitute import Substitutions
from builder.render.context import RenderedContext, render_locked
from builder.render.digests import DigestCache

F = TypeVar("F", bound=Callable[..., Any])

#: What commands print tables and lines through: as wide as the terminal (console_width).
out = Console(highlight=False, width=console_width())


def user_errors(func: F) -> F:
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except StackError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except OperationFailed as exc:
            click.echo(f"failed: {exc}", err=True)
            sys.exit(1)
        except EngineUnreachable as exc:  # the engine went away mid-command (stopped, killed)
            click.echo(f"failed: {engine_lost(exc.explanation, 'run the command again')}", err=True)
            sys.exit(1)
        except EngineError as exc:  # the engine refused what the input asked: not a bug here
            click.echo(f"failed: the Docker engine: {exc.explanation}", err=True)
            sys.exit(1)
        except Terminated:
            click.echo("terminated", err=True)
            sys.exit(128 + signal.SIGTERM)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(128 + signal.SIGINT)
        except OSError as exc:
            if isinstance(exc, BAD_PATH):  # --build-dir a file, a folder not writable, ...
                click.echo(f"error: {exc.filename}: {exc.strerror}", err=True)
                sys.exit(EXIT_BAD_INPUT)
            if exc.errno not in NO_SPACE:
                raise
            target = exc.filename2 or exc.filename  # a copy names its source first
            where = f" writing {target}" if target else ""
            click.echo(
                f"failed: no space left on the device{where} ({exc.strerror}); every file this "
                "tool writes is replaced whole, so none was left half-written: free space and "
                "run the command again",
                err=True,
            )
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


#: A full disk (or quota) is the machine's state, not a bug: a message and exit status 1.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
#: A path the command was given or works under is of the wrong kind or not ours to write.
BAD_PATH = (NotADirectoryError, IsADirectoryError, PermissionError)


class Terminated(KeyboardInterrupt):
    """SIGTERM (systemd, CI runners, `kill`) stops a build the way Ctrl-C does: the build and
    its client are stopped and nothing is tagged. Shells start background jobs with SIGINT
    ignored, so SIGTERM is often the only signal that reaches us."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


class Settings:
    def __init__(
        self,
        stacks_dir: Path,
        build_dir: Path,
        substitutions: Substitutions,
        hosts_dir: Path | None = None,
    ) -> None:
        self.stacks_dir = stacks_dir
        self.build_dir = build_dir
        self.substitutions = substitutions
        #: Folder of host pins: --hosts-dir, else hosts/ beside the stacks folder.
        self.hosts_dir = hosts_dir if hosts_dir is not None else stacks_dir.parent / "hosts"
        self._digests: DigestCache | None = None
        #: The engine a command works on, as --engine said; unset: DOCKER_HOST, else the local
        #: socket (`engine_address`). Handed to the engine adapter and the build client, never
        #: written into the process environment.
        self.engine: str | None = None
        self.engine_given = False

    def engine_address(self) -> str | None:
        """--engine, else DOCKER_HOST (checked), else None: the local socket."""
        return self.engine if self.engine_given else address.from_environment()

    def connect(self) -> Engine:
        """The command's engine, once it answered (ToolMissing, naming it, when it does not)."""
        from builder.engine.docker_adapter import connect_engine  # the SDK only where needed

        return connect_engine(self.engine_address())

    def connect_or_why(self) -> tuple[Engine | None, str | None]:
        """The engine, or None and why: for commands that still do their work without one
        (`lock` without the base images' digests, `doctor` reporting the engine missing)."""
        try:
            return self.connect(), None
        except ToolMissing as exc:
            return None, exc.message

    def resolve(self, name: str) -> ResolvedStack:
        return resolve(name, self.stacks_dir, self.substitutions)

    def render(self, stack: ResolvedStack) -> RenderedContext:
        """The stack's build context, its lock read here (a stale lock is an error): for a
        command that holds no LockedStack. One that does hands it to render_locked."""
        return self.render_locked(self._fresh(lock_stack(stack)))

    def render_locked(self, locked: LockedStack) -> RenderedContext:
        """The stack's build context, rendered once per command and handed to every step;
        large files' digests are remembered under the build folder between commands."""
        if self._digests is None:
            self._digests = DigestCache(self.build_dir / "cache" / "digests.json")
        rendered = render_locked(locked, digests=self._digests)
        self._digests.save()
        return rendered

    def judge(self, name: str, allow_floating: bool = False) -> Judgement:
        """The stack and its lock judged once, in judge's one order (builder/judge)."""
        stack = self.resolve(name)
        locked = lock_stack(stack)
        return judge(locked, allow_floating)

    def checked(self, name: str) -> ResolvedStack:
        """A resolved stack that passed the rules on its manifest (its lock may be stale or
        missing: `lock` makes it again)."""
        judgement = self.judge(name, allow_floating=True)
        if not judgement.on_manifest.ok:
            raise violation_error(judgement.on_manifest)
        return judgement.locked.stack

    def locked(self, name: str, allow_floating: bool = False) -> LockedStack:
        """The resolved stack with the lock it builds from read once, when every step of the
        judgement passed (builder/judge): the value a command hands down to render and build."""
        return self.judge(name, allow_floating).passed()

    @staticmethod
    def _fresh(locked: LockedStack) -> LockedStack:
        if locked.stale is not None:
            raise locked.stale
        return locked


pass_settings = click.make_pass_decorator(Settings)


allow_floating_option = click.option(
    "--allow-floating-base",
    "allow_floating",
    is_flag=True,
    help="Accept a registry base image not pinned by digest (its evidence says so).",
)

#: The proxy CA: given to builds (`build`), looked for in images (`test`), trusted by index
#: queries. One option for every command that takes it, so they agree; the command resolves it
#: (resolve_ca_bundle) inside user_errors, so a missing file exits 2 with its message.
ca_bundle_option = click.option(
    "--ca-bundle",
    "ca_bundle",
    metavar="FILE|none",
    envvar=CA_BUNDLE_ENV,
    help="CA bundle of a TLS-intercepting proxy: builds get it as a BuildKit secret (in no "
    "layer), `test` checks that no image holds it, index queries trust it. Default: this "
    f"host's system trust store; `{CA_BUNDLE_OPT_OUT}`: no bundle (env {CA_BUNDLE_ENV}).",
)


REGISTRY_FORM = "HOST[:PORT][/NAMESPACE]"


def registry_option(purpose: str) -> Callable[[F], F]:
    """--registry, alike in every command that takes it: HOST[:PORT][/NAMESPACE], default
    SM120_STACKS_REGISTRY (image.registry.Registry parses it). purpose: what this command does
    with it, for its help."""
    return click.option(
        "--registry",
        envvar=REGISTRY_ENV,
        metavar=REGISTRY_FORM,
        help=f"{purpose} (default: env {REGISTRY_ENV}).",
    )


def given_here(ctx: click.Context, name: str) -> bool:
    """The option was written on the command line (not a default, not its env variable):
    refusing an option that does not apply must not refuse a variable set for other commands."""
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


def _use_engine(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is None:
        return
    try:
        checked = address.check_address(value)
    except StackError as exc:
        raise click.BadParameter(f"{exc.message}; {exc.hint}") from None
    settings = ctx.find_object(Settings)
    assert settings is not None, "the group makes Settings before any command's options"
    settings.engine, settings.engine_given = checked, True


#: The engine a command works on, stored in the command's Settings: the docker SDK and the
#: build client it starts are both given it (builder.engine.address).
engine_option = click.option(
    "--engine",
    metavar="ADDRESS",
    expose_value=False,
    callback=_use_engine,
    help="The Docker engine to work on: unix:///PATH, ssh://[USER@]HOST[:PORT] (keys from your "
    "ssh agent) or tcp://HOST:PORT. Default: DOCKER_HOST, else the local socket.",
)

#: Which module defines each command: a command imports only its own step's modules, so `show`
#: never pays for the docker SDK and `build` never for pytest. A command missing here is still
#: found (every module is imported then); tests/test_cli.py keeps this table complete.
COMMAND_MODULES = {
    "list": "builder.cli.stacks",
    "show": "builder.cli.stacks",
    "check": "builder.cli.stacks",
    "render": "builder.cli.stacks",
    "build": "builder.cli.images",
    "push": "builder.cli.images",
    "pull": "builder.cli.images",
    "schema": "builder.cli.stacks",
    "test": "builder.cli.verify",
    "smoke": "builder.cli.smoke",
    "lock": "builder.cli.lock",
    "pin": "builder.cli.pin",
    "deploy": "builder.cli.hosts",
    "drift": "builder.cli.hosts",
    "verify": "builder.cli.hosts",  # the old name of drift, for one release
    "doctor": "builder.cli.doctor",
    "outdated": "builder.cli.upstream",
    "propose": "builder.cli.upstream",
    "audit": "builder.cli.upstream",
    "diff": "builder.cli.upstream",
    "evidence": "builder.cli.evidence",
    "cache": "builder.cli.warm",
    "report": "builder.cli.report",
    "docs": "builder.cli.docs",
    "keys": "builder.cli.keys",
}


class LazyGroup(click.Group):
    """Imports a command's module when that command is asked for (or all, for --help)."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            module = COMMAND_MODULES.get(cmd_name)
            if module is not None:
                importlib.import_module(module)
            if cmd_name not in self.commands:
                import_all_commands()
        return self.commands.get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        import_all_commands()
        return sorted(self.commands)


def import_all_commands() -> None:
    """Every module of this package but the group and the entry point defines commands."""
    package = Path(__file__).parent
    for info in pkgutil.iter_modules([str(package)]):
        if info.name not in {"app", "main"}:
            importlib.import_module(f"{__package__}.{info.name}")


@click.group(cls=LazyGroup)
@click.option(
    "--stacks-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_STACKS_DIR,
    show_default=True,
    help="Folder of stack manifests (NAME.yaml).",
)
@click.option(
    "--build-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_BUILD_DIR,
    show_default=True,
    help="Where build contexts, logs and reports go.",
)
@click.option(
    "--hosts-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Folder of host pins (HOST.yaml)  [default: hosts/ beside the stacks folder]",
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
def cli(
    ctx: click.Context,
    stacks_dir: Path,
    build_dir: Path,
    hosts_dir: Path | None,
    substitute: tuple[str, ...],
) -> None:
    """Build, test and pin vLLM + FlashInfer images for NVIDIA sm120/sm121 GPUs."""
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        substitutions = Substitutions.parse(substitute)
    except StackError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    ctx.obj = Settings(stacks_dir, build_dir, substitutions, hosts_dir)
