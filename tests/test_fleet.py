"""Shared build cache, engine addresses, fleet roll and rollback, Kubernetes rendering: the
logic, without an engine (tests/engine/test_fleet.py runs the roll on a real engine)."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from click.testing import Result

from builder.engine import address
from builder.engine.progress import StepTracker
from builder.errors import StackError
from builder.hosts import fleet, k8s, remote
from builder.hosts.fleet import NOT_REACHED, OK, ROLLED_BACK, Fleet, GateResult, roll
from builder.hosts.pins import (
    Pin,
    PinOptions,
    load_previous_pin,
    make_pin,
    pinned_hosts,
    previous_pin_path,
    write_pin,
)
from builder.image.build import BuildOptions, build_argv
from builder.image.buildcache import INLINE_CACHE_ARG, CacheSettings, cache_argv, registry_cache
from builder.image.buildclient import BuildClient
from builder.image.records import Record, load_record, save_record
from builder.image.registry import Registry
from builder.manifest.resolve import resolve
from builder.render.context import render
from tests.support.served import SERVED_GPU, served

STACK = "vllm-0.22-marlin"
REPO = "registry.example.com/ml/sm120-stacks"
CLASSIC = BuildClient("classic+buildkit", ("docker", "build"), {"DOCKER_BUILDKIT": "1"})
BUILDX = BuildClient("buildx", ("docker", "buildx", "build", "--load"))


def _pin(
    stacks_dir: Path,
    tmp_path: Path,
    host: str = "gpu-a",
    stack: str = STACK,
    digest: str = "ab",
    **options: Any,
) -> Pin:
    resolved = resolve(stack, stacks_dir)
    content_hash = render(resolved).content_hash()
    pushed = {REPO: f"{REPO}@sha256:{digest * 32}"}
    save_record(
        tmp_path / "build",
        Record(
            stack=stack, content_hash=content_hash, tests="passed", pushed=pushed, served=[served()]
        ),
    )
    record = load_record(tmp_path / "build", stack, content_hash)
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    options.setdefault("volumes", (f"{tmp_path}/models:/models",))
    options.setdefault("gpu_kind", SERVED_GPU)
    if options.get("engine"):  # a host reached from here serves beyond its loopback: a key
        options.setdefault("ports", ("8000:8000",))
        options.setdefault("api_key_file", "/etc/sm120-stacks/keys/gpu.key")
    return make_pin(host, resolved, content_hash, record, None, PinOptions(**options), when)


# --- 1. the shared build cache -----------------------------------------------------------------


def test_a_variant_takes_its_cache_from_its_own_and_its_parents_images(
    stacks_dir: Path,
) -> None:
    (stacks_dir / "marlin-port.yaml").write_text(f"extends: {STACK}\nserve:\n  port: 8001\n")
    stack = resolve("marlin-port", stacks_dir)
    settings = registry_cache(stack, "c" * 64, Registry.parse("127.0.0.1:5000/team"))
    repo = "127.0.0.1:5000/team/sm120-stacks"
    assert settings.sources == (
        f"{repo}:marlin-port-{'c' * 16}",
        f"{repo}:marlin-port",
        f"{repo}:{STACK}",
    )
    assert settings.inline and settings.export is None


def test_cache_options_in_each_clients_spelling() -> None:
    settings = CacheSettings(sources=("r/x:a",))
    assert cache_argv(settings, CLASSIC.kind) == [
        *("--build-arg", INLINE_CACHE_ARG),
        *("--cache-from", "r/x:a"),
    ]
    exported = CacheSettings(sources=("r/x:a",), export="r/x:buildcache-s")
    assert cache_argv(exported, BUILDX.kind) == [
        *("--cache-to", "type=inline"),
        *("--cache-to", "type=registry,ref=r/x:buildcache-s,mode=max"),
        *("--cache-from", "type=registry,ref=r/x:a"),
    ]
    with pytest.raises(ValueError, match="needs buildx"):
        cache_argv(exported, CLASSIC.kind)


def test_every_build_embeds_inline_cache_and_imports_what_it_is_given(
    stacks_dir: Path, tmp_path: Path
) -> None:
    stack = resolve(STACK, stacks_dir)
    plain = build_argv(stack, render(stack), tmp_path, CLASSIC, BuildOptions(), tmp_path / "iid")
    assert INLINE_CACHE_ARG in plain and "--cache-from" not in plain
    options = BuildOptions(cache=CacheSettings(sources=("reg/sm120-stacks:x",)))
    argv = build_argv(stack, render(stack), tmp_path, CLASSIC, options, tmp_path / "iid")
    assert argv[argv.index("--cache-from") + 1] == "reg/sm120-stacks:x"
    assert argv[-1] == str(tmp_path), "the context stays last"


def test_a_missing_cache_source_is_not_the_failing_step() -> None:
    """BuildKit logs a cache source the registry lacks as an ERROR of its own step and builds
    on; a real failure after it must still be named."""
    tracker = StepTracker()
    for line in (
        "#6 importing cache manifest from 127.0.0.1:5000/x/sm120-stacks:ci-mini",
        "#6 ERROR: 127.0.0.1:5000/x/sm120-stacks:ci-mini: not found",
        "#9 [packages 2/3] RUN pip install x",
        "#9 ERROR: process did not complete successfully: exit code: 1",
    ):
        tracker.feed(line)
    assert tracker.failed == ("[packages 2/3] RUN pip install x", line.split("ERROR: ")[1])
    assert tracker.cache_misses == {
        "127.0.0.1:5000/x/sm120-stacks:ci-mini": "127.0.0.1:5000/x/sm120-stacks:ci-mini: not found"
    }


def test_cache_to_registry_without_buildx_exits_2(run_cli: Callable[..., Result]) -> None:
    result = run_cli("build", "ci-mini", "--cache-to-registry")
    assert result.exit_code == 2
    assert "--cache-to-registry needs a registry" in result.output


# --- 2. engine addresses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "unix:///var/run/docker.sock",
        "ssh://root@10.0.0.2",
        "ssh://gpu-node-07.example.com:2222",
        "tcp://10.0.0.2:2376",
        "ssh://deploy@[fd00::2]:22",
    ],
)
def test_engine_addresses_that_are_taken(text: str) -> None:
    assert address.check_address(text) == text


@pytest.mark.parametrize(
    "text",
    ["10.0.0.2", "ssh://", "http://h:1", "unix://relative", "ssh://root@h;rm -rf /", "tcp://h"],
)
def test_engine_addresses_that_are_refused(text: str) -> None:
    with pytest.raises(StackError, match="is not an engine address"):
        address.check_address(text)


def test_where_an_engine_is_reached() -> None:
    assert address.host_of(None) == "127.0.0.1"
    assert address.host_of("unix:///run/x.sock") == "127.0.0.1"
    assert address.host_of("ssh://root@10.0.0.2:2222") == "10.0.0.2"
    assert address.host_of("tcp://[fd00::2]:2376") == "fd00::2"
    assert address.ssh_destination("ssh://root@10.0.0.2:2222") == ("root@10.0.0.2", "2222")
    assert address.ssh_destination("ssh://h") == ("h", None)


def test_engine_option_is_handed_to_the_engine_not_written_into_the_environment(
    run_cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--engine reaches the engine adapter as an argument; DOCKER_HOST is only a default and
    is never changed (it used to be set for the command)."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    bad = run_cli("push", "ci-mini", "--engine", "10.0.0.2")
    assert bad.exit_code == 2 and "is not an engine address" in bad.output
    seen: list[tuple[str | None, str | None]] = []

    def fake_connect(address: str | None) -> Any:
        seen.append((address, os.environ.get("DOCKER_HOST")))
        raise StackError("stop here")

    monkeypatch.setattr("builder.engine.docker_adapter.connect_engine", fake_connect)
    for command in (
        ["push", "ci-mini", "--registry", "r:5000"],
        ["test", "ci-mini"],
        ["doctor"],
    ):
        result = run_cli(*command, "--engine", "ssh://root@10.0.0.9")
        assert result.exit_code == 2, (command, result.output)
    assert seen == [("ssh://root@10.0.0.9", "unix:///nonexistent.sock")] * 3
    assert os.environ["DOCKER_HOST"] == "unix:///nonexistent.sock"
    result = run_cli("push", "ci-mini", "--registry", "r:5000")
    assert seen[-1] == ("unix:///nonexistent.sock", "unix:///nonexistent.sock")


def test_a_remote_engine_is_probed_there_not_here() -> None:
    """The GPU gate and doctor read the engine's host: over ssh for ssh://, never this
    machine's devices for an engine elsewhere."""
    from builder.engine.hostprobe import Probe, probe_for

    assert probe_for(None) == Probe() and probe_for("unix:///run/docker.sock") == Probe()
    remote = probe_for("ssh://root@10.0.0.9:2222")
    assert remote.cdi_dirs == () and remote.run is not Probe().run
    tcp = probe_for("tcp://10.0.0.9:2375")
    assert tcp.which("nvidia-smi") is None and tcp.cdi_dirs == ()


