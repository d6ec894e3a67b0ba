"""Commands that serve from pinned hosts: deploy, drift (`verify`: its old name, deprecated);
the pins they read are written by `pin` (cli/pin.py).

Registered on the main `cli` group when builder.cli.app imports this module. Bad input exits 2
(user_errors); drift exits 1, since it describes the host, not the command line. A host's
prerequisites are `doctor`'s (cli/doctor.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import click

from builder.cli.app import (
    Settings,
    cli,
    engine_option,
    pass_settings,
    user_errors,
)
from builder.cli.fleet import all_pins, deploy_pins, drift_pins
from builder.errors import StackError
from builder.evidence.trust import host_policy
from builder.hosts.pins import Pin, load_pin
from builder.hosts.trustdrift import refuse_revoked
from builder.hosts.volume_owner import refuse_foreign_volumes
from builder.hosts.warm_target import WarmPolicy

EXIT_DRIFT = 1

#: The command's own --hosts-dir, kept as an alias of the global one (`sm120-stacks --hosts-dir
#: D deploy ...`) for the scripts that give it after the command; it wins where both are given.
hosts_dir_option = click.option(
    "--hosts-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Alias of the global --hosts-dir (folder of host pins).",
)


def hosts_folder(settings: Settings, value: Path | None) -> Path:
    return value if value is not None else settings.hosts_dir


@cli.command()
@click.argument("host", required=False)
@click.option("--all", "every", is_flag=True, help="Every pinned host (hosts/*.yaml).")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where to write the files (default: BUILD_DIR/hosts/HOST).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["compose", "k8s"]),
    default="compose",
    show_default=True,
    help="compose: compose.yaml and a systemd unit; k8s: a Deployment and a Service "
    "(k8s.yaml, checked against the Kubernetes schema; then `kubectl apply -f`).",
)
@click.option(
    "--apply",
    "apply_now",
    is_flag=True,
    help="Also run the pin on the host's engine (the pin's `engine`, else this one), one host "
    "at a time, each gated by its health path and smoke through its URL (a pin publishing no "
    "serve port reachable from here: its container's state); a host that fails goes back on "
    "its previous pin, and with --all the roll stops there.",
)
@click.option(
    "--no-smoke",
    is_flag=True,
    help="With --apply: gate on the health path alone, not the stack's smoke.",
)
@click.option(
    "--gate-timeout",
    type=click.FloatRange(1, None),
    default=None,
    help="With --apply: seconds a host may take to answer its health path "
    "(default: the pin's health start period).",
)
@click.option(
    "--require-warm",
    is_flag=True,
    help="With --apply: refuse to start a host whose cache volume cannot be filled from a "
    "warm-cache artifact of exactly its key (`cache list HOST` shows why); a host that "
    "compiled anything at its start also fails its gate.",
)
@click.option(
    "--cold",
    is_flag=True,
    help="With --apply: start without restoring a warm-cache artifact (the volume as it is).",
)
@click.option("--gpu-product", help="k8s: the node label nvidia.com/gpu.product to run on.")
@click.option("--json", "as_json", is_flag=True, help="With --apply: the roll as JSON.")
@engine_option
@hosts_dir_option
@pass_settings
@user_errors
def deploy(
    settings: Settings,
    host: str | None,
    every: bool,
    out: Path | None,
    fmt: str,
    apply_now: bool,
    no_smoke: bool,
    gate_timeout: float | None,
    require_warm: bool,
    cold: bool,
    gpu_product: str | None,
    as_json: bool,
    hosts_dir: Path | None,
) -> None:
    """Render HOST's compose file and systemd unit from its pin; --apply runs it there.

    --all deploys every pinned host. With --apply, one host or all are rolled alike: one at a
    time, each gated and rolled back on a failure. Exit status 1 when the roll stopped at a
    gate, 2 at bad input (a cache volume that is not the pin's own, the warm-cache restore
    refused, a pull that failed).
    """
    folder = hosts_folder(settings, hosts_dir)
    _one_or_all(host, every)
    _apply_only(
        apply_now,
        no_smoke=no_smoke,
        gate_timeout=gate_timeout,
        require_warm=require_warm,
        cold=cold,
        json=as_json,
    )
    if gpu_product is not None and fmt != "k8s":
        raise StackError(
            "--gpu-product selects a Kubernetes node: it applies with --format k8s only",
            key="--gpu-product",
            hint="add --format k8s, or leave out --gpu-product",
        )
    pins = all_pins(folder) if every else [load_pin(folder, str(host))]
    refuse_foreign_volumes(pins, folder, settings.engine_address())  # before anything is written
    base = settings.build_dir / "hosts"

    def out_of(pin: Pin) -> Path:
        """--all: a folder per host under --out; one host: --out is its folder."""
        return (out or base) / pin.host if every else out or base / pin.host

    if fmt == "k8s":
        _deploy_k8s(pins, out_of, gpu_product, apply_now)
        return
    warm = WarmPolicy(
        require=require_warm,
        cold=cold,
        default_engine=settings.engine_address(),
        trust=host_policy(folder) if apply_now else None,
    )
    refuse_revoked(pins, warm.trust)
    deploy_pins(
        settings, folder, pins, out_of, apply_now, not no_smoke, gate_timeout, as_json, warm
    )


def _deploy_k8s(
    pins: list[Pin], out_of: Callable[[Pin], Path], gpu_product: str | None, apply_now: bool
) -> None:
    """deploy --format k8s: each pin's Deployment and Service written, their paths printed."""
    if apply_now:
        raise StackError(
            "--apply runs a pin on a Docker engine, not on Kubernetes",
            key="--apply",
            hint="render with --format k8s, then `kubectl apply -f FILE`",
        )
    from builder.hosts.k8s import write_k8s

    for pinned in pins:
        click.echo(write_k8s(pinned, out_of(pinned), gpu_product))


