"""Job sizing for `max_jobs: auto`: memory divided by one job's peak, within the CPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.image.jobs import available_memory_gb, jobs_for, peak_per_job_gb
from builder.manifest.resolve import resolve
from tests.conftest import STACKS


@pytest.mark.parametrize(
    ("peak", "memory", "cpus", "jobs"),
    [
        (11.0, 24.0, 2, 2),  # fused_moe_120 here: (24 - 2) // 11 = 2
        (11.0, 26.0, 16, 2),  # two fit, three do not
        (11.0, 128.0, 16, 11),
        (1.0, 24.0, 2, 2),  # small modules: the CPUs decide
        (11.0, 4.0, 8, 1),  # never zero
    ],
)
def test_jobs_for(peak: float, memory: float, cpus: int, jobs: int) -> None:
    assert jobs_for(peak, memory, cpus) == jobs


def test_peak_comes_from_the_heaviest_module() -> None:
    assert peak_per_job_gb(resolve("vllm-0.17-flashinfer-cutlass", STACKS)) == 11.0
    assert peak_per_job_gb(resolve("vllm-0.22-marlin", STACKS)) == 6.0


def test_available_memory_reads_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 25165824 kB\nMemAvailable: 12582912 kB\n")
    assert available_memory_gb(meminfo) == 12.0