def test_max_jobs_auto_sizes_for_the_engines_machine() -> None:
    from builder.engine.protocol import EngineHost
    from builder.image.jobs import auto_max_jobs
    from builder.manifest.resolve import resolve
    from tests.conftest import STACKS

    stack = resolve("vllm-0.33-b12x", STACKS)  # fp4_gemm_cutlass_sm120: ~7 GB a job
    big = EngineHost(
        "ssh://b@h", cpus=64, memory_bytes=256 * 1024**3, os_type="linux", architecture="x86_64"
    )
    small = EngineHost(
        "ssh://b@h", cpus=64, memory_bytes=16 * 1024**3, os_type="linux", architecture="x86_64"
    )
    unknown = EngineHost("tcp://h:2375", None, None, None, None)
    assert auto_max_jobs(stack, big) > auto_max_jobs(stack, small) >= 1
    assert auto_max_jobs(stack, unknown) == 1


# --- 3. pins with engines, previous pins, URLs -------------------------------------------------


def test_a_pin_names_its_engine_and_keeps_the_pin_it_replaced(
    stacks_dir: Path, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts"
    first = _pin(stacks_dir, tmp_path, engine="ssh://root@10.0.0.2")
    write_pin(hosts, first)
    assert load_previous_pin(hosts, "gpu-a") is None
    again = first.model_copy(update={"pinned_at": "2026-02-02T00:00:00Z"})
    write_pin(hosts, again)
    assert load_previous_pin(hosts, "gpu-a") is None, "the same pin again is no new previous"
    second = _pin(stacks_dir, tmp_path, digest="cd", engine="ssh://root@10.0.0.2")
    write_pin(hosts, second)
    previous = load_previous_pin(hosts, "gpu-a")
    assert previous is not None and previous.image == first.image
    assert previous.engine == "ssh://root@10.0.0.2"
    assert pinned_hosts(hosts) == ["gpu-a"], "hosts/previous/ holds no host"
    assert previous_pin_path(hosts, "gpu-a") == hosts / "previous" / "gpu-a.yaml"
    local = _pin(stacks_dir, tmp_path, host="gpu-b")
    text = write_pin(hosts, local).read_text()
    assert "engine:" not in text, "a pin for the local engine says nothing about engines"


def test_pin_refuses_a_bad_engine(run_cli: Callable[..., Result], tmp_path: Path) -> None:
    result = run_cli("pin", "gpu-a", "ci-mini", "--engine", "root@10.0.0.2")
    assert result.exit_code == 2 and "--engine: 'root@10.0.0.2' is not an engine address" in (
        result.output
    )


def test_server_url_of_each_kind_of_host(stacks_dir: Path, tmp_path: Path) -> None:
    local = _pin(stacks_dir, tmp_path)
    assert remote.server_url(local) == "http://127.0.0.1:8000"
    ssh = _pin(stacks_dir, tmp_path, engine="ssh://root@10.0.0.2")
    assert remote.server_url(ssh) == "http://10.0.0.2:8000"
    bound = _pin(stacks_dir, tmp_path, engine="ssh://root@h", ports=("10.1.1.1:9000:8000",))
    assert remote.server_url(bound) == "http://10.1.1.1:9000"
    loop = _pin(stacks_dir, tmp_path, engine="ssh://root@h", ports=("127.0.0.1:9000:8000",))
    with pytest.raises(StackError, match="unreachable from this machine"):
        remote.server_url(loop)
    other = _pin(stacks_dir, tmp_path, ports=("9000:9999",))
    with pytest.raises(StackError, match="publishes no host port"):
        remote.server_url(other)


def test_an_ssh_host_is_probed_over_ssh(stacks_dir: Path, tmp_path: Path) -> None:
    probe = remote.probe(_pin(stacks_dir, tmp_path, engine="ssh://root@10.0.0.2:2222"))
    assert probe.cdi_dirs == ()
    assert remote.probe(_pin(stacks_dir, tmp_path)).cdi_dirs != ()


# --- 3. the roll -------------------------------------------------------------------------------


class _Engine:
    """Only what roll itself asks of an engine (apply is replaced in these tests)."""

    def __init__(self) -> None:
        self.removed: list[str] = []

    def container(self, name: str) -> Any:
        engine = self

        class Gone:
            def remove(self, *, force: bool = False) -> None:
                engine.removed.append(name)

            attrs: ClassVar[dict[str, Any]] = {}

        return Gone() if name.endswith("-b") else None


def _fleet(
    monkeypatch: pytest.MonkeyPatch,
    failing: set[tuple[str, str]],
    previous: dict[str, Pin],
    applied: list[tuple[str, str]],
) -> Fleet:
    def fake_apply(
        pin: Pin, engine: Any, before_start: Any = None, must_restart: Any = None
    ) -> str:
        applied.append((pin.host, pin.image[-4:]))
        return f"started {pin.container}"

    monkeypatch.setattr(fleet, "apply", fake_apply)
    monkeypatch.setattr(fleet, "_runs_as_pinned", lambda pin, engine: False)
    return Fleet(
        connect=lambda pin: _Engine(),  # type: ignore[arg-type,return-value]
        gate=lambda pin, engine: GateResult(
            (pin.host, pin.image[-4:]) not in failing, "gate said so"
        ),
        previous=previous.get,
        log=lambda text: None,
    )


def test_a_roll_stops_at_the_first_failure_and_rolls_that_host_back(
    stacks_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = {h: _pin(stacks_dir, tmp_path, host=h, digest="01") for h in ("gpu-a", "gpu-b", "gpu-c")}
    new = [_pin(stacks_dir, tmp_path, host=h, digest="02") for h in ("gpu-a", "gpu-b", "gpu-c")]
    applied: list[tuple[str, str]] = []
    plan = _fleet(monkeypatch, {("gpu-b", "0202")}, old, applied)
    results = roll(new, plan)
    assert [r.status for r in results] == [OK, ROLLED_BACK, NOT_REACHED]
    assert applied == [("gpu-a", "0202"), ("gpu-b", "0202"), ("gpu-b", "0101")]
    assert results[1].rollback is not None and "passes its gate" in results[1].rollback


def test_a_rollback_that_fails_too_says_so_and_a_host_without_previous_is_stopped(
    stacks_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = {"gpu-a": _pin(stacks_dir, tmp_path, host="gpu-a", digest="01")}
    new = [_pin(stacks_dir, tmp_path, host=h, digest="02") for h in ("gpu-a", "gpu-b")]
    applied: list[tuple[str, str]] = []
    plan = _fleet(monkeypatch, {("gpu-a", "0202"), ("gpu-a", "0101")}, old, applied)
    results = roll(new, plan)
    assert [r.status for r in results] == [ROLLED_BACK, NOT_REACHED]
    assert results[0].rollback is not None and "FAILS its gate too" in results[0].rollback
    applied.clear()
    plan = _fleet(monkeypatch, {("gpu-b", "0202")}, {}, applied)
    results = roll(new, plan)
    assert [r.status for r in results] == [OK, ROLLED_BACK]
    assert results[1].rollback is not None and "no previous pin" in results[1].rollback


def test_a_host_that_already_ran_its_pin_is_not_rolled_back(
    stacks_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = {"gpu-a": _pin(stacks_dir, tmp_path, host="gpu-a", digest="01")}
    new = [_pin(stacks_dir, tmp_path, host="gpu-a", digest="02")]
    applied: list[tuple[str, str]] = []
    plan = _fleet(monkeypatch, {("gpu-a", "0202")}, old, applied)
    monkeypatch.setattr(fleet, "_runs_as_pinned", lambda pin, engine: True)
    (result,) = roll(new, plan)
    assert result.status == "failed" and applied == [("gpu-a", "0202")]
    assert result.rollback is not None and result.rollback.startswith("not needed")


def test_deploy_and_verify_take_a_host_or_all(
    run_cli: Callable[..., Result], tmp_path: Path
) -> None:
    for command in ("deploy", "verify"):
        assert "name a HOST, or pass --all" in run_cli(command).output
        both = run_cli(command, "gpu-a", "--all")
        assert both.exit_code == 2 and "not both" in both.output
    empty = run_cli("verify", "--all", "--hosts-dir", str(tmp_path / "none"))
    assert empty.exit_code == 2 and "no host pins" in empty.output


# --- 5. Kubernetes -----------------------------------------------------------------------------


def _docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_k8s_runs_the_pinned_digest_on_tp_times_pp_gpus(stacks_dir: Path, tmp_path: Path) -> None:
    (stacks_dir / "marlin-tp.yaml").write_text(
        f"extends: {STACK}\nserve:\n  tensor_parallel_size: 2\n  pipeline_parallel_size: 2\n"
    )
    pin = _pin(stacks_dir, tmp_path, stack="marlin-tp", volumes=("/srv/models:/models:ro",))
    deployment, service = _docs(k8s.render(pin, "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"))
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == pin.image and "@sha256:" in container["image"]
    assert container["imagePullPolicy"] == "IfNotPresent", "a node that has it needs no registry"
    assert container["args"] == pin.command
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 4}}
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
    }
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= pin.health.start_period_s
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    models = next(v for v in pod["volumes"] if "hostPath" in v)
    assert models["hostPath"] == {"path": "/srv/models", "type": "Directory"}
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == pin.serve_port


def test_k8s_without_a_product_selects_the_compute_capability(
    stacks_dir: Path, tmp_path: Path
) -> None:
    pin = _pin(stacks_dir, tmp_path)
    (deployment, _) = k8s.manifests(pin)
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.compute.major": "12",
        "nvidia.com/gpu.compute.minor": "0",
    }
    with pytest.raises(StackError, match="not a label value"):
        k8s.manifests(pin, "RTX PRO 6000")


