"""The warm-cache artifact of a server on several GPUs (issue 27): which ranks' caches it holds,
and the refusal to restore it where the container gets fewer GPUs than TP x PP.

The fixture is a cache volume's live/ folder laid out as vLLM 0.33 leaves it after a tensor
parallel 2 x pipeline parallel 2 start: one torch.compile folder per worker
(vllm/torch_compile_cache/<hash>/rank_<rank>_<dp_rank>/backbone/), beside the caches every
worker shares (Triton, Inductor, FlashInfer's autotuner). It is packed as the engine's archive
call gives it and captured by the tool's own repack, as `cache capture` does.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from builder.engine.hostprobe import Gpu, HostFacts
from builder.errors import StackError
from builder.knowledge.cache_volume import cache_volume
from builder.warm import archive, lifecycle, ranks
from builder.warm.artifact import files_document
from builder.warm.key import canonical

HASH = "4f1c0a9e2b"
COMMAND = (
    "vllm",
    "serve",
    "/models/tiny-llama-tp2pp2",
    "--tensor-parallel-size",
    "2",
    "--pipeline-parallel-size",
    "2",
)


def _four_rank_live(root: Path, ranks_held: range = range(4)) -> Path:
    """live/ of a TP2 x PP2 server's cache volume: per-rank folders and shared caches."""
    live = root / "live"
    for rank in ranks_held:
        folder = live / f"vllm/torch_compile_cache/{HASH}/rank_{rank}_0/backbone"
        folder.mkdir(parents=True)
        (folder / "computation_graph.py").write_text(f"# stage {rank // 2} graph\n")
        (folder / "vllm_compile_cache.py").write_text(f"{{'rank': {rank}}}\n")
        (folder / "cache_key_factors.json").write_text(json.dumps({"rank": rank}))
    shared = {
        "triton/GXQ7/triton_poi_fused_0.cubin": b"SASS" * 8,
        "triton/GXQ7/triton_poi_fused_0.lock": b"",
        "inductor/fxgraph/ab/fabcdef": b"graph",
        "vllm/flashinfer_autotune_cache/0.7.2.post1/90a/h/sampling.json": b"{}",
    }
    for path, data in shared.items():
        (live / path).parent.mkdir(parents=True, exist_ok=True)
        (live / path).write_bytes(data)
    return live


def _captured(tmp_path: Path, ranks_held: range = range(4)) -> list[archive.CapturedFile]:
    live = _four_rank_live(tmp_path / "volume", ranks_held)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(live, arcname="live")
    out = tmp_path / "cache.tar"
    files = archive.repack([buffer.getvalue()], "live", out, cache_volume())
    archive.check(out, files)
    return files


def _facts(gpus: int) -> HostFacts:
    return HostFacts(
        "580.159.04", tuple(Gpu(i, "NVIDIA H200", "9.0") for i in range(gpus)), None, (), None
    )


def test_a_capture_of_four_ranks_lists_each_ranks_folder(tmp_path: Path) -> None:
    files = _captured(tmp_path)
    assert [r.folder for r in ranks.held_ranks(f.path for f in files)] == [
        "rank_0_0",
        "rank_1_0",
        "rank_2_0",
        "rank_3_0",
    ]
    per_file = {f.path: ranks.rank_of(f.path) for f in files}
    assert per_file[f"vllm/torch_compile_cache/{HASH}/rank_2_0/backbone/computation_graph.py"] == (
        ranks.Rank(2, 0)
    )
    assert per_file["triton/GXQ7/triton_poi_fused_0.cubin"] is None  # shared by every rank
    assert not any(path.endswith(".lock") for path in per_file)
    assert ranks.missing_ranks(2, 2, ranks.held_ranks(per_file)) == []


