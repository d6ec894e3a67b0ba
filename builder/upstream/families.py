"""Kernel families by their symbols: the names a finding groups functions under.

Mangled names carry the kernel's namespace and template, so a substring is enough for the
families whose loss matters to a stack (Marlin is the marlin stacks' MoE and dense backend).
"""

from __future__ import annotations

#: (family, substring of the mangled name, lower-cased), first match wins.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("Marlin", "marlin"),
    ("FlashAttention", "flash_fwd"),
    ("CUTLASS", "cutlass"),
)
OTHER = "other"


def family_of(symbol: str) -> str:
    """The family a function belongs to, `other` when no known substring is in its name."""
    lowered = symbol.lower()
    return next((family for family, part in FAMILIES if part in lowered), OTHER)
