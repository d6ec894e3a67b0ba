"""What a vLLM server reads at start that follows the host's network, and how a stack pins it.

One digest must run one route on every host. vLLM 0.33 decides at start whether FlashInfer
decodes with XQA or FA2 from a 5 s request to NVIDIA's artifactory (the TRT-LLM attention gate),
reports usage to stats.vllm.ai, and looks models up on the Hugging Face hub: an offline host and
an online one then run different kernels, start in different times and make traffic nobody
allowed. knowledge/serve_switches.yaml records each switch with its place in the wheel; this
module reads how a stack sets them, refuses one that sets the gate both ways or names a variable
the wheel does not read (exit 2 at the key), and hands the rules the switches left open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.knowledge.loader import ManifestKeyError, parse_document, read_knowledge
from builder.knowledge.strict import Strict
from builder.manifest.model import Manifest
from builder.manifest.servepath import FLASHINFER, ServePath
from builder.vllmcli.vllm_argv import ExtraArgError, attention_config_value

SWITCHES_FILE = "serve_switches.yaml"
ENV_NAMES_FILE = "vllm_env_names.yaml"

GateState = Literal["off", "on", "network"]


class _Gate(Strict):
    id: str
    off_config_key: str
    off_arg: str
    on_env: list[str]
    on_packages: list[str]
    read_at: list[str]


class _Switch(Strict):
    id: str
    what: str
    network: str
    env: dict[str, str]
    read_at: list[str]


class _Quiet(Strict):
    id: str
    what: str
    read_at: list[str]


class _Version(Strict):
    vllm: str
    read: str
    gate: _Gate
    switches: list[_Switch]
    no_network: list[_Quiet]
    not_read: dict[str, str]


class _SwitchesFile(Strict):
    versions: list[_Version]


class _EnvNames(Strict):
    vllm: str
    read: str
    names: list[str]


class _EnvNamesFile(Strict):
    versions: list[_EnvNames]


@cache
def _switches() -> _SwitchesFile:
    return parse_document(read_knowledge(SWITCHES_FILE), _SwitchesFile)


@cache
def _env_names() -> _EnvNamesFile:
    return parse_document(read_knowledge(ENV_NAMES_FILE), _EnvNamesFile)


@dataclass(frozen=True)
class SwitchFix:
    """What closes one open switch, as a stack spells it: variables in its env (each switch of
    knowledge/serve_switches.yaml), or a serve argument (the gate off). `propose` applies these
    where a rule's remedy names the switch."""

    switch: str
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class StartSwitches:
    """How a stack's server sets every network-dependent switch of its vLLM version."""

    vllm: str
    #: off/on as the stack pins it, `network` where it leaves vLLM to probe.
    gate: GateState
    #: Where the gate's setting comes from, in the manifest's words ("" for network).
    gate_from: str
    #: Whether the serve path reaches the gate at all (FlashInfer attention).
    gate_reached: bool
    #: Switch ids whose variables the image leaves unset or set otherwise, with what to set.
    open: tuple[tuple[str, str], ...]
    #: What closes each open switch, in the order of `open`.
    fixes: tuple[SwitchFix, ...] = ()

    def decode(self, online: bool) -> str:
        """The decode kernel this stack's server runs on a host with or without the network:
        XQA only where FlashInfer attention asks the gate and the gate says yes."""
        if not self.gate_reached:
            return "not FlashInfer attention (the gate is never asked)"
        if self.gate == "on" or (self.gate == "network" and online):
            return "XQA (xqa_* JIT module)"
        return "FA2 (the derived batch_prefill module)"

    def to_json(self) -> dict[str, Any]:
        return {
            "vllm": self.vllm,
            "trtllm_gate": self.gate,
            "trtllm_gate_from": self.gate_from,
            "trtllm_gate_reached": self.gate_reached,
            "open": [f"{switch}: {fix}" for switch, fix in self.open],
        }


def start_switches(manifest: Manifest, serve_path: ServePath | None) -> StartSwitches | None:
    """The stack's start switches; None where no entry of knowledge/serve_switches.yaml covers
    its vLLM (another engine, no vllm pin, a version not read)."""
    if serve_path is None:
        return None
    version = _covering(_switches().versions, serve_path.vllm)
    if version is None:
        return None
    _refuse_unread_env(manifest, version, serve_path.vllm)
    gate, gate_from = trtllm_gate(manifest, version.gate)
    reached = serve_path.attention_backend == FLASHINFER
    env = manifest.env
    fixes = [
        SwitchFix(s.id, env=tuple(s.env.items()))
        for s in version.switches
        if any(env.get(name) != value for name, value in s.env.items())
    ]
    if reached and gate == "network":
        fixes.insert(0, SwitchFix(version.gate.id, args=(version.gate.off_arg,)))
    open_switches = tuple(
        (fix.switch, ", ".join([*(f"{k}={v}" for k, v in fix.env), *fix.args])) for fix in fixes
    )
    return StartSwitches(serve_path.vllm, gate, gate_from, reached, open_switches, tuple(fixes))


