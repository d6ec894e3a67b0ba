"""Pinning a host end to end on the local engine and registry.

lock (base digest from the local registry, torch from the local wheel via find-links) -> build
with hash checking -> push -> pin -> deploy --apply -> verify clean; then the container is
changed behind the pin's back (another image, an env var, stopped, a restart loop) and verify
must name each drift. The stack is this module's own (hosts-e2e), written in full rather than
extending ci-mini, so changes to ci-mini do not change what is tested here.

The `test` command (image validation) records whether an image passed; these tests write that
record with builder.image.records directly, since validation itself is tested elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from builder import REPO_ROOT
from builder.engine.docker_adapter import run_kwargs
from builder.hosts.deploy import container_spec
from builder.hosts.pins import LABEL_HOST, load_pin
from builder.image.names import content_tag, local_ref, moving_ref
from builder.image.records import load_record, save_record
from builder.image.registry import Registry
from builder.manifest.resolve import resolve
from builder.render.context import render
from tests.engine.conftest import RUN, unique
from tests.support.net import free_port
from tests.support.served import served

pytestmark = pytest.mark.engine

STACK = unique("hosts-e2e")
HOST = unique("hosts-e2e-node")
LOCAL_BASE = "local/debian-python:bookworm"
TORCH_WHEEL = "build/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
#: A random-weight chat model: enough for `transformers serve` to load and answer /health.
MAKE_MODEL = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
core = Tokenizer(models.BPE())
core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
core.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
core.train_from_iterator(["hello world"] * 4, trainer=trainer)
tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
    chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
    max_position_embeddings=64)
LlamaForCausalLM(config).save_pretrained(sys.argv[1])
tok.save_pretrained(sys.argv[1])
"""


def _manifest(base: str) -> str:
    return f"""\
description: host pinning end-to-end test stack (CPU torch, transformers serve)
status: ci
platform: linux/amd64
gpus: [sm120]
cuda: "13.0.2"
bases:
  build: {{image: "{base}"}}
  runtime: {{image: "{base}"}}
python:
  version: "3.11"
  wheels: [{TORCH_WHEEL}]
  packages:
    torch: 2.13.0+cpu
    transformers: {{version: 5.24.0, extras: [serving]}}
  heavy: [torch]
env:
  HF_HUB_OFFLINE: "1"
  OMP_NUM_THREADS: "1"
serve:
  engine: transformers
  model: {{id: /models/tiny}}
  shm_size: 1g
smoke:
  health_timeout_s: 120
"""


def _push(api: Any, repository: str, tag: str) -> None:
    for line in api.api.push(repository, tag=tag, stream=True, decode=True):
        assert "error" not in line, line


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {seconds}s waiting for {what}")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def registry_base(api: Any, registry: Registry, workspace: Path) -> Iterator[str]:
    """The local base image, pushed to the local registry so `lock` can resolve its digest."""
    from docker.errors import ImageNotFound

    try:
        api.images.get(LOCAL_BASE)
    except ImageNotFound:
        subprocess.run([str(REPO_ROOT / "scripts" / "make-base-local.sh")], check=True)
    repository = f"{registry.host}/sm120-hosts-test/debian-python"
    api.images.get(LOCAL_BASE).tag(repository, "bookworm")
    _push(api, repository, "bookworm")
    yield f"{repository}:bookworm"
    with contextlib.suppress(Exception):
        api.images.remove(f"{repository}:bookworm")


@pytest.fixture(scope="module")
def deployed(
    workspace: Path,
    cli_process: Callable[..., Any],
    api: Any,
    registry: Registry,
    registry_base: str,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_signing_key: Path,
) -> Iterator[dict[str, Any]]:
    """hosts-e2e locked, built, recorded as tested, pushed signed, pinned and running as
    pinned (with no trust.yaml, `pin` trusts the signing key on first use and refuses
    unsigned evidence: issue 43)."""
    stacks = workspace / "stacks"
    (stacks / f"{STACK}.yaml").write_text(_manifest(registry_base))
    locked = cli_process("lock", STACK)
    content_hash = render(resolve(STACK, stacks)).content_hash()
    # The tests read this build's context and log: an image of the same content left on the
    # engine by an earlier run would make the build a no-op (its layers stay cached).
    with contextlib.suppress(docker.errors.ImageNotFound):
        api.images.remove(local_ref(STACK, content_hash), force=True)
    built = cli_process("build", STACK)
    record = load_record(workspace / "build", STACK, content_hash)
    record.static = "passed"  # what `sm120-stacks test` records when the image passes
    record.served = [served("cpu")]  # its CPU smoke (the pin gives it no GPU)
    save_record(workspace / "build", record)
    cli_process("push", STACK, "--registry", registry.host, "--signing-key", str(tiny_signing_key))
    image = local_ref(STACK, content_hash)
    models = tmp_path_factory.mktemp("models")
    api.containers.run(
        image,
        ["python", "-c", MAKE_MODEL, "/out/tiny"],
        remove=True,
        network_mode="none",
        volumes={str(models): {"bind": "/out", "mode": "rw"}},
    )
    port = free_port()
    cli_process(
        *("pin", HOST, STACK, "--gpus", "none", "--registry", registry.host),
        *("--port", f"127.0.0.1:{port}:8000", "--volume", f"{models}:/models:ro"),
    )
    applied = cli_process("deploy", HOST, "--apply")
    _wait(lambda: _healthy(port), 180, "the deployed server's /health")
    yield {
        "lock": locked.stdout,
        "build": built.stdout,
        "apply": applied.stdout,
        "hash": content_hash,
        "image": image,
        "models": models,
        "port": port,
        "pin": load_pin(workspace / "hosts", HOST),
    }
    for container in api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={HOST}"}):
        container.remove(force=True)
    pushed_tags = (registry.ref(content_tag(STACK, content_hash)), registry.ref(STACK))
    for ref in (image, moving_ref(STACK), *pushed_tags, f"sm120-hosts-test/drifted:{RUN}"):
        with contextlib.suppress(Exception):
            api.images.remove(ref)


