"""`sm120-stacks test STACK`: validate the stack's current image and print the report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from builder.cli.app import (
    Settings,
    ca_bundle_option,
    cli,
    engine_option,
    given_here,
    out,
    pass_settings,
    registry_option,
    user_errors,
)
from builder.cli.keys import read_signing_key, signing_key_option
from builder.engine.mounts import SYNTAX, parse_mount
from builder.engine.progress import Say
from builder.engine.protocol import Engine
from builder.errors import EngineError, OperationFailed, StackError
from builder.evidence.keys import PublicKey, SigningKey
from builder.image.cabundle import resolve_ca_bundle
from builder.manifest.checkpoint import check_checkpoint
from builder.manifest.resolve import ResolvedStack
from builder.verify import model_folder
from builder.verify.kernel_cache import summary_lines
from builder.verify.kernel_watch import container_watch, directory_watch
from builder.verify.report import CacheRow, TestReport
from builder.verify.smoke_report import format_table
from builder.verify.validate import SmokeRunner, validate

if TYPE_CHECKING:
    from builder.image.registry import Registry

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


def progress_lines(as_json: bool) -> Say | None:
    """Where the health wait's and the soak's progress lines go: stderr, or nowhere when
    --json asked for output a program reads."""
    return None if as_json else lambda line: click.echo(line, err=True)


#: `test --soak` and `smoke --soak`: the manifest's smoke.soak.seconds unless given.
soak_option = click.option(
    "--soak",
    "soak_s",
    type=click.IntRange(0, 7 * 24 * 3600),
    default=None,
    metavar="SECONDS",
    help="After the smoke, keep the stack's concurrency of streaming chats going this long; "
    "fail on a stall, errors or memory growth (default: the manifest's smoke.soak.seconds; "
    "0: no soak). Report, CSV and PNG beside the smoke's.",
)


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


@cli.command("smoke")
@click.argument("stack")
@click.option(
    "--url",
    required=True,
    metavar="URL",
    help="Base URL of a server the tool did not start (e.g. http://127.0.0.1:8000).",
)
@click.option(
    "--server-log",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The server's log file, read after the requests for runtime compiles of every kind.",
)
@click.option(
    "--model",
    help="The model name the server serves, where it is not the manifest's.",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Where the JSON report goes (default build/STACK/reports/STACK-url-smoke.json).",
)
@click.option(
    "--jit-cache-dir",
    type=click.Path(path_type=Path, file_okay=False),
    metavar="PATH",
    help="The server's runtime cache directory on this machine (e.g. the host path of the pin's "
    "cache volume): its GPU-compiled kernels (FlashInfer's CuTe-DSL cache) are listed before "
    "the requests and after, each a hit or a miss.",
)
@soak_option
@click.option(
    "--server-pid",
    type=click.IntRange(1),
    metavar="PID",
    help="The server's process on this machine: the soak judges the memory of it and its "
    "children (without it, memory is not judged).",
)
@click.option(
    "--api-key-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="A file holding the server's API key (sent as `Authorization: Bearer KEY`; never "
    "written to the report or the log).",
)
@click.option(
    "--record",
    is_flag=True,
    help="Add the verdict to the image's evidence in the registry (--registry): one host's "
    "smoke counts for every host of its GPU kind.",
)
@registry_option("With --record: the registry the image is in")
@click.option(
    "--gpu-kind",
    metavar="NAME",
    help="With --record: the server's GPU as nvidia-smi names it (default: read here, where "
    "the server is local).",
)
@click.option(
    "--image",
    metavar="REPO@sha256:DIGEST",
    help="With --record: the image the server runs (required for a server this machine's "
    "engine does not run; default: read from the local container publishing the URL's port).",
)
@signing_key_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_settings
@user_errors
def smoke_command(
    settings: Settings,
    stack: str,
    url: str,
    server_log: Path | None,
    model: str | None,
    report_path: Path | None,
    jit_cache_dir: Path | None,
    soak_s: int | None,
    server_pid: int | None,
    api_key_file: Path | None,
    record: bool,
    registry: str | None,
    gpu_kind: str | None,
    image: str | None,
    signing_key: str | None,
    as_json: bool,
) -> None:
    """Judge a running server with the stack's smoke: answers, garbage, runtime compiles, TTFT,
    floors. The server runs elsewhere (started by hand, by `deploy`, on another host); with
    --record, its verdict joins the evidence of the stack's current image in the registry (a
    host of the same GPU kind can then be pinned to it). Start it with
    FLASHINFER_JIT_VERBOSE=1, or FlashInfer's compiles leave no line in its log."""
    from builder.verify import smoke, soak  # imports requests: paid only when a smoke runs

    _refuse_record_options(record)
    signer = read_signing_key(signing_key) if record else None  # before the smoke, too
    if record:  # its form is checked before the smoke, not after minutes of it
        _parse_registry(registry)
    resolved = settings.checked(stack)
    if not url.startswith(("http://", "https://")):
        raise StackError(f"--url {url!r} is not an http(s) URL", key="--url")
    if not resolved.manifest.smoke.prompts:
        raise StackError(f"{stack} lists no smoke prompts", key="smoke.prompts")
    path = report_path or settings.build_dir / resolved.name / "reports" / f"{stack}-url-smoke.json"
    result = smoke.run_smoke_url(
        url,
        resolved,
        report_path=path,
        server_log=server_log,
        model=model,
        kernel_cache=directory_watch(resolved, jit_cache_dir) if jit_cache_dir else None,
        api_key=api_key_file.read_text().strip() if api_key_file else None,
        log=lambda line: click.echo(line, err=True),
        after=soak.after_smoke(
            resolved,
            soak_s,
            path.with_name(path.stem.removesuffix("-smoke") + "-soak"),
            server_pid=server_pid,
            log=lambda line: click.echo(line, err=True),
            progress=progress_lines(as_json),
        ),
        progress=progress_lines(as_json),
    )
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, sort_keys=True))
    if record:
        served = _Served(url, image, gpu_kind)
        _record_served(settings, resolved, result.to_json(), registry, served, signer)
    if not result.passed:
        raise SystemExit(1)


