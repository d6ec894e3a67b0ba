"""Which parallel ranks' caches a warm-cache artifact holds, read from its file paths.

vLLM keeps one torch.compile cache folder per worker:
VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_<rank>_<dp_rank>/<prefix>/..., where rank is the
worker's global rank over tensor x pipeline parallel (0 .. TP*PP-1) and dp_rank its data-parallel
rank (vllm/compilation/backends.py: parallel_config.rank and its data-parallel index); its AOT
compile cache is laid out the same way under torch_aot_compile/ (vllm/compilation/decorators.py).
Under pipeline parallelism each stage compiles
its own layers, so a rank's folder is of use to that rank alone: an artifact of a TP2 x PP2 server
must hold four of them to start every worker warm, and it can only be restored where the
container gets four GPUs. The ranks are worked out from the paths each time (the paths are what
gets unpacked), never trusted from a summary written beside them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from builder.errors import StackError

#: vLLM's per-rank folder below VLLM_CACHE_ROOT (the volume's `vllm/` folder).
_RANK_FOLDER = re.compile(
    r"^vllm/(?:torch_compile_cache|torch_aot_compile)/[^/]+/rank_(\d+)_(\d+)/"
)


@dataclass(frozen=True, order=True)
class Rank:
    """One worker's cache folder: its global rank and data-parallel rank."""

    rank: int
    dp_rank: int

    @property
    def folder(self) -> str:
        return f"rank_{self.rank}_{self.dp_rank}"


def rank_of(path: str) -> Rank | None:
    """The worker whose cache folder holds path (relative to live/), or None: shared caches
    (Triton, Inductor, FlashInfer, the CUDA driver's) serve every rank."""
    found = _RANK_FOLDER.match(path)
    return Rank(int(found.group(1)), int(found.group(2))) if found else None


def ranks_summary(entries: Iterable[tuple[str, int]]) -> dict[str, dict[str, int]]:
    """{"rank_R_D": {"files": N, "bytes": B}} over (path, size) pairs, in rank order: what an
    artifact's files.json says it holds per rank."""
    summary: dict[Rank, dict[str, int]] = {}
    for path, size in entries:
        rank = rank_of(path)
        if rank is None:
            continue
        row = summary.setdefault(rank, {"files": 0, "bytes": 0})
        row["files"] += 1
        row["bytes"] += size
    return {rank.folder: summary[rank] for rank in sorted(summary)}


def held_ranks(paths: Iterable[str]) -> list[Rank]:
    return sorted({rank for rank in map(rank_of, paths) if rank is not None})


def require_gpus(host: str, tensor: int, pipeline: int, gpus: int) -> None:
    """Refuse a restore onto a container with fewer GPUs than the serve command's TP x PP: its
    workers would not start, and the caches of the ranks it cannot run would be restored for
    nothing. One GPU with TP x PP of 1 (or a CPU stack) is not judged."""
    world = tensor * pipeline
    if world > 1 and gpus < world:
        raise StackError(
            f"{host}: the serve command runs tensor parallel {tensor} x pipeline parallel "
            f"{pipeline} = {world} workers, one GPU each, but the container gets {gpus} GPU(s): "
            "no warm cache is restored onto it",
            key="gpus",
            hint="pin the host with as many GPUs as TP x PP (`sm120-stacks pin HOST STACK "
            "--gpus ...`), or pin a stack of a smaller parallel shape; `sm120-stacks doctor "
            "--host HOST` checks it",
        )


def missing_ranks(tensor: int, pipeline: int, held: list[Rank]) -> list[str]:
    """The rank folders a TP x PP server writes that an artifact lacks (data-parallel rank 0),
    when it holds any: those workers compile at start. [] when it holds none at all (a cache
    without torch.compile, eager mode) or every one."""
    if not held:
        return []
    have = {r.rank for r in held}
    return [f"rank_{r}_0" for r in range(tensor * pipeline) if r not in have]
