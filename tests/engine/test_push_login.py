"""A refused or missing login is one failure with one exit status, 2 (docs/evidence.md), whether
the engine meets it (the image's push) or the tool's own client does (the evidence): both are
a StackError naming `docker login HOST`. A password registry of the test's own
(tests/support/tls_registry.py), which this engine has no login for."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.errors import OperationFailed, StackError
from builder.image.registry import Registry, push
from tests.engine.conftest import LOCAL_BASE, RUN
from tests.support.tls_registry import TlsRegistry, tls_registry

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRegistry]:
    if shutil.which("docker-registry") is None:
        pytest.skip("no docker-registry (scripts/host-setup.sh --registry installs it)")
    with tls_registry(tmp_path_factory.mktemp("login-registry")) as registry:
        yield registry


def test_a_push_without_a_login_is_bad_input_naming_docker_login(
    tls: TlsRegistry, engine: Any, api: Any, tmp_path: Path
) -> None:
    from docker.errors import ImageNotFound

    try:
        image = api.images.get(LOCAL_BASE)
    except ImageNotFound:
        pytest.skip(f"{LOCAL_BASE} is not here (scripts/make-base-local.sh makes it)")
    registry = Registry(tls.host, f"login-{RUN}")
    before = set(image.tags)
    with pytest.raises(StackError) as raised:
        push(engine, registry, LOCAL_BASE, "login-test", "0" * 64, tags=("1",))
    assert not isinstance(raised.value, OperationFailed)  # every command: StackError -> exit 2
    assert f"docker login {tls.host}" in str(raised.value.hint)
    assert set(api.images.get(LOCAL_BASE).tags) == before, "the failed push left no tag"
