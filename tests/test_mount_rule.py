"""One mount type, one bind rule (issue 36 item 3).

The same pin rendered every way it runs (compose, the systemd unit's `docker run`, the SDK
container `deploy --apply` starts, Kubernetes) and read back by drift must agree on each mount's
kind; and no module of builder/ may say again which mounts are binds, or define a second type
holding a mount's three fields. No engine needed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import yaml

from builder import REPO_ROOT
from builder.engine.docker_adapter import run_kwargs
from builder.engine.protocol import Mount
from builder.hosts.container import SECRET_TARGET, describe
from builder.hosts.deploy import SERVICE, docker_run_args, render_files
from builder.hosts.drift import actual_config, compare_config, expected_config
from builder.hosts.k8s import manifests
from builder.hosts.pins import Pin
from tests.test_hosts import _pin

PACKAGE = REPO_ROOT / "builder"
#: The one module allowed to say which mounts are binds, and to define the mount's fields.
HOME = "engine/protocol.py"
#: What each mount of the pin below is, written out here rather than asked of the rule.
KINDS = {"/models": "bind", "/out": "bind", "/hf": "volume", SECRET_TARGET: "bind"}
#: The engine's mount kind of each Kubernetes volume source (the API key is a Secret there).
K8S_KINDS = {"hostPath": "bind", "persistentVolumeClaim": "volume", "secret": "bind"}
#: A bind rule written again: a source tested for a leading slash, or "bind" chosen inline.
BIND_RULE = re.compile(r"""source\w*\)?\.startswith\(\s*["']/["']\s*\)|["']bind["']\s+if\b""")


def _mixed_pin(stacks_dir: Path, tmp_path: Path) -> Pin:
    """A pin with a read-only bind, a read-write bind, a named volume and an API key file."""
    volumes = ("/srv/m:/models:ro", "/srv/out:/out", "hf:/hf")
    return _pin(stacks_dir, tmp_path, volumes=volumes, api_key_file="/etc/sm120/key")


def _compose_kinds(pin: Pin) -> dict[str, str]:
    service = yaml.safe_load(render_files(pin)["compose.yaml"])["services"][SERVICE]
    return {v["target"]: v["type"] for v in service["volumes"]}


def _unit_kinds(pin: Pin) -> dict[str, str]:
    args = docker_run_args(pin)
    found = [args[i + 1] for i, arg in enumerate(args) if arg == "--mount"]
    fields = [dict(part.split("=", 1) for part in f.split(",") if "=" in part) for f in found]
    return {f["target"]: f["type"] for f in fields}


def _sdk_kinds(pin: Pin) -> dict[str, str]:
    return {m["Target"]: m["Type"] for m in run_kwargs(describe(pin))["mounts"]}


def _k8s_kinds(pin: Pin) -> dict[str, str]:
    pod = manifests(pin)[0]["spec"]["template"]["spec"]
    sources = {
        v["name"]: next(K8S_KINDS[key] for key in v if key in K8S_KINDS)
        for v in pod["volumes"]
        if "emptyDir" not in v
    }
    mounts = pod["containers"][0]["volumeMounts"]
    return {m["mountPath"]: sources[m["name"]] for m in mounts if m["name"] in sources}


def _drift_kinds(pin: Pin) -> dict[str, str]:
    return {text.split(":")[2]: text.split(":")[0] for text in expected_config(pin, {})["mounts"]}


def test_every_rendering_of_a_pin_agrees_on_each_mounts_kind(
    stacks_dir: Path, tmp_path: Path
) -> None:
    pin = _mixed_pin(stacks_dir, tmp_path)
    assert {m.target: m.kind for m in describe(pin).mounts} == KINDS
    renderings = {
        "compose": _compose_kinds(pin),
        "unit": _unit_kinds(pin),
        "sdk": _sdk_kinds(pin),
        "k8s": _k8s_kinds(pin),
        "drift": _drift_kinds(pin),
    }
    for name, kinds in renderings.items():
        assert kinds == KINDS, name


def test_drift_finds_the_container_deploy_starts_clean_and_a_changed_kind_drifted(
    stacks_dir: Path, tmp_path: Path
) -> None:
    """The SDK's mounts, as `docker inspect` reports them, are what drift expects; the same
    source and target as a volume instead of a bind is a drift."""
    pin = _mixed_pin(stacks_dir, tmp_path)
    inspected = [_inspect_mount(m) for m in run_kwargs(describe(pin))["mounts"]]
    expected = expected_config(pin, {})
    assert actual_config({"Mounts": inspected})["mounts"] == expected["mounts"]
    swapped = [dict(m, Type="volume", Name=m.get("Source", m.get("Name"))) for m in inspected]
    drifts = compare_config({"mounts": expected["mounts"]}, actual_config({"Mounts": swapped}))
    assert [d.name for d in drifts] == ["mounts"]


def _inspect_mount(sdk_mount: dict[str, Any]) -> dict[str, Any]:
    """One entry of `docker inspect`'s Mounts for a mount the SDK was asked for."""
    entry = {"Type": sdk_mount["Type"], "Destination": sdk_mount["Target"]}
    entry["RW"] = not sdk_mount["ReadOnly"]
    key = "Source" if sdk_mount["Type"] == "bind" else "Name"
    return entry | {key: sdk_mount["Source"]}


def test_an_old_pins_volumes_load_and_write_back_unchanged(
    stacks_dir: Path, tmp_path: Path
) -> None:
    """The pin file keeps its three fields per mount (source, target, read_only)."""
    pin = _mixed_pin(stacks_dir, tmp_path)
    data = pin.model_dump(mode="json")
    assert data["volumes"] == [
        {"source": "/srv/m", "target": "/models", "read_only": True},
        {"source": "/srv/out", "target": "/out", "read_only": False},
        {"source": "hf", "target": "/hf", "read_only": False},
    ]
    old = dict(data, volumes=[{"source": "/srv/m", "target": "/models"}])
    assert Pin.model_validate(old).volumes == [Mount("/srv/m", "/models")]


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_the_bind_rule_is_written_once() -> None:
    writers = {name for name, text in _sources().items() if BIND_RULE.search(text)}
    assert writers == {HOME}, writers - {HOME}


def test_one_type_holds_a_mounts_fields() -> None:
    """A class with source, target and read_only fields is a second mount type."""
    holders = set()
    for name, text in _sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and _fields(node) >= {"source", "target"}:
                holders.add(f"{name}:{node.name}")
    assert holders == {f"{HOME}:Mount"}, holders


def _fields(node: ast.ClassDef) -> set[str]:
    return {
        item.target.id
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }


def test_the_checks_find_what_they_look_for() -> None:
    for written in (
        'kind = "bind" if m.source.startswith("/") else "volume"',
        "if volume.source.startswith('/'):",
        "return str(self.source).startswith('/')",
    ):
        assert BIND_RULE.search(written), written
    assert not BIND_RULE.search('if not model.startswith("/"):')
    assert not BIND_RULE.search('if source.startswith((".", "/")):')  # made absolute, not a rule
    second = ast.parse("class Volume:\n    source: str\n    target: str\n")
    assert _fields(next(n for n in ast.walk(second) if isinstance(n, ast.ClassDef))) == {
        "source",
        "target",
    }
