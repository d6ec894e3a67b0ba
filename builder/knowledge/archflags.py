"""Derive every arch flag an image needs from the manifest's GPU list and CUDA version.

One source of truth (knowledge/arch.yaml): each consumer gets the spelling it accepts, so
FlashInfer sees 12.0f while torch.utils.cpp_extension, which rejects the f suffix, sees 12.0a.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal

from packaging.version import Version
from pydantic import Field

from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict


class GpuFamily(Strict):
    capability: str
    products: list[str]
    family_suffix: str
    arch_suffix: str
    family_min_cuda: str
    evidence: list[str]


class Spelling(Strict):
    item: str
    suffix: Literal["family", "arch"]
    separator: str


class ArchTable(Strict):
    gpus: dict[str, GpuFamily]
    consumers: dict[str, Spelling]
    jit_arch_tag: Spelling
    cubin_arch: Spelling


class CudaFacts(Strict):
    min_driver: dict[str, str]
    #: Python wheels of the CUDA compiler whose version is its CUDA release (13.0.88 = 13.0).
    compiler_wheels: list[str] = Field(default_factory=list)


@cache
def arch_table() -> ArchTable:
    return parse_document(read_knowledge("arch.yaml"), ArchTable)


def capabilities(gpus: Sequence[str]) -> dict[str, str]:
    """Each GPU target's compute capability, keyed by the target's name, in the order given
    (sm90 -> 9.0, sm120 -> 12.0); targets the arch table does not know are left out."""
    table = arch_table().gpus
    return {gpu: table[gpu].capability for gpu in gpus if gpu in table}


@cache
def cuda_facts() -> CudaFacts:
    return parse_document(read_knowledge("cuda.yaml"), CudaFacts)


@dataclass(frozen=True)
class ArchFlags:
    """The derived flags; `env` goes into both the build stages and the runtime image."""

    env: dict[str, str]
    jit_arch_tag: str
    #: Device-code names `cuobjdump --list-elf` shows for a module built for these targets.
    cubin_archs: tuple[str, ...]
    #: FlashInfer's arch list as items (e.g. ("12.0f",)); rules match on these.
    flashinfer_archs: tuple[str, ...]
    min_driver: str | None


def derive(gpus: list[str], cuda: str) -> ArchFlags:
    table = arch_table()
    cuda_version = Version(cuda)

    def spell(spelling: Spelling) -> list[str]:
        items = []
        for gpu in gpus:
            family = table.gpus[gpu]
            major, minor = family.capability.split(".")
            use_family = spelling.suffix == "family" and cuda_version >= Version(
                family.family_min_cuda
            )
            suffix = family.family_suffix if use_family else family.arch_suffix
            items.append(spelling.item.format(major=major, minor=minor, suffix=suffix))
        return sorted(set(items))

    env = {name: s.separator.join(spell(s)) for name, s in sorted(table.consumers.items())}
    major_minor = f"{cuda_version.major}.{cuda_version.minor}"
    return ArchFlags(
        env=env,
        jit_arch_tag=table.jit_arch_tag.separator.join(spell(table.jit_arch_tag)),
        cubin_archs=tuple(spell(table.cubin_arch)),
        flashinfer_archs=tuple(spell(table.consumers["FLASHINFER_CUDA_ARCH_LIST"])),
        min_driver=cuda_facts().min_driver.get(major_minor),
    )