def _apply_only(apply_now: bool, **given: object) -> None:
    """Options that judge a start mean nothing without --apply: refused (exit 2), not ignored."""
    named = [name for name, value in given.items() if value not in (False, None)]
    if named and not apply_now:
        option = "--" + named[0].replace("_", "-")
        raise StackError(
            f"{option} applies to a deploy that starts the server: nothing is started without "
            "--apply",
            key=option,
            hint=f"add --apply, or leave out {option}",
        )


@cli.command()
@click.argument("host", required=False)
@click.option("--all", "every", is_flag=True, help="Every pinned host, in one table.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--files",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where deploy wrote the host's compose.yaml and unit (deploy's --out; default: "
    "BUILD_DIR/hosts/HOST; with --all, DIR/HOST). The unit installed under "
    "/etc/systemd/system is read too.",
)
@engine_option
@hosts_dir_option
@pass_settings
@user_errors
def drift(
    settings: Settings,
    host: str | None,
    every: bool,
    as_json: bool,
    files: Path | None,
    hosts_dir: Path | None,
) -> None:
    """Compare what runs on HOST (on its pin's engine) with its pin; every drift is reported,
    nothing changed. --all: every pinned host. The host's rendered compose.yaml and systemd
    unit are read too: an image edited into them that is not the pinned digest (a tag), or a
    named volume that is not the pin's, is a drift.

    Exit status: 0 as pinned, 1 drift, 2 bad input.
    """
    folder = hosts_folder(settings, hosts_dir)
    _one_or_all(host, every)
    pins = all_pins(folder) if every else [load_pin(folder, str(host))]
    base = settings.build_dir / "hosts"

    def files_of(pin: Pin) -> Path:
        """Where deploy wrote the pin's files, as deploy's --out names them."""
        return (files or base) / pin.host if every else files or base / pin.host

    policy = host_policy(folder)
    drift_pins(pins, as_json, settings.engine_address(), every, policy, files_of)


#: `verify` was this command's name until 2026-12-02, when builder/verify/ (which implements
#: `test` and `smoke`) made the word mean two things; kept as an alias for one release.
_verify_alias = copy.copy(drift)
_verify_alias.name = "verify"
_verify_alias.deprecated = True
_verify_alias.help = "The old name of `drift` (kept for one release). " + (drift.help or "")
cli.add_command(_verify_alias)


def _one_or_all(host: str | None, every: bool) -> None:
    if every and host:
        raise StackError("give HOST or --all, not both", key="HOST")
    if not every and not host:
        raise StackError("name a HOST, or pass --all for every pinned host", key="HOST")
