"""What a pin file holds and how it is read: schema version, serve port, GPU targets by name,
the host folders `deploy --apply` makes before it starts the container, and the compose file and
systemd unit rendered from it (schema, named volumes, `$`). No engine needed."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import Result

from builder.engine.hostprobe import gather
from builder.engine.protocol import ContainerSpec, Image
from builder.errors import EngineError, StackError
from builder.hosts import container, deploy
from builder.hosts.hostcheck import check, requirements_for
from builder.hosts.pins import PIN_SCHEMA, Pin, PinOptions, load_pin, make_pin, write_pin
from builder.image.records import load_record
from builder.manifest.resolve import resolve
from tests.support.served import SERVED_GPU
from tests.test_hosts import _pin, _probe, _tested_and_pushed

#: The Compose Specification's own schema (tests/fixtures/compose-spec/README.md: source, commit).
COMPOSE_SCHEMA = Path(__file__).parent / "fixtures" / "compose-spec" / "compose-spec.json"

HOST = "gpu-node-07"


def _two_gpu_pin(stacks_dir: Path, tmp_path: Path, **options: Any) -> Pin:
    """A stack for sm90 and sm120 (sorted, their capabilities are 12.0 before 9.0) on 8123."""
    (stacks_dir / "two.yaml").write_text(
        "extends: vllm-0.22-marlin\ngpus: [sm90, sm120]\nserve: {port: 8123}\n"
    )
    stack = resolve("two", stacks_dir)
    content_hash = _tested_and_pushed(tmp_path / "build", stack)
    record = load_record(tmp_path / "build", "two", content_hash)
    options.setdefault("gpu_kind", SERVED_GPU)
    return make_pin(HOST, stack, content_hash, record, None, PinOptions(**options))


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


# --- GPU targets, paired by name ---------------------------------------------------------------


def test_each_capability_is_named_with_its_own_target() -> None:
    """`gpus: [sm90, sm120]` printed "12.0 (sm90), 9.0 (sm120)": sorted capabilities zipped
    with the targets in manifest order."""
    facts = gather(None, None, _probe("0, 00000000:17:00.0, 580.95.05, 8.0, NVIDIA A100\n"))
    needs = requirements_for(["sm90", "sm120"], None)
    assert needs.targets == {"sm90": "9.0", "sm120": "12.0"}
    gpu = {f.name: f for f in check(facts, needs)}["gpu"]
    assert not gpu.ok
    assert gpu.detail.endswith("the stack targets 9.0 (sm90), 12.0 (sm120)"), gpu.detail
    h200 = gather(None, None, _probe("0, 00000000:18:00.0, 580.95.05, 9.0, NVIDIA H200\n"))
    assert {f.name: f for f in check(h200, needs)}["gpu"].ok


def test_a_pin_records_gpu_targets_by_name_and_its_serve_port(
    stacks_dir: Path, tmp_path: Path
) -> None:
    pin = _two_gpu_pin(stacks_dir, tmp_path)
    path = write_pin(tmp_path / "hosts", pin)
    data = yaml.safe_load(path.read_text())
    assert data["schema_version"] == PIN_SCHEMA == 2
    assert data["serve_port"] == 8123
    assert data["needs"]["targets"] == {"sm90": "9.0", "sm120": "12.0"}
    assert list(data["needs"]["targets"]) == ["sm90", "sm120"], "the manifest's order"
    loaded = load_pin(tmp_path / "hosts", HOST)
    assert loaded == pin
    assert loaded.needs.requirements().targets == {"sm90": "9.0", "sm120": "12.0"}


# --- serve port --------------------------------------------------------------------------------


def test_the_health_check_probes_the_pinned_serve_port(stacks_dir: Path, tmp_path: Path) -> None:
    """The port was re-parsed from the command with a default of 8000: a command that sets it
    another way (an engine's config file, a hand edit) got its health check on the wrong port."""
    path = write_pin(tmp_path / "hosts", _two_gpu_pin(stacks_dir, tmp_path))

    def drop_port_flag(data: dict[str, Any]) -> None:
        at = data["command"].index("--port")
        del data["command"][at : at + 2]

    _edit(path, drop_port_flag)
    pin = load_pin(tmp_path / "hosts", HOST)
    assert pin.serve_port == 8123
    assert "http://127.0.0.1:8123/health" in container.health_test(pin)[3]


# --- schema version ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("schema_version"), "no schema_version"),
        (lambda d: d.update(schema_version=3), "schema_version 3"),
        (lambda d: d.update(schema_version="two"), "schema_version 'two'"),
    ],
)
def test_a_pin_of_no_or_another_schema_version_says_to_pin_again(
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
    change: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    path = write_pin(tmp_path / "hosts", _pin(stacks_dir, tmp_path))
    _edit(path, change)
    with pytest.raises(StackError) as caught:
        load_pin(tmp_path / "hosts", HOST)
    assert caught.value.file == path and caught.value.key == "schema_version"
    assert message in caught.value.message
    assert f"sm120-stacks pin {HOST} vllm-0.22-marlin" in str(caught.value.hint)
    for command in (("verify", HOST), ("deploy", HOST), ("doctor", "--host", HOST)):
        result = run_cli(*command, stacks_dir=stacks_dir)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert "gpu-node-07.yaml" in result.output


@pytest.mark.parametrize("text", ["just text\n", "- a\n- b\n", "", "schema_version: 2\n"])
def test_a_pin_that_is_not_a_pin_is_an_error_naming_the_file(
    tmp_path: Path, run_cli: Callable[..., Result], text: str
) -> None:
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    (hosts / f"{HOST}.yaml").write_text(text)
    with pytest.raises(StackError) as caught:
        load_pin(hosts, HOST)
    assert caught.value.file == hosts / f"{HOST}.yaml"
    result = run_cli("verify", HOST, "--hosts-dir", str(hosts))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output


def _as_previous_version_wrote_it(data: dict[str, Any]) -> None:
    """Schema 1: no serve_port; targets and sorted capabilities as two separate lists."""
    data["schema_version"] = 1
    del data["serve_port"]
    targets = data["needs"].pop("targets")
    data["needs"]["gpu_targets"] = list(targets)
    data["needs"]["compute_capabilities"] = sorted(targets.values())


def test_a_pin_written_by_the_previous_version_is_still_read(
    stacks_dir: Path, tmp_path: Path
) -> None:
    """Committed schema-1 pins keep working: the port from the serve command's --port (which
    `pin` always wrote), each target's capability by its name."""
    pin = _two_gpu_pin(stacks_dir, tmp_path)
    path = write_pin(tmp_path / "hosts", pin)
    _edit(path, _as_previous_version_wrote_it)
    old = load_pin(tmp_path / "hosts", HOST)
    assert old.serve_port == 8123
    assert old.needs.requirements().targets == {"sm90": "9.0", "sm120": "12.0"}
    assert old.model_dump(exclude={"schema_version"}) == pin.model_dump(exclude={"schema_version"})

    def no_port(data: dict[str, Any]) -> None:
        at = data["command"].index("--port")
        del data["command"][at : at + 2]

    _edit(path, no_port)
    with pytest.raises(StackError) as caught:
        load_pin(tmp_path / "hosts", HOST)
    assert caught.value.key == "schema_version"
    assert f"sm120-stacks pin {HOST} two" in str(caught.value.hint)


# --- deploy --apply on a fresh host ------------------------------------------------------------


class _Engine:
    """Just enough of builder.image's Engine for apply(): it refuses a bind mount of a missing
    source the way dockerd does (400 ... bind source path does not exist)."""

    def __init__(self) -> None:
        self.started: list[ContainerSpec] = []

    def image(self, ref: str) -> Image | None:
        return Image(id="sha256:" + "d" * 64, attrs={})  # the pinned image is here: no pull

    def container(self, name: str) -> Any:
        return None  # a fresh host: no container yet

    def run(self, spec: ContainerSpec) -> Any:
        for mount in spec.mounts:
            if mount.kind == "bind" and not Path(mount.source).exists():
                raise EngineError(
                    'invalid mount config for type "bind": bind source path does not exist: '
                    + mount.source,
                    status_code=400,
                )
        self.started.append(spec)

        class Started:
            short_id = "abc123"

        return Started()


def test_apply_makes_the_folders_the_pin_writes_to(stacks_dir: Path, tmp_path: Path) -> None:
    """On a fresh host the models folder does not exist yet: the engine refused the bind mount
    with a raw 400. The folders the pin writes to (read-write binds) are made first."""
    models = tmp_path / "fresh" / "var" / "lib" / "sm120-stacks" / "models"
    cache = tmp_path / "fresh" / "cache"
    pin = _pin(stacks_dir, tmp_path, volumes=(f"{models}:/models", f"{cache}:/root/.cache"))
    engine = _Engine()
    said = deploy.apply(pin, engine)  # type: ignore[arg-type]
    assert said.splitlines() == [f"created {models}", f"created {cache}", said.splitlines()[2]]
    assert said.splitlines()[2].startswith("started"), said
    assert models.is_dir() and cache.is_dir()
    assert len(engine.started) == 1


def test_apply_says_what_to_run_when_it_may_not_make_a_folder(
    stacks_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "root-owned" / "models"
    pin = _pin(stacks_dir, tmp_path, volumes=(f"{models}:/models",))

    def refuse(self: Path, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    engine = _Engine()
    with pytest.raises(StackError) as caught:
        deploy.apply(pin, engine)  # type: ignore[arg-type]
    assert f"cannot create {models}" in caught.value.message
    assert f"sudo mkdir -p {models}" in str(caught.value.hint)
    assert engine.started == []


def test_apply_refuses_a_missing_read_only_folder_by_name(stacks_dir: Path, tmp_path: Path) -> None:
    """A read-only bind is something the host provides (a model put there by hand): an empty
    folder made for it would start a server that cannot load its model."""
    models = tmp_path / "nothing-here"
    pin = _pin(stacks_dir, tmp_path, volumes=(f"{models}:/models:ro",))
    engine = _Engine()
    with pytest.raises(StackError) as caught:
        deploy.apply(pin, engine)  # type: ignore[arg-type]
    assert f"{models} does not exist" in caught.value.message
    assert not models.exists() and engine.started == []


def test_the_systemd_unit_makes_the_same_folders(stacks_dir: Path, tmp_path: Path) -> None:
    models = tmp_path / "fresh" / "models"
    pin = _pin(stacks_dir, tmp_path, volumes=(f"{models}:/models", f"{tmp_path}/ro:/ro:ro"))
    unit = deploy.render_files(pin)[f"{pin.container}.service"]
    assert f'ExecStartPre=/bin/mkdir -p "{models}"' in unit
    assert f'{tmp_path}/ro"' not in unit.split("ExecStart=", 1)[0]


# --- the rendered compose file and unit ---------------------------------------------------------

#: Pins whose renderings differ in what Compose reads: all GPUs (the vLLM default, its named
#: cache volume), two GPUs with the API-key wrapper's `$`, a user and a wide port, and no GPU.
RENDERINGS = {
    "all-gpus": {},
    "two-gpus-keyed": {
        "gpus": "0,1",
        "ports": ("0.0.0.0:8000:8000",),
        "api_key_file": "/etc/sm120-stacks/keys/gpu-wide.key",
        "user": "1000:1000",
    },
    "no-gpu": {"gpus": "none", "volumes": ("sm120-own-cache:/var/cache/sm120-stacks",)},
}


def _compose(stacks_dir: Path, tmp_path: Path, options: dict[str, Any]) -> tuple[Pin, str]:
    pin = _pin(stacks_dir, tmp_path, **options)
    return pin, deploy.render_files(pin)["compose.yaml"]


@pytest.mark.parametrize("options", RENDERINGS.values(), ids=RENDERINGS.keys())
def test_every_compose_file_is_valid_against_the_compose_spec_schema(
    stacks_dir: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    _, text = _compose(stacks_dir, tmp_path, options)
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load(text))
    with pytest.raises(jsonschema.ValidationError, match="bogus_key"):
        bogus = yaml.safe_load(text)
        bogus["services"]["llm"]["bogus_key"] = 1
        jsonschema.Draft7Validator(schema).validate(bogus)  # the check can fail


@pytest.mark.parametrize("options", RENDERINGS.values(), ids=RENDERINGS.keys())
def test_every_named_volume_is_declared_with_the_name_the_unit_mounts(
    stacks_dir: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    """Compose v2 and podman-compose refuse a service volume with no top-level entry
    ("refers to undefined volume"), which every vLLM pin's cache volume was; declared without
    name:, Compose would mount PROJECT_NAME instead of the volume the unit and --apply use."""
    pin, text = _compose(stacks_dir, tmp_path, options)
    compose = yaml.safe_load(text)
    used = {v["source"] for v in compose["services"]["llm"]["volumes"] if v["type"] == "volume"}
    assert used, "every rendering here mounts a cache volume"
    assert compose.get("volumes") == {name: {"name": name, "external": True} for name in used}
    unit = deploy.render_files(pin)[deploy.unit_name(pin)]
    for name in used:
        assert f'"type=volume,source={name},target=/var/cache/sm120-stacks"' in unit
    engine_mounts = {m.source for m in deploy.container_spec(pin).mounts}
    assert used <= engine_mounts, "deploy --apply mounts the same volumes"


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def test_every_dollar_in_a_compose_string_is_escaped(stacks_dir: Path, tmp_path: Path) -> None:
    """Compose interpolates every value: the API-key wrapper's `$(cat ...)`, `$0` and `$@`
    went in with a single `$` (docker-compose 1.29: "Invalid interpolation format")."""
    _, text = _compose(stacks_dir, tmp_path, RENDERINGS["two-gpus-keyed"])
    compose = yaml.safe_load(text)
    command = compose["services"]["llm"]["command"]
    assert command[:2] == ["sh", "-c"]
    assert command[2] == container._EXPORT_KEY.replace("$", "$$")
    assert "$$(cat /run/secrets/sm120-stacks-api-key)" in command[2]
    for value in _strings(compose):
        assert "$" not in value.replace("$$", ""), value


def test_the_compose_file_says_which_compose_it_is_for(stacks_dir: Path, tmp_path: Path) -> None:
    _, text = _compose(stacks_dir, tmp_path, {})
    header = "".join(line for line in text.splitlines(True) if line.startswith("#"))
    assert "Compose v2" in header and "docker compose -f compose.yaml up -d" in header
    assert "docker-compose 1.x is end of life" in header
    assert "pull_policy: missing" in header, "the keys 1.x refuses are named"


@pytest.mark.parametrize("options", RENDERINGS.values(), ids=RENDERINGS.keys())
def test_the_systemd_unit_passes_systemd_analyze_verify(
    stacks_dir: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    """`systemd-analyze verify` is quiet on a good unit; a control line it must warn about
    shows that it reads the file."""
    if shutil.which("systemd-analyze") is None or not Path(deploy.DOCKER).exists():
        pytest.skip("needs systemd-analyze and /usr/bin/docker (systemd checks ExecStart)")
    pin = _pin(stacks_dir, tmp_path, **options)
    folder = tmp_path / "units"
    folder.mkdir()
    unit = folder / deploy.unit_name(pin)
    unit.write_text(deploy.render_files(pin)[unit.name])

    def verify() -> subprocess.CompletedProcess[str]:
        command = ["systemd-analyze", "verify", "--man=no", str(unit)]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    clean = verify()
    assert (clean.returncode, clean.stdout + clean.stderr) == (0, ""), clean.stderr
    unit.write_text(unit.read_text().replace("[Service]\n", "[Service]\nBogusKey=1\n"))
    assert "BogusKey" in verify().stderr
