"""A real push to the local registry and a pull back, as the command line shows them: lines
naming each moving layer's bytes and percent, and a last line with every layer done."""

from __future__ import annotations

import io
import os
import re
import tarfile
from typing import Any

import pytest

from builder.engine.docker_adapter import DockerEngine
from builder.engine.progress import LayerProgress
from builder.image.registry import Registry
from tests.engine.conftest import unique

pytestmark = pytest.mark.engine

#: Big enough that the engine reports bytes moving more than once; random, so no registry
#: already holds the layer.
LAYER_BYTES = 48 << 20
PERCENT = re.compile(r"[0-9a-f]{12} (pushing|downloading|extracting) .+ of .+ \((\d+)%\)")


def one_layer_image(api: Any, repository: str, tag: str) -> str:
    """An image of one fresh layer, imported from a tarball (no base, no build)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("payload.bin")
        info.size = LAYER_BYTES
        tar.addfile(info, io.BytesIO(os.urandom(LAYER_BYTES)))
    api.api.import_image_from_data(data.getvalue(), repository=repository, tag=tag)
    return f"{repository}:{tag}"


def test_a_push_and_a_pull_show_each_layers_bytes_and_percent(
    engine: DockerEngine, api: Any, registry: Registry
) -> None:
    repository, tag = f"{registry.host}/{unique('sm120-progress-test')}", "one-layer"
    ref = one_layer_image(api, repository, tag)
    try:
        lines: list[str] = []
        pushing = LayerProgress("push", ref, lines.append, every_s=0)
        assert engine.push(repository, tag, pushing).startswith("sha256:")
        pushing.finish()
        moving = [PERCENT.search(line) for line in lines]
        percents = [int(m.group(2)) for m in moving if m and m.group(1) == "pushing"]
        assert len(percents) >= 2, lines
        assert percents == sorted(percents) and percents[-1] > percents[0], lines
        assert re.fullmatch(
            rf"push {re.escape(ref)}: 1 layers done \(\d+ MB moved\) in \d+ s", lines[-1]
        )

        api.images.remove(ref)
        lines.clear()
        pulling = LayerProgress("pull", ref, lines.append, every_s=0)
        engine.pull(repository, tag, pulling)
        pulling.finish()
        phases = {m.group(1) for m in map(PERCENT.search, lines) if m}
        assert "downloading" in phases, lines
        assert lines[-1].startswith(f"pull {ref}: 1 layers done")
    finally:
        api.images.remove(ref, force=True)
