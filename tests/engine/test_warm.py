"""Warm caches on the real engine and registry: a host's cold start compiles into its cache
volume; `cache capture` pushes it beside the image; a second host's `deploy --apply` restores
it before the start and `cache prove` shows nothing compiled; a host whose key differs is
refused with what differs; a tampered artifact restores nothing; a restore killed between its
staging and its swap leaves the volume as it was.

The server is a few lines of Python with a JIT cache's behaviour: at start it loads its kernel
from TRITON_CACHE_DIR, or "compiles" it (writes it, beside a lock file a capture must leave
out) when it is not there. The proof of zero compiles is on the restored host's own volume.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.errors import StackError
from builder.evidence.oci import ArtifactStore
from builder.hosts.pins import CACHE_ENV, CACHE_TARGET, LABEL_HOST, PIN_SCHEMA, Pin, write_pin
from builder.hosts.remote import connect
from builder.hosts.warm_target import host_facts, target_of
from builder.image.registry import Registry
from builder.knowledge.cache_volume import cache_volume
from builder.warm import archive, artifact
from builder.warm.lifecycle import host_key, restore
from builder.warm.volume import VolumeAccess, open_volume
from tests.engine.conftest import RUN, pushed_local_base, unique
from tests.support.health import wait_healthy
from tests.support.net import free_port

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("signed_warm")]

#: One line: load the kernel or compile it (1 s; its bytes name the container that made it),
#: keep a lock beside it, serve /health.
SERVER = (
    "import http.server as h, os, pathlib, time; "
    "d = pathlib.Path(os.environ['TRITON_CACHE_DIR']) / 'grp0'; "
    "d.mkdir(parents=True, exist_ok=True); k = d / 'kernel.cubin'; "
    "k.exists() or (time.sleep(1), k.write_bytes(os.uname().nodename.encode() * 256)); "
    "(d / 'kernel.lock').write_text('held'); "
    "H = type('H', (h.BaseHTTPRequestHandler,), {"
    "'do_GET': lambda s: (s.send_response(200), s.end_headers(), s.wfile.write(b'ok')), "
    "'log_message': lambda s, *a: None}); "
    "h.HTTPServer(('0.0.0.0', 8000), H).serve_forever()"
)


@pytest.fixture(scope="module")
def served_image(
    api: Any, engine: Any, registry: Registry, request: pytest.FixtureRequest
) -> Iterator[str]:
    """The local base image in the registry, by digest (what a pin names), in a repository of
    each test module's own: warm caches are found by the image's referrers in its repository,
    and the modules that reuse these fixtures (test_trust_warm, test_warm_integrity) push
    their own, which a cold host here must not find."""
    module = Path(str(request.module.__file__)).stem
    with pushed_local_base(api, engine, registry, f"sm120-warm-test-{RUN}/{module}") as image:
        yield image


@pytest.fixture(scope="module")
def signed_warm(
    workspace: Path, served_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """Safe by default (issue 43): deploy --apply relies on signed evidence only, and restores
    only warm caches a trusted key signed. So this module's image carries evidence signed by
    its own key, trust.yaml names that key for builds and warm caches on cpu, and `cache
    capture` signs with it (SM120_STACKS_SIGNING_KEY); trust.yaml is removed afterwards (the
    workspace's hosts folder is the session's). The key file."""
    import json

    from builder.evidence.keys import generate_key_pair
    from tests.support.signed_evidence import attach_evidence

    folder = workspace / "hosts"
    keys = tmp_path_factory.mktemp("warm-keys")
    generate_key_pair(keys, "warm-ops")
    (folder / "warm-test-keys").mkdir(parents=True, exist_ok=True)
    pub = folder / "warm-test-keys" / f"warm-ops-{RUN}.pub"
    pub.write_bytes((keys / "warm-ops.pub").read_bytes())
    attach_evidence(served_image, "warm-test", "0" * 64, keys / "warm-ops.key")
    document = {
        "version": 1,
        "keys": {"warm-ops": str(pub.relative_to(folder))},
        "purposes": {"build": ["warm-ops"], "warm": {"cpu": ["warm-ops"]}},
    }
    (folder / "trust.yaml").write_text(json.dumps(document))  # JSON is YAML
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SM120_STACKS_SIGNING_KEY", str(keys / "warm-ops.key"))
        yield keys / "warm-ops.key"
    (folder / "trust.yaml").unlink(missing_ok=True)


def server_pin(
    host: str, image: str, port: int, volume_prefix: str, env: dict[str, str] | None = None
) -> Pin:
    """A pin of the stand-in server (SERVER) of image on host: its cache volume
    VOLUME_PREFIX-HOST, its port on loopback, no GPU."""
    return Pin.model_validate(
        {
            "schema_version": PIN_SCHEMA,
            "host": host,
            "stack": "warm-test",
            "content_hash": "0" * 64,
            "image": image,
            "pinned_at": "2026-12-01T00:00:00Z",
            "container": f"sm120-stacks-{host}",
            "command": ["python3", "-c", SERVER],
            "serve_port": 8000,
            "env": {**CACHE_ENV, **(env or {})},
            "gpus": "none",
            "ports": [f"127.0.0.1:{port}:8000"],
            "volumes": [{"source": f"{volume_prefix}-{host}", "target": CACHE_TARGET}],
            "shm_size": "64m",
            "health": {"interval_s": 600, "start_period_s": 60},
            "needs": {"cuda": "13.0.2", "min_driver": None, "targets": {"sm120": "12.0"}},
        }
    )


@pytest.fixture
def hosts(workspace: Path, served_image: str, api: Any) -> Iterator[Callable[..., tuple[Pin, int]]]:
    made: list[Pin] = []

    def pin(name: str, env: dict[str, str] | None = None) -> tuple[Pin, int]:
        port = free_port()
        pinned = server_pin(unique(name), served_image, port, "sm120-warm", env)
        write_pin(workspace / "hosts", pinned)
        made.append(pinned)
        return pinned, port

    yield pin
    for pinned in made:
        for container in api.containers.list(
            all=True, filters={"label": f"{LABEL_HOST}={pinned.host}"}
        ):
            container.remove(force=True)
        with contextlib.suppress(Exception):
            api.volumes.get(f"sm120-warm-{pinned.host}").remove(force=True)
        (workspace / "hosts" / f"{pinned.host}.yaml").unlink(missing_ok=True)


def _kernel(api: Any, pin: Pin) -> tuple[bytes, int]:
    """The kernel file in the host's live folder, and its mtime, read by the engine."""
    out = api.containers.run(
        pin.image,
        ["sh", "-c", "f=/w/live/triton/grp0/kernel.cubin; stat -c %Y $f; md5sum $f"],
        entrypoint=[],
        remove=True,
        volumes={f"sm120-warm-{pin.host}": {"bind": "/w", "mode": "ro"}},
        network_mode="none",
    ).decode()
    mtime, digest = out.split()[0], out.split()[1]
    return digest.encode(), int(mtime)