def test_files_json_says_what_each_rank_holds(tmp_path: Path) -> None:
    files = _captured(tmp_path)
    document = json.loads(canonical(files_document(files)))
    assert [entry["path"] for entry in document["files"]] == [f.path for f in files]
    assert list(document["ranks"]) == ["rank_0_0", "rank_1_0", "rank_2_0", "rank_3_0"]
    for rank in range(4):
        row = document["ranks"][f"rank_{rank}_0"]
        assert row["files"] == 3
        assert row["bytes"] == sum(f.size for f in files if f"/rank_{rank}_0/" in f.path)
    # One rank's files are four ranks' share of the per-rank files, nothing shared counted.
    assert sum(row["files"] for row in document["ranks"].values()) == 12 < len(files)


def test_a_capture_missing_ranks_names_the_workers_that_compile(tmp_path: Path) -> None:
    """A capture of a volume only the first stage had written (rank 0 and 1)."""
    files = _captured(tmp_path, range(2))
    held = ranks.held_ranks(f.path for f in files)
    assert ranks.missing_ranks(2, 2, held) == ["rank_2_0", "rank_3_0"]
    assert ranks.missing_ranks(2, 1, held) == []
    assert ranks.missing_ranks(2, 2, []) == []  # no torch.compile cache at all: not judged


@pytest.mark.parametrize("gpus", [0, 1, 2, 3])
def test_a_restore_onto_fewer_gpus_than_tp_x_pp_is_refused(gpus: int) -> None:
    with pytest.raises(StackError) as refused:
        ranks.require_gpus("gpu-node-07", 2, 2, gpus)
    message = refused.value.message
    assert "tensor parallel 2 x pipeline parallel 2 = 4 workers" in message
    assert f"the container gets {gpus} GPU(s)" in message and "no warm cache" in message
    assert refused.value.key == "gpus" and "doctor" in (refused.value.hint or "")


@pytest.mark.parametrize(("tensor", "pipeline", "gpus"), [(2, 2, 4), (2, 2, 8), (1, 1, 0)])
def test_enough_gpus_or_one_worker_is_not_refused(tensor: int, pipeline: int, gpus: int) -> None:
    ranks.require_gpus("gpu-node-07", tensor, pipeline, gpus)


class _NoEngine:
    """Fails any use: the refusal must come before the volume or the registry is touched."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the engine was used ({name}) before the GPU count was checked")


@pytest.mark.parametrize(("host_gpus", "pinned"), [(1, None), (4, [0, 1])])
def test_restore_refuses_before_touching_the_volume(
    host_gpus: int, pinned: list[int] | None
) -> None:
    """One H200 for a TP2 x PP2 command, or four whose pin gives the container two."""
    target = lifecycle.WarmTarget(
        host="gpu-node-07",
        image="127.0.0.1:5000/sm120-stacks@sha256:" + "a" * 64,
        volume="sm120-stacks-cache",
        command=COMMAND,
        env={"NCCL_CUMEM_ENABLE": "0"},
        gpu_indices=pinned,
    )
    engine, store = _NoEngine(), _NoEngine()
    with pytest.raises(StackError, match=r"= 4 workers, one GPU each, but the container gets"):
        lifecycle.restore(engine, store, target, _facts(host_gpus))  # type: ignore[arg-type]


def test_a_host_whose_gpus_could_not_be_read_is_not_refused_by_count() -> None:
    """nvidia-smi missing there: the count is unknown, not zero; the restore goes on (its key,
    with no GPU in it, then matches no four-GPU artifact: a cold start)."""
    target = lifecycle.WarmTarget(
        host="gpu-node-07",
        image="127.0.0.1:5000/sm120-stacks@sha256:" + "a" * 64,
        volume="sm120-stacks-cache",
        command=COMMAND,
        env={},
        gpu_indices=None,
    )
    unread = HostFacts(None, (), "nvidia-smi is not on PATH", (), None)
    with pytest.raises(AssertionError, match="the engine was used"):
        lifecycle.restore(_NoEngine(), _NoEngine(), target, unread)  # type: ignore[arg-type]
    pinned_none = HostFacts(None, (), "the pin gives the container no GPU", (), None)
    with pytest.raises(StackError, match="the container gets 0 GPU"):
        lifecycle.restore(  # type: ignore[arg-type]
            _NoEngine(), _NoEngine(), replace(target, gpu_indices=[]), pinned_none
        )