def test_the_schema_refuses_what_kubernetes_would(stacks_dir: Path, tmp_path: Path) -> None:
    pin = _pin(stacks_dir, tmp_path)
    deployment, _ = k8s.manifests(pin)
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(k8s.ManifestInvalid, match="imagePullPolicy"):
        k8s.check(deployment)
    deployment, _ = k8s.manifests(pin)
    deployment["spec"]["template"]["spec"]["shmSize"] = "16Gi"  # a docker option, not a pod field
    with pytest.raises(k8s.ManifestInvalid, match="shmSize"):
        k8s.check(deployment)
    deployment, _ = k8s.manifests(pin)
    del deployment["spec"]["selector"]
    with pytest.raises(k8s.ManifestInvalid, match="selector"):
        k8s.check(deployment)


def test_deploy_format_k8s_writes_the_file(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    hosts = tmp_path / "hosts"
    write_pin(hosts, _pin(stacks_dir, tmp_path))
    result = run_cli("deploy", "gpu-a", "--format", "k8s", "--hosts-dir", str(hosts))
    assert result.exit_code == 0, result.output
    path = Path(result.output.strip())
    assert path.name == "k8s.yaml" and [d["kind"] for d in _docs(path.read_text())] == [
        "Deployment",
        "Service",
    ]
    refused = run_cli("deploy", "gpu-a", "--format", "k8s", "--apply", "--hosts-dir", str(hosts))
    assert refused.exit_code == 2 and "kubectl apply" in refused.output


def test_the_committed_schema_says_where_it_came_from() -> None:
    import json

    source = json.loads(k8s.SCHEMA.read_text())["source"]
    assert source["kubernetes"] == "v1.33.0"
    assert source["wheel_sha256"] and "kubernetes-validate 1.37.0" in source["from"]


def test_a_failed_smoke_names_each_failed_check_once() -> None:
    from builder.verify.smoke_report import Check

    checks = [Check("correct answer", False, f"[{p}] -> 'Louisville'") for p in ("cold", "warm")]
    said = fleet._failures([*checks, Check("server stays up", False, "died")])
    assert said == "correct answer (2x): [cold] -> 'Louisville'; server stays up: died"


def test_a_rollback_whose_engine_stopped_answering_is_not_called_rolled_back(
    stacks_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34's outage slice (engine deploy t0.40, t0.70): the engine killed under `deploy
    --apply` failed the gate, then the previous pin's start; the host was said "rolled back"
    and the roll's last line named no failure. Now its status says the rollback failed."""
    from builder.errors import EngineUnreachable
    from builder.hosts.fleet import ROLLBACK_FAILED

    old = {"gpu-a": _pin(stacks_dir, tmp_path, host="gpu-a", digest="01")}
    new = [_pin(stacks_dir, tmp_path, host=h, digest="02") for h in ("gpu-a", "gpu-b")]
    applied: list[tuple[str, str]] = []
    plan = _fleet(monkeypatch, {("gpu-a", "0202")}, old, applied)

    def engine_gone(
        pin: Pin, engine: Any, before_start: Any = None, must_restart: Any = None
    ) -> str:
        applied.append((pin.host, pin.image[-4:]))
        if pin.image.endswith("0101"):
            raise EngineUnreachable("engine at /run/docker.sock: [Errno 111] Connection refused")
        return f"started {pin.container}"

    monkeypatch.setattr(fleet, "apply", engine_gone)
    results = roll(new, plan)
    assert [r.status for r in results] == [ROLLBACK_FAILED, NOT_REACHED]
    assert results[0].rollback is not None
    assert results[0].rollback.startswith("FAILED to start the previous pin")


@pytest.mark.parametrize(
    ("error", "lines"),
    [
        (None, ["failed: the roll stopped at gpu-a (rollback failed)"]),
        ("the engine's API dropped the connection", []),  # the command's own error line is it
    ],
)
def test_a_stopped_roll_ends_with_one_line_naming_what_to_do(
    error: str | None, lines: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 34's outage slice: a gate that failed under a killed engine ended with no failed:
    line (exit 1, nothing to do); one that failed at apply ended with two after the first fix."""
    from builder.cli.fleet import _print_results
    from builder.hosts.fleet import ROLLBACK_FAILED, HostResult

    stopped = HostResult("gpu-a", "unix:///run/h1.sock", "r/s@sha256:" + "1" * 64, ROLLBACK_FAILED)
    _print_results([HostResult(**{**stopped.__dict__, "error": error})])
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("failed:")]
    assert [line.split(";")[0] for line in said] == lines
    if said:
        assert "once its engine answers (`docker -H unix:///run/h1.sock version`)" in said[0]
        assert "nothing may serve there now" in said[0]


def test_an_engine_lost_at_apply_is_said_with_what_to_do(
    stacks_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34's outage slice, engine deploy t0.10 (run obd0f): the engine killed as `deploy
    --apply` started the container; the error line said only "the engine's API dropped the
    connection"."""
    from builder.errors import EngineUnreachable

    new = [_pin(stacks_dir, tmp_path, host="gpu-a", digest="02")]
    plan = _fleet(monkeypatch, set(), {}, [])

    def engine_gone(
        pin: Pin, engine: Any, before_start: Any = None, must_restart: Any = None
    ) -> str:
        raise EngineUnreachable("the engine's API dropped the connection: Connection aborted")

    monkeypatch.setattr(fleet, "apply", engine_gone)
    (result,) = roll(new, plan)
    assert result.error is not None
    assert result.error.startswith("the Docker engine stopped answering: the engine's API")
    assert "once it answers again (`docker -H" in result.error and "deploy again" in result.error


def test_the_stopping_error_names_its_host_once() -> None:
    """Issue 43: an error raised for the host already leads with it ("gpu-1: warm required")
    and deploy printed "error: gpu-1: gpu-1: warm required"."""
    from builder.cli.fleet import host_named

    said = "gpu-1: warm required, and no warm cache in the registry for this image"
    assert host_named("gpu-1", said) == said
    assert host_named("gpu-1", "pulling x failed") == "gpu-1: pulling x failed"
    assert host_named("gpu-1", "gpu-10: other host") == "gpu-1: gpu-10: other host"