def _serve(cli_process: Callable[..., Any], pin: Pin, port: int, *extra: str) -> str:
    deployed = cli_process("deploy", pin.host, "--apply", *extra, check=False)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    wait_healthy(f"http://127.0.0.1:{port}/health", 60)
    return str(deployed.stdout)


def test_capture_restore_and_prove_zero_compiles(
    hosts: Callable[..., tuple[Pin, int]], cli_process: Callable[..., Any], api: Any
) -> None:
    cold, cold_port = hosts("warm-cold")
    said = _serve(cli_process, cold, cold_port)
    assert "no warm cache in the registry for this image: a cold start" in said
    proved = cli_process("cache", "prove", cold.host, check=False)
    assert proved.returncode == 1, proved.stdout + proved.stderr
    assert "cold: compiled since the start: triton 1" in proved.stdout

    captured = cli_process("cache", "capture", cold.host)
    assert "captured 1 files" in captured.stdout and "triton 1" in captured.stdout

    warm, warm_port = hosts("warm-restored")
    said = _serve(cli_process, warm, warm_port, "--require-warm")
    assert "restored warm cache sha256:" in said, said
    proved = cli_process("cache", "prove", warm.host, check=False)
    assert proved.returncode == 0, proved.stdout + proved.stderr
    assert "warm (restored sha256:" in proved.stdout
    assert "nothing compiled since the start" in proved.stdout
    # The same bytes, with their mtime: the server loaded the kernel, it did not compile it.
    assert _kernel(api, warm) == _kernel(api, cold)
    verified = cli_process("verify", warm.host, check=False)
    assert "start: warm (restored" in verified.stdout

    listed = cli_process("cache", "list", warm.host)
    assert ": match" in listed.stdout

    # The same artifact again, the server running on it: nothing to swap, so nothing refused.
    engine = connect(warm)
    target = target_of(warm)
    assert target is not None
    store = ArtifactStore.of_image(warm.image)
    again = restore(engine, store, target, host_facts(warm, engine, None))
    assert again.detail.startswith("the volume already holds warm cache")
    # A restore that has to swap live/ while this server runs on it: refused.
    with open_volume(engine, target.volume, cache_volume()) as access:
        access.clear_restored()
    with pytest.raises(StackError, match="is in use by"):
        restore(engine, store, target, host_facts(warm, engine, None))


