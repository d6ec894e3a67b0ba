"""`sm120-stacks smoke STACK --url URL`: judge a server the tool did not start, and with
--record add its served verdict to the image's evidence in the registry.

`test` runs the same smoke on a server it starts itself (cli/verify.py); the soak option and
where progress lines go are shared with it from here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from builder.cli.app import (
    Settings,
    cli,
    given_here,
    pass_settings,
    registry_option,
    user_errors,
)
from builder.cli.keys import read_signing_key, signing_key_option
from builder.engine.progress import Say
from builder.engine.protocol import Engine
from builder.errors import EngineError, OperationFailed, StackError
from builder.evidence.keys import PublicKey, SigningKey
from builder.manifest.resolve import ResolvedStack
from builder.verify.kernel_watch import directory_watch

if TYPE_CHECKING:
    from builder.engine.hostprobe import HostFacts
    from builder.evidence.reader import Evidence
    from builder.image.registry import Registry
    from builder.image.verdicts import ServedVerdict


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

    signer = _record_signer(record, registry, signing_key)
    resolved = _smoked_stack(settings, stack, url)
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


def _record_signer(
    record: bool, registry: str | None, signing_key: str | None
) -> SigningKey | None:
    """What --record needs, checked before the smoke, not after minutes of it: its options
    given only with it, the signing key read, the registry's form parsed."""
    _refuse_record_options(record)
    signer = read_signing_key(signing_key) if record else None
    if record:
        _parse_registry(registry)
    return signer


def _smoked_stack(settings: Settings, stack: str, url: str) -> ResolvedStack:
    """The stack whose smoke judges the server, checked by step 1 of the judgement only (the
    server's image is neither built nor locked here), and refused before any request where
    the URL is not http(s) or the manifest lists no prompt to send."""
    resolved = settings.checked(stack)
    if not url.startswith(("http://", "https://")):
        raise StackError(f"--url {url!r} is not an http(s) URL", key="--url")
    if not resolved.manifest.smoke.prompts:
        raise StackError(f"{stack} lists no smoke prompts", key="smoke.prompts")
    return resolved


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
    from builder.evidence.attach import attach_served
    from builder.image.records import load_record, save_record
    from builder.image.registry import Registry
    from builder.verify.served import served_verdict

    content_hash = settings.render(stack).content_hash()
    target = Registry.parse(registry)
    evidence = _served_evidence(settings, stack, content_hash, target, served)
    facts = _server_gpus(stack, served.gpu_kind)
    verdict = served_verdict(stack, report, facts, "smoke --url", served.gpu_kind)
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
    _say_recorded(verdict, evidence.ref, attached.digest, signer)


def _served_evidence(
    settings: Settings, stack: ResolvedStack, content_hash: str, target: Registry, served: _Served
) -> Evidence:
    """The evidence the verdict extends, checked against the hosts' policy: that of the image
    the server runs (cli/served_image.py), which must have its own evidence of this content
    where it is not the image the content tag names."""
    from builder.cli.served_image import served_digest
    from builder.evidence.reader import read_evidence
    from builder.evidence.trust import host_policy

    tagged = read_evidence(target, stack.name, content_hash, trust=host_policy(settings.hosts_dir))
    digest = served_digest(
        served.url, served.image, target, _engine_or_none(settings), tagged.digest
    )
    if digest == tagged.digest:
        return tagged
    return read_evidence(
        target,
        stack.name,
        content_hash,
        reference=digest,
        trust=host_policy(settings.hosts_dir),
    )


def _server_gpus(stack: ResolvedStack, gpu_kind: str | None) -> HostFacts | None:
    """This machine's GPUs, read where the stack serves on a GPU and --gpu-kind does not name
    the server's (then the server is taken to be local); with none here the kind is unknown,
    and a served verdict must name one, so that is refused."""
    from builder.engine.hostprobe import gather

    facts = gather(None, None) if stack.manifest.smoke.needs_gpu and gpu_kind is None else None
    if stack.manifest.smoke.needs_gpu and gpu_kind is None and not (facts and facts.gpus):
        raise StackError(
            "the server's GPU kind is not known here (no GPU on this machine)",
            key="--gpu-kind",
            hint="name it: --gpu-kind 'NVIDIA RTX PRO 6000 Blackwell Server Edition' (as "
            "`sm120-stacks doctor` on the server's host prints it)",
        )
    return facts


def _say_recorded(
    verdict: ServedVerdict, image: str, artifact: str, signer: SigningKey | None
) -> None:
    """What was recorded, for which image, and whether a host's trust policy will count it."""
    state = "passed" if verdict.passed else "failed"
    signed = (
        f"signed by key {signer.key_id[:16]}"
        if signer is not None
        else "unsigned: a host with a trust policy will not count it (--signing-key)"
    )
    click.echo(
        f"recorded: served on {verdict.gpu_kind} ({state}) for {image}: {artifact}\n  {signed}",
        err=True,
    )
