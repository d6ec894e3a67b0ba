"""One vocabulary of compile kinds (issue 33 item 5): the smoke's "compiles by kind"
(knowledge/runtime_compiles.yaml) and the cache volume's "files by kind", which the warm proof
reports (knowledge/cache_volume.yaml), use the same names. Once they did not: `flashinfer` in
one and `flashinfer_jit` in the other, `inductor` in one only."""

from __future__ import annotations

from builder.knowledge.cache_volume import Folder, Within, cache_volume
from builder.knowledge.runtime_compiles import (
    compile_kinds,
    compile_vocabulary,
    vocabulary_mismatches,
)


def test_every_cache_folder_names_its_files_by_a_kind_of_the_vocabulary() -> None:
    assert vocabulary_mismatches(cache_volume()) == []


def test_the_two_files_disagreeing_is_found_and_named() -> None:
    volume = cache_volume()
    renamed = volume.model_copy(
        update={
            "folders": [
                *volume.folders,
                Folder(
                    path="old-flashinfer",
                    env="OLD_FLASHINFER",
                    kind="flashinfer_jit",
                    title="the old name",
                    source="test",
                    within=[Within(prefix="x", kind="inductor", title="old", source="test")],
                ),
            ]
        }
    )
    assert vocabulary_mismatches(renamed) == [
        "old-flashinfer: kind 'flashinfer_jit'",
        "old-flashinfer/x: kind 'inductor'",
    ]


def test_the_smokes_kinds_and_the_caches_kinds_are_one_list() -> None:
    vocabulary = compile_vocabulary()
    assert set(compile_kinds()) <= set(vocabulary)
    cache_kinds = {f.kind for f in cache_volume().folders} | {
        w.kind for f in cache_volume().folders for w in f.within
    }
    # The FlashInfer JIT workspace's files are the smoke's `flashinfer` compiles, and
    # Inductor's folder holds torch.compile's output.
    assert {"flashinfer", "torch_compile", "triton", "cute_dsl", "cuda_driver"} <= cache_kinds
    assert not cache_kinds & {"flashinfer_jit", "inductor", "torch_aot_compile"}