def _verify(cli_process: Callable[..., Any]) -> tuple[int, dict[str, str], str]:
    result = cli_process("verify", HOST, "--json", check=False)
    report = json.loads(result.stdout)
    return result.returncode, {d["name"]: d["detail"] for d in report["drifts"]}, result.stdout


def _redeploy(cli_process: Callable[..., Any], deployed: dict[str, Any]) -> None:
    result = cli_process("deploy", HOST, "--apply")
    assert "replaced" in result.stdout or "started" in result.stdout
    _wait(lambda: _healthy(deployed["port"]), 180, "the redeployed server")


def _run_changed(api: Any, deployed: dict[str, Any], **changes: Any) -> None:
    """Replace the pinned container by one with the same settings except `changes`."""
    pin = deployed["pin"]
    api.containers.get(pin.container).remove(force=True)
    kwargs = run_kwargs(container_spec(pin))
    kwargs.update(changes)
    api.containers.run(**kwargs)


def test_lock_resolves_the_base_digest_and_hashes_the_local_wheel(
    deployed: dict[str, Any], workspace: Path, registry_base: str
) -> None:
    assert "digest resolved from the registry" in deployed["lock"]
    lock = yaml.safe_load((workspace / "stacks" / f"{STACK}.lock").read_text())
    digest = lock["bases"]["build"]["digest"]
    assert digest.startswith("sha256:")
    torch = lock["python"]["heavy"]["torch"]
    assert torch["version"] == "2.13.0+cpu"
    wheel_hash = lock["inputs"]["wheel_files"][Path(TORCH_WHEEL).name]
    assert wheel_hash in torch["hashes"]
    assert "transformers" in lock["python"]["packages"]
    dockerfile = (workspace / "build" / STACK / "context" / "Dockerfile").read_text()
    assert f"FROM {registry_base}@{digest} AS toolchain" in dockerfile


def test_the_image_holds_exactly_the_locked_set_installed_with_hashes(
    deployed: dict[str, Any], workspace: Path, api: Any, tmp_path: Path
) -> None:
    """Installed hash-checked, and `test`'s locked-set check, in a container of the image,
    passes; a lock whose transformers moved (as pip floated it to 5.x unlocked) fails it."""
    from builder.verify.expectations import expectations
    from builder.verify.run_checks import CheckInputs, run_checks

    log = next((workspace / "build" / STACK / "logs").glob("*.log")).read_text()
    assert "--require-hashes --no-deps -r /opt/sm120-stacks/requirements/lock-heavy.txt" in log
    stack = resolve(STACK, workspace / "stacks")
    rendered = render(stack)
    assert rendered.content_hash() == deployed["hash"] and rendered.lock is not None
    expect = expectations(stack, deployed["hash"], rendered.lock).to_json()
    assert "transformers" in expect["locked"]
    container = api.containers.run(
        deployed["image"], ["sleep", "infinity"], detach=True, network_mode="none"
    )
    try:

        def verdict(locked: dict[str, str]) -> Any:
            inputs = CheckInputs({**expect, "locked": locked}, {}, [])
            hosts = f"docker://{container.id}"
            (result,) = run_checks(inputs, hosts, tmp_path, "installed_set_equals_the_lock")
            return result

        assert verdict(expect["locked"]).passed
        floated = verdict({**expect["locked"], "transformers": "0.0.1"})
        assert not floated.passed and "transformers 0.0.1 -> " in floated.detail
    finally:
        container.remove(force=True)


