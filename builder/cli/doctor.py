"""`sm120-stacks doctor`: a serving host's prerequisites (engine, NVIDIA driver, GPUs, container
runtime) and what tensor parallelism over its GPUs needs, for a pin or a stack. Missing
prerequisites exit 1 (they describe the host, not the command line), bad input 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from builder.cli.app import Settings, cli, engine_option, pass_settings, user_errors
from builder.cli.hosts import EXIT_DRIFT, hosts_dir_option, hosts_folder
from builder.engine.hostprobe import (
    HostFacts,
    Probe,
    cdi_specs,
    gather,
    gpu_containers_without_gpus,
    probe_for,
    toolkit_candidate,
)
from builder.engine.protocol import Engine
from builder.errors import EngineError, OperationFailed, StackError
from builder.hosts import remote, topology
from builder.hosts.hostcheck import (
    Finding,
    Requirements,
    check,
    requirements_for,
    setup_findings,
)
from builder.hosts.pins import Pin, load_pin, pin_path
from builder.hosts.warm_target import target_of
from builder.knowledge.cache_volume import cache_volume
from builder.knowledge.yamlsafe import load_yaml
from builder.manifest.serve import serve_argv
from builder.warm import integrity
from builder.warm.volume import open_volume


@cli.command()
@click.option(
    "--host",
    help="Check against this host's pin (its GPUs, driver minimum, tensor parallelism); a pin "
    "with an ssh:// engine: that host, over ssh.",
)
@click.option("--stack", help="Check against this stack's GPU targets and CUDA driver minimum.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@engine_option
@hosts_dir_option
@pass_settings
@user_errors
def doctor(
    settings: Settings,
    host: str | None,
    stack: str | None,
    as_json: bool,
    hosts_dir: Path | None,
) -> None:
    """Host prerequisites for serving: engine, NVIDIA driver, GPUs, container runtime; for a
    pin or stack serving on several GPUs, what tensor parallelism needs (P2P between its GPUs;
    for pairs over PCIe, no translating IOMMU, and no ACS redirect on the bridges between them:
    a failure where the IOMMU translates, a warning where it does not; pairs over NVLink are
    not judged for either). For a pin with a cache volume, whether its cache entries are whole
    (a start killed while it compiled leaves empty or cut-short kernels, a CuTe-DSL module
    without its meta.json, a Triton group naming a file that is not there).

    Exit status: 0 all present, 1 something is missing (each with its fix), 2 bad input.
    """
    if host and stack:
        raise StackError("give --host or --stack, not both", key="--host")
    pinned = load_pin(hosts_folder(settings, hosts_dir), host) if host else None
    needs, selected, serve = _what_to_check(settings, host, stack, hosts_dir, pinned)
    default = settings.engine_address()
    probe = _probe(pinned, default)
    if pinned is None:
        engine, why = settings.connect_or_why()
    else:
        engine, why = remote.try_connect(pinned, default)
    facts = gather(engine, why, probe)
    findings = check(facts, needs, selected)
    findings += _setup(facts, engine, probe)
    if pinned is not None:
        findings += _cache_volume(pinned, engine)
    if serve is None:
        findings += topology.not_checked(len(facts.gpus))
    else:
        findings += topology.check(serve, probe)
    _print_findings(findings, as_json)
    if not all(f.ok for f in findings):
        sys.exit(EXIT_DRIFT)


def _what_to_check(
    settings: Settings,
    host: str | None,
    stack: str | None,
    hosts_dir: Path | None,
    pinned: Pin | None,
) -> tuple[Requirements | None, list[int] | None, topology.Serve | None]:
    """What the host is judged against: the pin's (or the stack's) GPUs and driver minimum,
    the GPUs it selects, and its serve for tensor parallelism; all None with neither."""
    if host and pinned is not None:
        folder = hosts_folder(settings, hosts_dir)
        origin = topology.ArgvOrigin(("command",), 0, (load_yaml(pin_path(folder, host)),))
        serve = topology.serve_of(
            f"the pin of {host}", pinned.command, pinned.env, pinned.gpu_indices, origin
        )
        return pinned.needs.requirements(), pinned.gpu_indices, serve
    if stack:
        resolved = settings.resolve(stack)
        needs = requirements_for(list(resolved.manifest.gpus), resolved.arch.min_driver)
        argv = serve_argv(resolved)
        extra = len(resolved.manifest.serve.extra_args)  # serve_argv ends with them
        docs = tuple(load_yaml(path) for path in resolved.sources)
        origin = topology.ArgvOrigin(("serve", "extra_args"), len(argv) - extra, docs)
        serve = topology.serve_of(f"stack {stack}", argv, resolved.manifest.env, None, origin)
        return needs, None, serve
    return None, None, None


def _cache_volume(pinned: Pin, engine: Engine | None) -> list[Finding]:
    """The pin's cache volume held to knowledge/cache_integrity.yaml: a start killed while it
    compiled leaves entries the next start loads and fails on, or compiles again. Nothing where
    the pin mounts none or its engine is unreachable (the engine finding says so); a volume no
    container has used is not opened (opening it would make it)."""
    target = target_of(pinned)
    if target is None or engine is None:
        return []
    name = f"cache volume {target.volume}"
    try:
        if not engine.containers(volume=target.volume):
            return [Finding("cache", True, f"{name}: not judged, the pin is not deployed yet")]
        with open_volume(engine, target.volume, cache_volume()) as access:
            damaged = integrity.inspect_volume(access)
    except (EngineError, OperationFailed, StackError) as exc:
        return [Finding("cache", True, f"{name}: not judged ({exc})", warn=True)]
    if not damaged:
        return [Finding("cache", True, f"{name}: no damaged cache entry")]
    shown = "; ".join(d.describe() for d in damaged[:3])
    more = f"; and {len(damaged) - 3} more" if len(damaged) > 3 else ""
    return [
        Finding(
            "cache",
            False,
            f"{name} holds {integrity.counted(damaged)} (a start killed while it "
            f"compiled leaves these; the next start fails on them or compiles them again): "
            f"{shown}{more}",
            integrity.remedy(damaged, target.volume, target.image),
        )
    ]


def _setup(facts: HostFacts, engine: Engine | None, probe: Probe) -> list[Finding]:
    """The toolkit's repository, CDI specs, and GPU containers that lost their GPUs."""
    lost: list[str] = []
    if engine is not None and facts.gpus:
        try:
            lost = gpu_containers_without_gpus(engine)
        except EngineError:
            lost = []  # the engine finding says why it cannot be asked
    specs = [str(spec) for spec in cdi_specs(probe)] if probe.cdi_dirs else None
    return setup_findings(facts, toolkit_candidate(probe), specs, lost)


def _probe(pinned: Pin | None, default: str | None) -> Probe:
    """How doctor reads the host: the pin's (over ssh for an ssh:// engine), else the
    command's engine's host (here, for the local socket)."""
    return probe_for(default) if pinned is None else remote.probe(pinned, default)


def _print_findings(findings: list[Finding], as_json: bool) -> None:
    if as_json:
        rows = [
            {
                "name": f.name,
                "ok": f.ok,
                "warn": f.warn,
                "detail": f.detail,
                "fix": f.fix,
                "evidence": list(f.evidence),
            }
            for f in findings
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    for f in findings:
        mark = "FAIL" if not f.ok else "warn" if f.warn else "ok  "
        click.echo(f"{mark}  {f.name}: {f.detail}")
        if not f.ok or f.warn:
            if f.fix:
                click.echo(f"      fix: {f.fix}")
            if f.evidence:
                click.echo(f"      see: {' '.join(f.evidence)}")
    failed = sum(not f.ok for f in findings)
    warned = sum(f.ok and f.warn for f in findings)
    summary = f"{failed} prerequisite(s) missing" if failed else "all prerequisites present"
    click.echo(summary + (f", {warned} warning(s)" if warned else ""))
