"""`sm120-stacks test STACK`: validate the stack's current image and print the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from builder.cli.app import (
    Settings,
    ca_bundle_option,
    cli,
    engine_option,
    out,
    pass_settings,
    user_errors,
)
from builder.cli.smoke import progress_lines, soak_option
from builder.engine.mounts import SYNTAX, parse_mount
from builder.engine.protocol import Engine
from builder.errors import StackError
from builder.image.cabundle import resolve_ca_bundle
from builder.manifest.checkpoint import check_checkpoint
from builder.manifest.resolve import ResolvedStack
from builder.verify import model_folder
from builder.verify.kernel_cache import summary_lines
from builder.verify.kernel_watch import container_watch
from builder.verify.report import CacheRow, TestReport
from builder.verify.smoke_report import format_table
from builder.verify.validate import SmokeRunner, validate

#: The host's model folder for `test`, as `make stack MODELS=DIR` hands it over.
MODELS_ENV = "SM120_STACKS_MODELS"


def print_report(report: TestReport) -> None:
    table = Table("check", "result", "detail", title=f"{report.stack}  {report.image}")
    for check in report.checks:
        result = "skip" if check.skipped else ("pass" if check.passed else "FAIL")
        table.add_row(escape(check.name), result, escape(check.detail[:150]))
    out.print(table)
    if report.jit_cache:
        cache = Table("module", "arch", "size", "status", "detail", title="FlashInfer JIT cache")
        for row in report.jit_cache:
            cache.add_row(
                escape(_row_name(row)),
                " ".join(row.archs),
                "-" if row.kind == "not-precompiled" else f"{row.bytes / 1e6:.1f} MB",
                row.status,
                escape(_row_detail(row)),
            )
        out.print(cache)
    kernels = (report.smoke or {}).get("kernel_cache")
    for line in summary_lines(kernels, indent="", kernels=False):
        out.print(escape(line))
    if kernels is None and any(r.kind == "not-precompiled" for r in report.jit_cache):
        out.print("not-precompiled kernels compile on the serving GPU: the GPU smoke lists each")
    if report.smoke_skipped:
        out.print(f"GPU smoke: SKIPPED - {report.smoke_skipped}")
    elif report.smoke is not None:
        out.print(f"smoke: {'pass' if report.smoke.get('passed') else 'FAIL'}")
    out.print(f"{'PASSED' if report.passed else 'FAILED'}  report: {report.path}")


def _row_name(row: CacheRow) -> str:
    """A cached kernel, shorter: its folder without the _cute_dsl suffix, its key digest cut to
    6 hex (b12x_moe_sm120a/static_k4096_n1024_t8_r128_1bbab3); the JSON keeps the file's name."""
    if row.kind != "cached-kernel":
        return row.module
    folder, _, kernel = row.module.partition("/")
    digest = row.shape.get("digest")
    if digest and kernel.endswith(f"_{digest}"):
        kernel = kernel.removesuffix(digest) + digest[:6]
    return f"{folder.removesuffix('_cute_dsl')}/{kernel}"


def _row_detail(row: CacheRow) -> str:
    if row.kind == "cached-kernel":  # the shape is in the name already
        return row.detail.split("; ", 1)[-1][:80]
    return row.detail if row.kind == "not-precompiled" else row.detail[:80]