def _engine_or_none(settings: Settings) -> Engine | None:
    """This machine's engine where it answers (a local server's container is read there)."""
    try:
        return settings.connect()
    except (EngineError, StackError, OperationFailed):
        return None


def _refuse_record_options(record: bool) -> None:
    """smoke --url's --registry and --gpu-kind say where --record adds the verdict: written
    on the command line without it, they are refused."""
    ctx = click.get_current_context()
    for name in ("registry", "gpu_kind", "image"):
        if not record and given_here(ctx, name):
            option = "--" + name.replace("_", "-")
            raise StackError(
                f"{option} names where --record adds the verdict: without --record nothing is "
                "recorded",
                key=option,
                hint=f"add --record, or leave out {option}",
            )


def _parse_registry(registry: str | None) -> None:
    from builder.image.registry import Registry  # the HTTP client: only where it is used

    Registry.parse(registry)


def _index_signers(
    settings: Settings, target: Registry, digest: str, signer: SigningKey | None
) -> list[PublicKey]:
    """The keys whose index `smoke --record` builds its next version on (evidence/index.py):
    those the hosts' policy trusts, or where there is none the key first use would trust
    (the build key; nothing is written)."""
    from builder.evidence.firstuse import learn
    from builder.evidence.index import index_signers
    from builder.evidence.oci import ArtifactStore
    from builder.evidence.trust import host_policy, policy_path

    if signer is None:
        return []
    policy = host_policy(settings.hosts_dir)
    if policy is None:
        policy = learn(ArtifactStore(target), digest, policy_path(settings.hosts_dir)).policy()
    return index_signers(policy)


@dataclass(frozen=True)
class _Served:
    """The server smoked: its URL, the image named for it (--image), its GPU kind."""

    url: str
    image: str | None
    gpu_kind: str | None


def _record_served(
    settings: Settings,
    stack: ResolvedStack,
    report: dict[str, Any],
    registry: str | None,
    served: _Served,
    signer: SigningKey | None = None,
) -> None:
    """The smoke's served verdict, added to the evidence of the image the server runs
    (cli/served_image.py), signed by signer (the operator's key) where given; the evidence it
    extends is read first, checked (signatures against the hosts' policy, or the keys
    published beside them)."""
    from builder.cli.served_image import served_digest
    from builder.engine.hostprobe import gather
    from builder.evidence.attach import attach_served
    from builder.evidence.reader import read_evidence
    from builder.evidence.trust import host_policy
    from builder.image.records import load_record, save_record
    from builder.image.registry import Registry
    from builder.verify.served import served_verdict

    content_hash = settings.render(stack).content_hash()
    target = Registry.parse(registry)
    gpu_kind = served.gpu_kind
    tagged = read_evidence(target, stack.name, content_hash, trust=host_policy(settings.hosts_dir))
    digest = served_digest(
        served.url, served.image, target, _engine_or_none(settings), tagged.digest
    )
    evidence = tagged
    if digest != tagged.digest:  # the image the server runs must have its own, of this content
        evidence = read_evidence(
            target,
            stack.name,
            content_hash,
            reference=digest,
            trust=host_policy(settings.hosts_dir),
        )
    facts = gather(None, None) if stack.manifest.smoke.needs_gpu and gpu_kind is None else None
    if stack.manifest.smoke.needs_gpu and gpu_kind is None and not (facts and facts.gpus):
        raise StackError(
            "the server's GPU kind is not known here (no GPU on this machine)",
            key="--gpu-kind",
            hint="name it: --gpu-kind 'NVIDIA RTX PRO 6000 Blackwell Server Edition' (as "
            "`sm120-stacks doctor` on the server's host prints it)",
        )
    verdict = served_verdict(stack, report, facts, "smoke --url", gpu_kind)
    local = load_record(settings.build_dir, stack.name, content_hash)
    attached = attach_served(
        target,
        evidence.digest,
        local,
        verdict,
        report,
        signer,
        _index_signers(settings, target, evidence.digest, signer),
    )
    local.add_served(verdict)
    save_record(settings.build_dir, local)
    state = "passed" if verdict.passed else "failed"
    signed = (
        f"signed by key {signer.key_id[:16]}"
        if signer is not None
        else "unsigned: a host with a trust policy will not count it (--signing-key)"
    )
    click.echo(
        f"recorded: served on {verdict.gpu_kind} ({state}) for {evidence.ref}: "
        f"{attached.digest}\n  {signed}",
        err=True,
    )
