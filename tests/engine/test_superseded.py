"""The images of a host's earlier pins are removed once a deploy passed, and nothing else is
(builder/hosts/superseded.py; found by the soak: bench/results/tool-soak/leaks.txt).

Real images on the real engine and registry: three rounds of one stack pushed and pulled back
by digest, as `deploy` pulls them; the pin names round 3, the previous pin round 2. Round 1 is
removed; rounds 2 and 3 stay, and so do an image of the same stack that carries a tag, one of
another stack, and one a container uses (until the container is gone).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from builder.engine.docker_adapter import DockerEngine
from builder.hosts.superseded import remove_superseded
from builder.image.registry import Registry
from tests.engine.conftest import RUN, unique

pytestmark = pytest.mark.engine

LOCAL_BASE = "local/debian-python:bookworm"


@pytest.fixture
def pulled(api: Any, registry: Registry) -> Iterator[Callable[..., str]]:
    """make(stack, round, tagged=False): an image of stack (a label of its round on the base)
    pushed to this run's repository and pulled back by digest, as deploy pulls a pin's image;
    its repo@sha256 reference. Every image made is removed at the end."""
    from docker.errors import ImageNotFound

    try:
        api.images.get(LOCAL_BASE)
    except ImageNotFound:
        pytest.skip(f"{LOCAL_BASE} is not here (make base-local)")
    repository = f"{registry.host}/sm120-superseded-{RUN}/sm120-stacks"
    made: list[str] = []

    def make(stack: str, round_: int, tagged: bool = False) -> str:
        tag = f"{repository}:{stack}-{round_}"
        dockerfile = f"FROM {LOCAL_BASE}\nLABEL sm120-stacks.stack={stack} round={round_}\n"
        image, _ = api.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
        made.append(image.id)
        for line in api.api.push(repository, tag=f"{stack}-{round_}", stream=True, decode=True):
            assert "error" not in line, line
        image.reload()
        ref = next(d for d in image.attrs["RepoDigests"] if d.startswith(repository + "@"))
        if not tagged:
            api.images.remove(tag)  # its only name: the image goes
            api.images.pull(ref)  # back by digest alone
        return str(ref)

    yield make
    for image_id in made:
        with contextlib.suppress(Exception):
            api.images.remove(image_id, force=True)


def present(api: Any, ref: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        api.images.get(ref)
    except ImageNotFound:
        return False
    return True


def test_only_the_images_of_earlier_pins_go(
    api: Any, engine: DockerEngine, pulled: Callable[..., str]
) -> None:
    stack, other = unique("superseded"), unique("superseded-other")
    round_1, round_2, round_3 = (pulled(stack, n) for n in (1, 2, 3))
    in_use = pulled(stack, 4)
    tagged = pulled(stack, 5, tagged=True)
    elsewhere = pulled(other, 1)
    gone = api.images.get(round_1).id.removeprefix("sha256:")[:12]
    used = api.images.get(in_use).id.removeprefix("sha256:")[:12]
    user = api.containers.create(in_use, ["true"], name=unique("superseded-user"))
    try:
        said = remove_superseded(engine, stack, [round_3, round_2])
    finally:
        user.remove(force=True)
    assert not present(api, round_1)
    for kept in (round_2, round_3, in_use, tagged, elsewhere):
        assert present(api, kept), f"{kept} was removed"
    assert said == f"removed 1 image(s) of earlier pins: {gone}"
    # Its container gone, the image it used is one of an earlier pin like any other.
    assert remove_superseded(engine, stack, [round_3, round_2]) == (
        f"removed 1 image(s) of earlier pins: {used}"
    )
    assert not present(api, in_use)
    assert remove_superseded(engine, stack, [round_3, round_2]) is None