@cli.command("test")
@click.argument("stack")
@click.option("--require-gpu", is_flag=True, help="Fail instead of skipping the GPU smoke.")
@click.option(
    "--volume",
    "volumes",
    multiple=True,
    metavar=SYNTAX,
    help="A host folder for the smoke server (e.g. a model directory), read-only; the syntax "
    "of `pin --volume`.",
)
@click.option(
    "--mount",
    "mounts",
    multiple=True,
    metavar=SYNTAX,
    help="Deprecated spelling of --volume (accepted for one release, with a warning).",
)
@click.option(
    "--models",
    "models_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=model_folder.DEFAULT_MODELS,
    show_default=True,
    envvar=MODELS_ENV,
    metavar="DIR",
    help="The host's model folder, mounted read-only at /models for the smoke as `pin` mounts "
    "it, where no --mount gives the model. A smoke that would run without its model stops "
    f"first with the download command (env {MODELS_ENV}; `make stack MODELS=DIR`).",
)
@ca_bundle_option
@soak_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@engine_option
@pass_settings
@user_errors
def test_command(
    settings: Settings,
    stack: str,
    require_gpu: bool,
    volumes: tuple[str, ...],
    mounts: tuple[str, ...],
    models_dir: Path,
    ca_bundle: str | None,
    soak_s: int | None,
    as_json: bool,
) -> None:
    """Validate the stack's current image: static checks, JIT cache, smoke prompt."""
    proxy_ca = resolve_ca_bundle(ca_bundle)  # what builds were given: the image holds none of it
    locked = settings.locked(stack, allow_floating=True)  # the lock read once, handed down
    resolved = locked.stack
    given = _smoke_mounts(volumes, mounts)
    parsed = model_folder.with_models_folder(resolved, given, models_dir)
    model_dir = model_folder.locate(resolved, parsed).folder()
    if model_dir is not None:
        said = check_checkpoint(resolved, model_dir)
        if said:
            click.echo(f"model: {said}", err=True)
    engine = settings.connect()
    skipped = _smoke_skipped(engine, resolved, require_gpu)
    if skipped is None:  # the smoke will start a server: its model must be here first
        model_folder.require(resolved, parsed, models_dir)
    smoke = _smoke_runner(engine, resolved, parsed, skipped, as_json, soak_s)
    report = validate(
        engine, resolved, settings.render_locked(locked), settings.build_dir, proxy_ca, smoke
    )
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print_report(report)
    if not report.passed:
        raise SystemExit(1)


def _smoke_mounts(volumes: tuple[str, ...], mounts: tuple[str, ...]) -> dict[str, str]:
    """--volume (and the deprecated --mount) as the smoke's read-only binds, host folder to
    container path: the syntax pin's --volume takes (engine/mounts.py); a host folder that
    exists, since the smoke server reads what is there."""
    if mounts:
        click.echo(
            f"warning: --mount is deprecated and goes in the next release: write --volume {SYNTAX}",
            err=True,
        )
    parsed = {}
    given = [("--volume", text) for text in volumes] + [("--mount", text) for text in mounts]
    for option, text in given:
        mount = parse_mount(text, option)
        if not mount.bind or not Path(mount.source).exists():
            raise StackError(
                f"{option} {text!r}: the smoke mounts host folders; {mount.source} is not one "
                "that exists here",
                key=option,
                hint=f"write {option} /HOST/FOLDER:/CONTAINER/PATH[:ro]",
            )
        parsed[str(Path(mount.source).resolve())] = mount.target
    return parsed


def _smoke_skipped(engine: Engine, stack: ResolvedStack, require_gpu: bool) -> str | None:
    """Why the smoke will not run here (None: it will); with --require-gpu, a GPU this engine's
    host lacks is an error instead. Asked before the static checks, so that a smoke missing its
    model is refused before any container starts."""
    if stack.manifest.smoke.needs_gpu:
        from builder.verify.gpu_gate import gpu_gate

        skip = gpu_gate(engine, require_gpu=require_gpu)
        if skip is not None:
            return skip
    if not stack.manifest.smoke.prompts:
        return "the manifest lists no smoke prompts"
    return None


def _smoke_runner(
    engine: Engine,
    stack: ResolvedStack,
    mounts: dict[str, str],
    skipped: str | None,
    as_json: bool,
    soak_s: int | None = None,
) -> SmokeRunner:
    """A callable for validate(): runs the smoke prompt, or says why it was skipped. With --json,
    stdout carries the JSON report alone, so the smoke's own table goes to stderr."""

    def run(image_ref: str, report_dir: Path) -> dict[str, Any] | str:
        from builder.verify import smoke, soak  # imports requests: paid only when a smoke runs

        if skipped is not None:
            return skipped
        needs_gpu = stack.manifest.smoke.needs_gpu
        result = smoke.run_smoke(
            engine,
            image_ref,
            stack,
            mounts=mounts,
            gpu=needs_gpu,
            kernel_cache=container_watch(engine, image_ref, stack),
            report_path=report_dir / f"{stack.name}-smoke.json",
            log=lambda line: click.echo(line, err=True),
            after=soak.after_smoke(
                stack,
                soak_s,
                report_dir / f"{stack.name}-soak",
                log=lambda x: click.echo(x, err=True),
                progress=progress_lines(as_json),
            ),
            progress=progress_lines(as_json),
        )
        table = format_table(result)
        if as_json:
            click.echo(table, err=True)
        else:
            out.print(table)
        return dict(result.to_json())

    return run