def test_pin_records_the_pushed_digest_and_deploy_runs_it(
    deployed: dict[str, Any], registry: Registry, api: Any
) -> None:
    pin = deployed["pin"]
    assert pin.image.startswith(f"{registry.repository}@sha256:")
    assert pin.content_hash == deployed["hash"]
    container = api.containers.get(pin.container)
    assert container.attrs["Config"]["Image"] == pin.image
    assert pin.image in api.images.get(container.attrs["Image"]).attrs["RepoDigests"]


def test_verify_is_clean_and_apply_is_idempotent(
    deployed: dict[str, Any], cli_process: Callable[..., Any]
) -> None:
    status, drifts, out = _verify(cli_process)
    assert (status, drifts) == (0, {}), out
    assert "nothing to do" in cli_process("deploy", HOST, "--apply").stdout
    human = cli_process("verify", HOST)
    assert human.stdout.strip().endswith("no drift")


def test_verify_names_an_env_drift(
    deployed: dict[str, Any], cli_process: Callable[..., Any], api: Any
) -> None:
    pin = deployed["pin"]
    _run_changed(api, deployed, environment={**pin.env, "EXTRA_DRIFT": "1", "OMP_NUM_THREADS": "2"})
    status, drifts, out = _verify(cli_process)
    assert status == 1 and set(drifts) == {"env"}, out
    assert "EXTRA_DRIFT='1' is set but not pinned" in drifts["env"]
    assert "OMP_NUM_THREADS is '2', pinned '1'" in drifts["env"]
    _redeploy(cli_process, deployed)
    assert _verify(cli_process)[0] == 0


def test_verify_names_another_image(
    deployed: dict[str, Any], cli_process: Callable[..., Any], api: Any
) -> None:
    pin = deployed["pin"]
    api.containers.get(pin.container).commit("sm120-hosts-test/drifted", RUN)
    _run_changed(api, deployed, image=f"sm120-hosts-test/drifted:{RUN}")
    status, drifts, out = _verify(cli_process)
    assert status == 1 and "image" in drifts, out
    assert "no registry digest" in drifts["image"] and pin.image in drifts["image"]
    _redeploy(cli_process, deployed)


def test_verify_names_a_stopped_container(
    deployed: dict[str, Any], cli_process: Callable[..., Any], api: Any
) -> None:
    api.containers.get(deployed["pin"].container).stop(timeout=5)
    status, drifts, out = _verify(cli_process)
    assert status == 1 and set(drifts) == {"state"}, out
    assert drifts["state"].startswith("exited")
    _redeploy(cli_process, deployed)


def test_verify_names_a_restart_loop(
    deployed: dict[str, Any], cli_process: Callable[..., Any], api: Any
) -> None:
    """The model disappears: the server exits at start and the restart policy loops it."""
    models: Path = deployed["models"]
    (models / "tiny").rename(models / "tiny.away")
    try:
        container = api.containers.get(deployed["pin"].container)
        container.restart(timeout=5)

        def looping() -> bool:
            container.reload()
            return int(container.attrs["RestartCount"]) >= 2

        _wait(looping, 240, "two restarts")
        status, drifts, out = _verify(cli_process)
        assert status == 1 and "restarts" in drifts, out
        assert "crash loop" in drifts["restarts"]
        assert set(drifts) <= {"restarts", "state", "health"}
    finally:
        (models / "tiny.away").rename(models / "tiny")
    _redeploy(cli_process, deployed)


def test_a_stale_lock_stops_the_build(
    deployed: dict[str, Any], cli_process: Callable[..., Any], workspace: Path
) -> None:
    stacks = workspace / "stacks"
    stale = f"{STACK}-stale"
    (stacks / f"{stale}.yaml").write_text((stacks / f"{STACK}.yaml").read_text())
    shutil.copy(stacks / f"{STACK}.lock", stacks / f"{stale}.lock")
    try:
        result = cli_process("build", stale, check=False)
        assert result.returncode == 2
        assert f"{stale}.lock: inputs_hash: lock no longer matches" in result.stderr
        checked = cli_process("check", stale, check=False)
        assert checked.returncode == 2 and f"made for stack '{STACK}'" in checked.stderr
    finally:
        (stacks / f"{stale}.yaml").unlink()
        (stacks / f"{stale}.lock").unlink()


