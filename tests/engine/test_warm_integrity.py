"""Damaged cache entries on the real engine and registry: a host's cache volume holding a
Triton group file that names a file that is not there (what a start killed while it compiled
leaves) is named by `doctor --host` with the remedy, and `cache capture` refuses it with nothing
pushed; after the remedy doctor finds it whole. An artifact whose files are intact against
their list but damaged as a cache is refused before anything is written: `--require-warm`
exits 2, a plain deploy starts cold and says why.

The hosts and the server are tests/engine/test_warm.py's.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder.evidence.keys import load_signing_key
from builder.evidence.oci import ArtifactStore
from builder.hosts.remote import connect
from builder.hosts.warm_target import host_facts, target_of
from builder.knowledge.cache_volume import cache_volume
from builder.warm import archive, artifact, signed
from builder.warm.lifecycle import host_key
from builder.warm.volume import open_volume
from tests.engine.test_warm import (  # noqa: F401 (fixtures)
    _serve,
    hosts,
    served_image,
    signed_warm,
)

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("signed_warm")]

GROUP = "triton/grp0/__grp__kernel.json"
LIVE = "/var/cache/sm120-stacks/live"
#: Names the served kernel and one file a killed start never wrote.
GROUP_TEXT = json.dumps(
    {
        "child_paths": {
            "kernel.cubin": f"{LIVE}/triton/grp0/kernel.cubin",
            "kernel.ptx": f"{LIVE}/triton/grp0/kernel.ptx",
        }
    }
)


def test_a_damaged_volume_is_found_by_doctor_and_never_captured(
    hosts: Callable[..., tuple[Any, int]],  # noqa: F811
    cli_process: Callable[..., Any],
) -> None:
    host, port = hosts("warm-damaged")
    _serve(cli_process, host, port)
    engine = connect(host)
    target = target_of(host)
    assert target is not None
    with open_volume(engine, target.volume, cache_volume()) as access:
        access.sh(f"printf '%s' '{GROUP_TEXT}' > /w/live/{GROUP}", "damaging the cache")
        key = host_key(target, host_facts(host, engine, None), access)

    doctor = cli_process("doctor", "--host", host.host, check=False)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    failed = [line for line in doctor.stdout.splitlines() if line.startswith("FAIL  cache:")]
    assert len(failed) == 1 and "holds 1 damaged cache file " in failed[0], doctor.stdout
    assert "triton/grp0/kernel.ptx, which is not there" in failed[0]
    remedy = f"docker run --rm -v {target.volume}:/w --entrypoint rm {host.image} -rf -- "
    assert remedy + "/w/live/triton/grp0" in doctor.stdout

    captured = cli_process("cache", "capture", host.host, check=False)
    assert captured.returncode == 2, captured.stdout + captured.stderr
    assert "holds 1 damaged cache file " in captured.stderr
    assert "nothing was pushed" in captured.stderr and remedy in captured.stderr
    store = ArtifactStore.of_image(host.image)
    assert [f for f in artifact.find(store, target.image_digest) if f.key == key] == []

    # The remedy, as doctor printed it: the entry's folder removed, the volume is whole.
    with open_volume(engine, target.volume, cache_volume()) as access:
        access.sh("rm -rf -- /w/live/triton/grp0", "the remedy")
    doctor = cli_process("doctor", "--host", host.host, check=False)
    assert f"ok    cache: cache volume {target.volume}: no damaged cache entry" in doctor.stdout


def test_an_artifact_of_damaged_files_is_refused_before_anything_is_written(
    hosts: Callable[..., tuple[Any, int]],  # noqa: F811
    cli_process: Callable[..., Any],
    tmp_path: Path,
    signed_warm: Path,  # noqa: F811
) -> None:
    """Signed by the key the policy names for warm caches (safe by default refuses unsigned
    ones first): only the cache check refuses it."""
    host, port = hosts("warm-damaged-artifact", env={"DAMAGED_ARTIFACT": "1"})
    target = target_of(host)
    assert target is not None
    engine = connect(host)
    store = ArtifactStore.of_image(host.image)
    with open_volume(engine, target.volume, cache_volume()) as access:
        key = host_key(target, host_facts(host, engine, None), access)
    members = {"triton/grp0/kernel.cubin": b"k" * 512, GROUP: GROUP_TEXT.encode()}
    tar = tmp_path / "cache.tar"
    with tarfile.open(tar, "w") as out:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    listed = [
        archive.CapturedFile(name, len(data), hashlib.sha256(data).hexdigest(), 0o644, 0, "triton")
        for name, data in members.items()
    ]
    archive.check(tar, listed)  # intact against its list: only the cache check refuses it
    statement = signed.envelope(key, listed, tar, "a host", load_signing_key(signed_warm))
    artifact.push(store, key, listed, tar, "a host killed mid-start", statement)

    refused = cli_process("deploy", host.host, "--apply", "--require-warm", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "holds damaged cache files" in refused.stderr and "kernel.ptx" in refused.stderr
    with open_volume(engine, target.volume, cache_volume()) as access:
        assert access.listing() == {}
        assert access.listing(".") == {}

    said = _serve(cli_process, host, port)
    assert "every warm cache of this key was refused: a cold start" in said, said
    assert "holds damaged cache files" in said
