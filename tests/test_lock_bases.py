"""`lock` asks the registry (through the engine) for each base image's digest.

Only a registry that cannot be reached at all may leave a base unpinned, and then loudly and on
record in the lock; a refusal (authentication) or an unknown image or tag is an error naming the
image, and no lock is written. The engine's answers below are the ones dockerd 28 gives.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from builder.cli import lock as cli_lock
from builder.cli.app import Settings
from builder.errors import StackError
from builder.lock.bases import resolve_base
from builder.lock.lockfile import LockedBase
from tests.test_hosts import STACK, _lock_for

IMAGE = "nvidia/cuda:13.0.2-devel-ubuntu24.04"
DIGEST = "sha256:" + "12" * 32
UNREACHABLE = [
    'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on '
    "10.255.255.53:53: no such host",
    'Get "http://127.0.0.1:5999/v2/": dial tcp 127.0.0.1:5999: connect: connection refused',
    'Get "https://r.example.com/v2/": net/http: TLS handshake timeout',
    'Get "https://r.example.com/v2/": dial tcp 10.1.2.3:443: i/o timeout',
]
REFUSED = [
    (404, "manifest unknown: manifest unknown", "no such image or tag"),
    (
        401,
        "errors:\ndenied: requested access to the resource is denied\n"
        "unauthorized: authentication required",
        "refused",
    ),
    (
        500,
        'Head "https://nvcr.io/v2/x/manifests/1": unauthorized: authentication required',
        "refused",
    ),
    (403, "denied: requested access to the resource is denied", "refused"),
    (
        500,
        'Get "https://127.0.0.1:5000/v2/": http: server gave HTTP response to HTTPS client',
        "refused",
    ),
    (400, "invalid reference format", "refused"),
]


class _Engine:
    """The one operation `lock` asks of the engine, answering as builder.image's Engine does."""

    def __init__(self, answer: str | Exception) -> None:
        self.answer = answer
        self.asked: list[str] = []

    def registry_digest(self, ref: str) -> str:
        self.asked.append(ref)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _error(status: int, explanation: str) -> Exception:
    """The error the docker adapter raises for dockerd's answer: classified by type once."""
    from builder.engine.protocol import registry_failure
    from builder.errors import EngineError, EngineNotFound

    kind = EngineNotFound if status == 404 else EngineError
    return registry_failure(kind(explanation, status_code=status))


def test_the_adapter_classifies_by_type() -> None:
    from builder.errors import EngineNotFound, RegistryUnreachable

    assert all(isinstance(_error(500, e), RegistryUnreachable) for e in UNREACHABLE)
    assert isinstance(_error(500, "manifest unknown: manifest unknown"), EngineNotFound)
    assert not isinstance(_error(401, "dial tcp: unauthorized"), RegistryUnreachable)


def test_a_programming_error_is_not_read_as_a_registry_refusal() -> None:
    """It used to be caught by `except Exception` and printed as "the registry refused"."""
    with pytest.raises(AttributeError):
        resolve_base(IMAGE, None, _Engine(AttributeError("'NoneType' has no attribute 'x'")))


def test_a_found_digest_is_locked() -> None:
    engine = _Engine(DIGEST)
    base = resolve_base(IMAGE, None, engine)
    assert base == LockedBase(image=IMAGE, digest=DIGEST, note="digest resolved from the registry")


@pytest.mark.parametrize("explanation", UNREACHABLE)
def test_an_unreachable_registry_is_tolerated_on_record(explanation: str) -> None:
    base = resolve_base(IMAGE, None, _Engine(_error(500, explanation)))
    assert base.digest is None
    assert base.note.startswith("NOT PINNED: registry not reachable")
    assert base.unpinned


@pytest.mark.parametrize(("status", "explanation", "said"), REFUSED)
def test_a_refusal_or_an_unknown_image_is_an_error_naming_it(
    status: int, explanation: str, said: str
) -> None:
    """They used to be "registry not reachable": a lock without the digest, exit 0."""
    with pytest.raises(StackError) as caught:
        resolve_base(IMAGE, None, _Engine(_error(status, explanation)))
    assert IMAGE in caught.value.message and said in caught.value.message
    assert caught.value.hint


def test_lock_writes_nothing_when_the_registry_refuses(
    stacks_dir: Path, run_cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = stacks_dir / f"{STACK}.lock"
    before = lock.read_bytes()
    engine = _Engine(_error(401, "unauthorized: authentication required"))
    monkeypatch.setattr(Settings, "connect_or_why", lambda self: (engine, None))
    result = run_cli("lock", STACK, stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert IMAGE in result.output and "Traceback" not in result.output
    assert lock.read_bytes() == before
    assert engine.asked == [IMAGE], "asked before the (slow) package resolution"


def test_lock_says_loudly_when_a_base_stays_unpinned(
    stacks_dir: Path, run_cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    from builder.manifest.resolve import resolve

    made = _lock_for(resolve(STACK, stacks_dir))
    unpinned = LockedBase(image=IMAGE, note="NOT PINNED: registry not reachable (dial tcp)")
    made = made.model_copy(update={"bases": made.bases.model_copy(update={"runtime": unpinned})})
    monkeypatch.setattr(cli_lock, "make_lock", lambda *args: made)
    monkeypatch.setattr(Settings, "connect_or_why", lambda self: (None, None))
    result = run_cli("lock", STACK, stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    assert f"warning: runtime base {IMAGE} is NOT pinned by digest" in result.output
    assert "lock again where the registry answers" in result.output
