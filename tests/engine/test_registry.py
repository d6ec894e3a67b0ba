"""Push, remove, pull-or-build against a real local registry; errors from the stream. The image
is a variant of the tiny stack of each test's own (a test removes its tags): the subject is the
registry, not what the image holds."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.engine.address import from_environment
from builder.engine.docker_adapter import DockerEngine
from builder.errors import StackError, ToolMissing
from builder.image.names import content_tag, local_ref, moving_ref
from builder.image.registry import Registry, has_image, push, repo_digest
from builder.manifest.resolve import resolve
from builder.render.context import render

pytestmark = pytest.mark.engine


@pytest.fixture
def built(
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    api: Any,
) -> Iterator[dict[str, str]]:
    """A tiny-stack variant built, not tested: its name, content hash and local reference; the
    registry's tags of it that a push or pull left here removed afterwards."""
    name = tiny_variant("registry-test", "env:\n  REGISTRY_TEST: '1'")
    cli_process("build", name)
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    yield {"name": name, "hash": content_hash, "ref": local_ref(name, content_hash)}
    for ref in (registry.ref(content_tag(name, content_hash)), registry.ref(name)):
        with contextlib.suppress(Exception):
            api.images.remove(ref, noprune=False)


def test_push_refuses_untested_image_without_force(
    built: dict[str, str], registry: Registry, cli_process: Callable[..., Any]
) -> None:
    result = cli_process("push", built["name"], "--registry", registry.host, check=False)
    assert result.returncode == 2
    assert "refusing to push an untested image" in result.stderr


def test_push_remove_then_pull_or_build_pulls_without_building(
    built: dict[str, str],
    registry: Registry,
    cli_process: Callable[..., Any],
    api: Any,
    engine: DockerEngine,
    tiny_signing_key: Path,
    tmp_path: Path,
) -> None:
    """Pushed signed (with no trust.yaml, a pull trusts the build key on first use and
    refuses unsigned evidence: issue 43), into a hosts folder of the test's own."""
    name = built["name"]
    signing = ("--signing-key", str(tiny_signing_key))
    pushed = cli_process("push", name, "--registry", registry.host, "--force", *signing)
    digest_ref = pushed.stdout.strip()
    assert digest_ref.startswith(f"{registry.repository}@sha256:")
    assert has_image(engine, registry, name, built["hash"])
    # The moving tag reached the registry too, as the same image.
    moving = api.api.inspect_distribution(registry.ref(name))
    assert f"{registry.repository}@{moving['Descriptor']['digest']}" == digest_ref
    image_id = api.images.get(built["ref"]).id
    for ref in [
        built["ref"],
        moving_ref(name),
        registry.ref(content_tag(name, built["hash"])),
        registry.ref(name),
    ]:
        api.images.remove(ref)
    hosts = ("--hosts-dir", str(tmp_path / "hosts"))
    result = cli_process(*hosts, "build", name, "--pull-or-build", "--registry", registry.host)
    assert "pulled" in result.stdout and "building" not in result.stdout
    assert "first use: trusted key" in result.stderr
    pulled = engine.image(built["ref"])
    assert pulled is not None and pulled.id == image_id
    assert repo_digest(pulled, registry) == digest_ref


def test_pull_of_an_unknown_content_hash_fails_clearly(
    registry: Registry, engine: DockerEngine
) -> None:
    assert not has_image(engine, registry, "ci-mini", "0" * 64)


def test_unreachable_registry_is_a_clear_error(built: dict[str, str], engine: DockerEngine) -> None:
    nowhere = Registry.parse("127.0.0.1:5999")
    with pytest.raises(ToolMissing, match="registry 127.0.0.1:5999 is unreachable"):
        push(engine, nowhere, built["ref"], built["name"], built["hash"])


@pytest.mark.parametrize("bad", ["http://x", "host:port", "host/UPPER", "a/../b", "-x"])
def test_registry_syntax_is_checked(bad: str) -> None:
    with pytest.raises(StackError, match="HOST"):
        Registry.parse(bad)


@pytest.mark.engine
def test_the_socket_calls_see_what_the_sdk_sees(api: Any) -> None:
    """A no-op build inspects and tags over the socket: same answers as the SDK's."""
    from builder.engine.docker_adapter import connect_engine

    engine = connect_engine(from_environment())
    image = next(i for i in api.images.list() if i.tags)
    found = engine.image(image.tags[0])
    assert found is not None and found.id == image.id and found.attrs["Id"] == image.attrs["Id"]
    assert engine.image("sm120-stacks:no-such-tag-anywhere") is None
    engine.tag(image.id, "sm120-stacks-socket-test:tagged")
    try:
        assert api.images.get("sm120-stacks-socket-test:tagged").id == image.id
    finally:
        api.images.remove("sm120-stacks-socket-test:tagged")
