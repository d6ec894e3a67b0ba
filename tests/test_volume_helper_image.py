"""The cache-volume helper's image (builder/warm/helper.py, issue 43): the tool's own, looked
up on the volume's engine and run by its image id; where the engine lacks it, a refusal that
names it and how to make it, never a fallback to the pinned image."""

from __future__ import annotations

import pytest

from builder.engine.protocol import Image
from builder.errors import StackError
from builder.warm.helper import DEFAULT_HELPER, HELPER_ENV, helper_image

HELPER_ID = "sha256:" + "ab" * 32


class _Engine:
    """Only what helper_image asks: the images this engine holds, by reference."""

    def __init__(self, images: dict[str, str]) -> None:
        self.images = images
        self.asked: list[str] = []

    def image(self, ref: str) -> Image | None:
        self.asked.append(ref)
        found = self.images.get(ref)
        return None if found is None else Image(found, {})


def test_the_helper_is_the_tool_s_base_run_by_its_image_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(HELPER_ENV, raising=False)
    engine = _Engine({DEFAULT_HELPER: HELPER_ID})
    assert helper_image(engine) == HELPER_ID  # type: ignore[arg-type]
    assert engine.asked == [DEFAULT_HELPER]


def test_a_helper_named_in_the_environment_is_looked_up_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(HELPER_ENV, "site/helper@sha256:" + "cd" * 32)
    engine = _Engine({"site/helper@sha256:" + "cd" * 32: HELPER_ID})
    assert helper_image(engine) == HELPER_ID  # type: ignore[arg-type]


def test_an_engine_without_the_helper_is_refused_with_how_to_make_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(HELPER_ENV, raising=False)
    with pytest.raises(StackError) as refused:
        helper_image(_Engine({}))  # type: ignore[arg-type]
    said = str(refused.value)
    assert f"the cache volume helper image {DEFAULT_HELPER} is not on this engine" in said
    assert "never the pinned one" in said
    assert "scripts/make-base-local.sh" in said and HELPER_ENV in said
