"""A served verdict for tests of pins: the image served on the GPU kind the (fake) host has."""

from __future__ import annotations

from typing import Any

from builder.image.records import ServedVerdict

#: The GPU kind of every fake serving host of the unit tests.
SERVED_GPU = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def served(kind: str = SERVED_GPU, passed: bool = True) -> ServedVerdict:
    return ServedVerdict(
        gpu_kind=kind,
        gpu_count=1,
        capability="12.0",
        driver="580.95.05",
        cuda="13.0",
        model_id="m",
        serve_args=["vllm", "serve", "m"],
        passed=passed,
        source="test",
        at="2026-12-01T00:00:00Z",
    )


def served_json(kind: str = SERVED_GPU) -> list[dict[str, Any]]:
    return [served(kind).model_dump(mode="json")]
