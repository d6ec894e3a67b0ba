"""GPU products and their SM counts (knowledge/gpu_products.yaml): a warm cache's key names the
SM count of the GPU it was compiled on, which the driver's product name alone does not say."""

from __future__ import annotations

from functools import cache

from pydantic import Field

from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict
from builder.knowledge.text import Prose, SafeText


class GpuProduct(Strict):
    match: SafeText
    sm_count: int = Field(ge=1)
    source: Prose


class GpuProducts(Strict):
    products: list[GpuProduct]


def sm_count(product: str) -> int | None:
    matches = [p for p in _products() if p.match.lower() in product.lower()]
    return max(matches, key=lambda p: len(p.match)).sm_count if matches else None


@cache
def _products() -> tuple[GpuProduct, ...]:
    doc = read_knowledge("gpu_products.yaml")
    return tuple(parse_document(doc, GpuProducts).products)