def switch_ids() -> frozenset[str]:
    """Every switch id knowledge/serve_switches.yaml records (the gates' too): what a rule's
    remedy may name."""
    return frozenset(
        name for v in _switches().versions for name in (v.gate.id, *(s.id for s in v.switches))
    )


def _covering(versions: Sequence[Any], vllm: str) -> Any:
    return next((v for v in versions if Version(vllm) in SpecifierSet(v.vllm)), None)


def _refuse_unread_env(manifest: Manifest, version: _Version, vllm: str) -> None:
    """Exit 2 on a VLLM_* variable (or a retired switch) vLLM `vllm` does not read."""
    names = _covering(_env_names().versions, vllm)
    known = set(names.names) if names is not None else None
    for name in manifest.env:
        instead = version.not_read.get(name)
        unread = known is not None and name.startswith("VLLM_") and name not in known
        if instead is None and not unread:
            continue
        raise ManifestKeyError(
            ("env", name),
            f"vLLM {vllm} does not read {name} (knowledge/{ENV_NAMES_FILE}: no such name in "
            "the wheel): the switch it stands for is not set",
            f"use {instead}" if instead else "remove it, or name a variable this vLLM reads",
        )


def trtllm_gate(manifest: Manifest, gate: _Gate) -> tuple[GateState, str]:
    """(off/on/network, where the manifest says so). Setting it both ways is exit 2."""
    ways: list[tuple[GateState, tuple[str | int, ...], str]] = []
    config = _config_value(manifest.serve.extra_args, gate.off_config_key)
    if config is not None:
        value, index = config
        state: GateState = "on" if value else "off"
        ways.append((state, ("serve", "extra_args", index), manifest.serve.extra_args[index]))
    for name in gate.on_env:
        if _nonzero(manifest.env.get(name)):
            ways.append(("on", ("env", name), f"env {name}={manifest.env[name]}"))
    packages = {**manifest.python.packages, **manifest.python.overrides}
    for package in gate.on_packages:
        if package in packages:
            ways.append(("on", ("python", "packages", package), f"python.packages {package}"))
    if not ways:
        return "network", ""
    first = ways[0]
    for other in ways[1:]:
        if other[0] != first[0]:
            raise ManifestKeyError(
                other[1],
                f"the TRT-LLM attention gate is set both ways: {first[2]} sets it {first[0]}, "
                f"{other[2]} sets it {other[0]}",
                f"pick one: gate off ({gate.off_arg}, knowledge/{SWITCHES_FILE}) or on",
            )
    return first[0], first[2]


def _nonzero(value: str | None) -> bool:
    """vLLM reads VLLM_HAS_FLASHINFER_CUBIN as bool(int(value)) (envs.py:1909-1911)."""
    if value is None:
        return False
    try:
        return int(value) != 0
    except ValueError:
        return True  # vLLM would fail at start; treat as set so it is never silently open


def _config_value(args: Sequence[str], key: str) -> tuple[bool, int] | None:
    """The value vLLM's --attention-config ends up with for key (vllm_argv's one reader of its
    merge), as a switch, and the argument giving it; None where none sets it."""
    try:
        chosen = attention_config_value(args, key)
    except ExtraArgError as exc:
        raise ManifestKeyError(("serve", "extra_args", exc.index), exc.message, exc.hint) from None
    if chosen is None or chosen[0] is None:
        return None
    setting, index = chosen
    if isinstance(setting, str) and setting.lower() in ("true", "false"):
        setting = setting.lower() == "true"
    if not isinstance(setting, bool | int):
        raise ManifestKeyError(
            ("serve", "extra_args", index),
            f"{args[index]}: {key} takes true or false, vLLM refuses {setting!r} at start",
            f"write --attention-config.{key}=false",
        )
    return bool(setting), index


__all__ = ["StartSwitches", "SwitchFix", "start_switches", "switch_ids", "trtllm_gate"]