def test_a_child_adding_a_package_builds_on_its_parents_package_layer(
    deployed: dict[str, Any],
    cli_process: Callable[..., Any],
    workspace: Path,
    api: Any,
    tmp_path: Path,
) -> None:
    """Issue 46: a locked child that adds one package (and whose lock drops one of the
    parent's) takes the parent's package layer from BuildKit's cache and installs only its
    difference over it; its image holds exactly its own lock."""
    from builder.lock.reading import read_lock
    from builder.lock.writing import write_lock
    from builder.verify.expectations import expectations
    from builder.verify.run_checks import CheckInputs, run_checks

    stacks = workspace / "stacks"
    child = f"{STACK}-humanize"
    (stacks / f"{child}.yaml").write_text(
        f"extends: {STACK}\npython:\n  packages:\n    humanize: 4.12.3\n"
    )
    parent = render(resolve(STACK, stacks))
    cli_process("lock", child, "--versions-from", f"stacks/{STACK}.lock")
    lock = read_lock(stacks / f"{child}.lock")
    jit = parent.files["requirements/jit.txt"][0].decode()
    dropped = max(n for n in lock.python.packages if f"\n{n}==" not in jit and n != "humanize")
    packages = {n: p for n, p in lock.python.packages.items() if n != dropped}
    python = lock.python.model_copy(update={"packages": packages})
    write_lock(stacks / f"{child}.lock", lock.model_copy(update={"python": python}))
    rendered = render(resolve(child, stacks))
    image = local_ref(child, rendered.content_hash())
    try:
        assert rendered.files["requirements/jit.txt"] == parent.files["requirements/jit.txt"]
        cli_process("build", child)
        log_name = f"{content_tag(child, rendered.content_hash())}.log"
        log = (workspace / "build" / child / "logs" / log_name).read_text()
        steps = dict(re.findall(r"^(#\d+) \[packages [^\]]*\] (.*)$", log, flags=re.M))
        base = [n for n, text in steps.items() if "lock-base.txt" in text]
        assert len(base) == 2, steps  # the COPY and the install over it
        for number in base:
            assert f"{number} CACHED" in log, f"{steps[number]} ran again"
        (own,) = [n for n, t in steps.items() if "-r /opt/sm120-stacks/requirements/lock.txt" in t]
        # Its own step runs unless this engine built the same difference before (an earlier
        # run's child: the same bytes, so BuildKit's key); what the image holds is checked below.
        if f"{own} CACHED" not in log:
            assert "Uninstalled 1 package" in log and "Installed 1 package" in log, log
        expect = expectations(resolve(child, stacks), rendered.content_hash(), rendered.lock)
        container = api.containers.run(
            image, ["sleep", "infinity"], detach=True, network_mode="none"
        )
        try:
            inputs = CheckInputs(expect.to_json(), {}, [])
            hosts = f"docker://{container.id}"
            (result,) = run_checks(inputs, hosts, tmp_path, "installed_set_equals_the_lock")
            assert result.passed, result.detail
            assert "humanize" in expect.to_json()["locked"]
            assert dropped not in expect.to_json()["locked"]
        finally:
            container.remove(force=True)
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            api.images.remove(image)
        for suffix in (".yaml", ".lock"):
            (stacks / f"{child}{suffix}").unlink(missing_ok=True)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_doctor_on_a_machine_without_gpu_says_so(cli_process: Callable[..., Any]) -> None:
    result = cli_process("doctor", "--stack", "ci-mini", check=False)
    assert result.returncode == 1
    assert "ok    engine: Docker engine reachable" in result.stdout
    assert "FAIL  gpu: this machine has no NVIDIA GPU (nvidia-smi is not on PATH)" in result.stdout
    assert "fix: install the NVIDIA driver >= 580.65.06" in result.stdout
    assert "FAIL  runtime: no NVIDIA container runtime" in result.stdout


def test_apply_on_a_fresh_host_makes_the_folders_the_pin_writes_to(
    deployed: dict[str, Any],
    workspace: Path,
    cli_process: Callable[..., Any],
    api: Any,
    tmp_path: Path,
) -> None:
    """A fresh host has no /var/lib/sm120-stacks/models yet: the engine refused the bind mount
    (400 ... bind source path does not exist). deploy --apply makes the pin's read-write bind
    folders first; the container then starts."""
    from builder.engine.protocol import Mount
    from builder.hosts.pins import write_pin

    fresh = tmp_path / "fresh" / "var" / "lib" / "sm120-stacks" / "models"
    host = unique("hosts-e2e-fresh")
    pin = deployed["pin"].model_copy(
        update={
            "host": host,
            "container": f"sm120-stacks-{host}",
            "ports": [],
            "volumes": [Mount(str(fresh), "/models")],
        }
    )
    write_pin(workspace / "hosts", pin)
    try:
        result = cli_process("deploy", host, "--apply", check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"created {fresh}" in result.stdout
        assert f"started {pin.container}" in result.stdout
        assert fresh.is_dir()
        mounts = api.containers.get(pin.container).attrs["Mounts"]
        assert [(m["Source"], m["Destination"]) for m in mounts] == [(str(fresh), "/models")]
    finally:
        for container in api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={host}"}):
            container.remove(force=True)
        (workspace / "hosts" / f"{host}.yaml").unlink(missing_ok=True)