def test_a_key_that_differs_is_refused_with_what_differs(
    hosts: Callable[..., tuple[Pin, int]], cli_process: Callable[..., Any], api: Any
) -> None:
    source, port = hosts("warm-source")
    _serve(cli_process, source, port)
    cli_process("cache", "capture", source.host)

    other, other_port = hosts("warm-other-args", env={"VLLM_EXTRA": "1"})
    refused = cli_process("deploy", other.host, "--apply", "--require-warm", check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "warm required" in refused.stderr
    assert "serve_hash:" in refused.stderr and "serve_covers:" in refused.stderr
    assert not api.containers.list(all=True, filters={"label": f"{LABEL_HOST}={other.host}"})
    listed = cli_process("cache", "list", other.host)
    assert "differs in 2" in listed.stdout

    said = _serve(cli_process, other, other_port)
    assert "no warm cache matches this host's key" in said and "serve_hash:" in said


def test_a_tampered_artifact_restores_nothing(
    hosts: Callable[..., tuple[Pin, int]],
    cli_process: Callable[..., Any],
    tmp_path: Path,
    signed_warm: Path,
) -> None:
    host, _ = hosts("warm-tampered", env={"TAMPERED": "1"})  # a key no other artifact has
    target = target_of(host)
    assert target is not None
    from builder.hosts.remote import connect

    engine = connect(host)
    store = ArtifactStore.of_image(host.image)
    with open_volume(engine, target.volume, cache_volume()) as access:
        key = host_key(target, host_facts(host, engine, None), access)
    tar = tmp_path / "cache.tar"
    _tar_of(tar, {"triton/grp0/kernel.cubin": b"evil"})
    honest = archive.CapturedFile("triton/grp0/kernel.cubin", 4, "0" * 64, 0o644, 0, "triton")
    # Signed by the trusted key (the policy passes it): the per-file check must catch it.
    from builder.evidence.keys import load_signing_key
    from builder.warm import signed

    statement = signed.envelope(key, [honest], tar, "a tamperer", load_signing_key(signed_warm))
    artifact.push(store, key, [honest], tar, "a tamperer", statement)

    refused = cli_process("deploy", host.host, "--apply", "--require-warm", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "every artifact of its key was refused" in refused.stderr
    assert "is not intact" in refused.stderr and "nothing was restored" in refused.stderr
    with open_volume(engine, target.volume, cache_volume()) as access:
        assert access.listing() == {}
        assert access.listing(".") == {}


def test_a_restore_killed_midway_leaves_the_volume_as_it_was(
    hosts: Callable[..., tuple[Pin, int]], cli_process: Callable[..., Any], api: Any
) -> None:
    from builder.hosts.remote import connect

    source, port = hosts("warm-kill-source")
    _serve(cli_process, source, port)
    cli_process("cache", "capture", source.host)

    victim, victim_port = hosts("warm-kill-victim", env={"VICTIM": "1"})
    _serve(cli_process, victim, victim_port)  # cold: its own kernel, its own mtime
    before = _kernel(api, victim)
    # Same key as the source from now on (the env that differed is gone), so a restore runs.
    victim = victim.model_copy(update={"env": dict(source.env)})
    engine = connect(victim)
    engine.container(victim.container).remove(force=True)  # type: ignore[union-attr]
    target = target_of(victim)
    assert target is not None

    child = multiprocessing.get_context("fork").Process(target=_restore_then_die, args=(victim,))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    assert _kernel(api, victim) == before
    with open_volume(engine, target.volume, cache_volume()) as access:
        assert any(name.startswith(".incoming-") for name in access.listing("."))
        assert access.recover() == "removed an unfinished restore"
        assert not any(name.startswith(".incoming-") for name in access.listing("."))

        # A swap killed between its two renames (live moved aside, the new one not in yet):
        # the next operation puts the old live folder back.
        access.sh("mkdir -p /w/.incoming-x && echo .incoming-x > /w/.restore-journal", "setup")
        access.sh("mv /w/live /w/.previous-live", "setup")
        assert access.recover() == "undid a restore killed before its swap"
    assert _kernel(api, victim) == before


def _restore_then_die(pin: Pin) -> None:
    from builder.hosts.remote import connect

    def die(self: VolumeAccess, folder: str, restored: dict[str, Any]) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    VolumeAccess.swap_in = die  # type: ignore[method-assign]
    engine = connect(pin)
    target = target_of(pin)
    assert target is not None
    restore(engine, ArtifactStore.of_image(pin.image), target, host_facts(pin, engine, None))


def _tar_of(path: Path, files: dict[str, bytes]) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
