"""The one pydantic base of every file this tool reads: manifests, knowledge, locks, records, pins.

Unknown keys are errors (a typo must not silently drop a setting) and parsed values are frozen.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown keys are errors: a typo must not silently drop a setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)
