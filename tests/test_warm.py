"""The warm-cache artifact without an engine: the volume layout's kinds, the key and what it
names when it differs, the tar a capture writes (locks and logs left out, modes and mtimes
kept) and the check that refuses anything but exactly the listed files, and the proof."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from builder.engine.hostprobe import Gpu, HostFacts
from builder.errors import StackError
from builder.knowledge.cache_volume import cache_volume
from builder.warm import archive
from builder.warm.key import WarmKey, gpu_identity, model_of, parallel_shape, serve_identity
from builder.warm.lifecycle import compare
from builder.warm.volume import FileEntry

DIGEST = "sha256:" + "a" * 64


def _tar(members: dict[str, bytes], mtime: int = 1_700_000_000) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, 0o640
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _key(**changes: object) -> WarmKey:
    serve_hash, covers = serve_identity(["vllm", "serve", "/models/m"], {"A": "1"})
    fields: dict[str, object] = {
        "image": DIGEST,
        "gpus": ["NVIDIA RTX PRO 6000 Blackwell Workstation Edition"],
        "sm_count": 188,
        "capability": "12.0",
        "driver": "580.95.05",
        "model": "/models/m",
        "model_revision": "files:sha256:" + "b" * 64,
        "serve_hash": serve_hash,
        "serve_covers": covers,
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "mount": "/var/cache/sm120-stacks",
    }
    return WarmKey.model_validate(fields | changes)


def test_each_cache_folder_names_its_compile_kind() -> None:
    layout = cache_volume()
    assert layout.kind_of("triton/ABC/k.cubin") == "triton"
    assert layout.kind_of("vllm/torch_compile_cache/h/rank_0_0/backbone/x.py") == "torch_compile"
    assert (
        layout.kind_of("vllm/flashinfer_autotune_cache/0.7/120f/h/c.json") == "flashinfer_autotune"
    )
    assert layout.kind_of("vllm/modelinfos/x.json") == "vllm_cache"
    assert layout.kind_of("cuda-driver/2/c/dc948c11e10077") == "cuda_driver"
    cute = "flashinfer/.cache/flashinfer/0.7.2.post1/120f/cached_ops/b12x_moe_sm120a_cute_dsl/k.o"
    assert layout.kind_of(cute) == "cute_dsl"
    assert layout.kind_of("flashinfer/.cache/flashinfer/autotune/x.json") == "flashinfer_autotune"
    assert layout.kind_of("elsewhere/x") == "other"
    assert layout.skipped("triton/ABC/k.lock") and layout.skipped("triton/tmp.pid_12_3/k")
    assert layout.skipped("flashinfer/.cache/flashinfer/0.7.2.post1/90a/flashinfer_jit.log")
    assert layout.environment()["TRITON_CACHE_DIR"] == "/var/cache/sm120-stacks/live/triton"


def test_a_key_names_each_field_that_differs() -> None:
    here = _key()
    assert here.differences(_key()) == [] and here.digest() == _key().digest()
    other = _key(driver="575.57.08", gpus=["NVIDIA GeForce RTX 5090"], sm_count=170)
    assert here.differences(other) == [
        "gpus: NVIDIA RTX PRO 6000 Blackwell Workstation Edition here, NVIDIA GeForce RTX 5090 "
        "in the artifact",
        "sm_count: 188 here, 170 in the artifact",
        "driver: 580.95.05 here, 575.57.08 in the artifact",
    ]
    assert here.digest() != other.digest()


def test_the_host_key_parts_read_from_the_probe_and_the_command() -> None:
    facts = HostFacts(
        "580.95.05",
        (
            Gpu(0, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0"),
            Gpu(1, "NVIDIA H200", "9.0"),
        ),
        None,
        (),
        None,
    )
    assert gpu_identity(facts, [1]) == (["NVIDIA H200"], "9.0", 132)
    assert gpu_identity(facts, [])[0] == []
    names, _, sms = gpu_identity(facts, None)
    assert len(names) == 2 and sms == 188
    command = ["vllm", "serve", "/models/m", "-tp", "2", "--pipeline-parallel-size=2"]
    assert parallel_shape(command) == (2, 2) and model_of(command) == "/models/m"


def test_a_capture_leaves_out_locks_and_logs_and_keeps_modes_and_mtimes(tmp_path: Path) -> None:
    raw = _tar(
        {
            "live/triton/G/k.cubin": b"SASS",
            "live/triton/G/k.lock": b"",
            "live/flashinfer/.cache/flashinfer/0.7/90a/flashinfer_jit.log": b"log",
            "live/vllm/torch_compile_cache/h/graph.py": b"code",
        }
    )
    out = tmp_path / "cache.tar"
    chunks = [raw[i : i + 700] for i in range(0, len(raw), 700)]
    files = archive.repack(chunks, "live", out, cache_volume())
    assert [(f.path, f.kind, f.mode, f.mtime) for f in files] == [
        ("triton/G/k.cubin", "triton", 0o640, 1_700_000_000),
        ("vllm/torch_compile_cache/h/graph.py", "torch_compile", 0o640, 1_700_000_000),
    ]
    archive.check(out, files)
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == [f.path for f in files]


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ({"triton/G/k.cubin": b"EVIL"}, "does not match its listed size and sha256"),
        ({"triton/G/k.cubin": b"SASS", "triton/G/x": b"1"}, "not in the artifact's file list"),
        ({}, "listed files are not in its tar"),
        ({"../escape": b"x"}, "leaves the cache folder"),
    ],
)
def test_the_check_refuses_anything_but_the_listed_files(
    tmp_path: Path, members: dict[str, bytes], why: str
) -> None:
    good = tmp_path / "good.tar"
    good.write_bytes(_tar({"live/triton/G/k.cubin": b"SASS"}))
    files = archive.repack([good.read_bytes()], "live", tmp_path / "a.tar", cache_volume())
    bad = tmp_path / "bad.tar"
    bad.write_bytes(_tar(members))
    with pytest.raises(StackError, match=why) as refused:
        archive.check(bad, files)
    assert "nothing was restored" in refused.value.message


def test_the_proof_counts_new_files_by_kind_and_rewritten_ones() -> None:
    before = {"triton/G/k.cubin": FileEntry(4, 100, 0o644)}
    now = {
        "triton/G/k.cubin": FileEntry(4, 100, 0o644),
        "triton/H/j.cubin": FileEntry(4, 200, 0o644),
        "cuda-driver/2/c/x": FileEntry(9, 200, 0o600),
    }
    proof = compare(cache_volume(), before, now, {"artifact": DIGEST})
    assert proof.compiled == {"triton": 1, "cuda_driver": 1} and not proof.zero
    assert proof.summary().startswith("warm (restored sha256:aaaaaaaaaaaa): compiled since")
    same = compare(cache_volume(), before, dict(before), None)
    assert same.zero and same.summary() == "cold: nothing compiled since the start"
    touched = compare(cache_volume(), before, {"triton/G/k.cubin": FileEntry(5, 300, 0o644)}, None)
    assert touched.rewritten == 1 and not touched.zero
    unknown = compare(cache_volume(), None, now, None)
    assert not unknown.zero and unknown.summary().startswith("unknown: no listing")


def test_require_warm_and_cold_are_refused_together() -> None:
    from builder.hosts.warm_target import WarmPolicy

    with pytest.raises(StackError, match="ask for opposite things") as refused:
        WarmPolicy(require=True, cold=True)
    assert refused.value.key == "--cold"
