"""Every real stack builds FROM bases pinned by digest; a base that follows its tag is refused
by `check` and `build` unless --allow-floating-base; `lock --refresh-bases` asks the registry
again without resolving the packages."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from builder.cli.app import Settings
from builder.errors import RegistryUnreachable
from builder.lock.inputs import floating_bases
from builder.lock.locked import lock_stack
from builder.lock.lockfile import LockedBases
from builder.lock.reading import read_lock
from builder.lock.writing import write_lock
from builder.manifest.resolve import resolve, stack_names
from tests.conftest import STACKS

#: The test stacks (ci-mini*, ci-tiny) build FROM bases made here (local/...): no digest to pin.
REAL = [n for n in stack_names(STACKS) if not n.startswith("ci-")]
STACK = "vllm-0.33-marlin"
OTHER = "sha256:" + "12" * 32


@pytest.mark.parametrize("name", REAL)
def test_every_committed_real_stack_pins_its_bases(name: str) -> None:
    """By its own lock, or (a child that changes only serve settings) its parent's."""
    stack = resolve(name, STACKS)
    own = STACKS / f"{name}.lock"
    lock = read_lock(own) if own.is_file() else lock_stack(stack).lock
    assert lock is not None, f"{name}: no lock of its own, and no parent's matches it"
    assert floating_bases(stack, lock) == []
    for base in (lock.bases.build, lock.bases.runtime):
        assert base.digest is not None and "not verified" in base.note  # its source, named


def _unpin(stacks_dir: Path) -> None:
    """The lock as `lock` writes it where no registry answers: its bases without digests."""
    path = stacks_dir / f"{STACK}.lock"
    lock = read_lock(path)
    bases = {
        role: getattr(lock.bases, role).model_copy(update={"digest": None, "note": "NOT PINNED"})
        for role in ("build", "runtime")
    }
    write_lock(path, lock.model_copy(update={"bases": LockedBases(**bases)}))


def test_a_floating_base_is_refused_by_check_and_build_unless_allowed(
    stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    _unpin(stacks_dir)
    checked = run_cli("check", STACK, stacks_dir=stacks_dir)
    assert checked.exit_code == 2, checked.output
    assert f"{STACK}.lock" in checked.output and "bases.build.digest" in checked.output
    assert "--refresh-bases" in checked.output and "Traceback" not in checked.output
    built = run_cli("build", STACK, stacks_dir=stacks_dir)
    assert built.exit_code == 2 and "not pinned by digest" in built.output
    allowed = run_cli("check", STACK, "--allow-floating-base", stacks_dir=stacks_dir)
    assert allowed.exit_code == 0 and "floating base: build, runtime" in allowed.output


def test_local_and_substituted_bases_do_not_float() -> None:
    assert floating_bases(resolve("ci-mini", STACKS), None) == []


class _Registry:
    def __init__(self, answer: str | Exception) -> None:
        self.answer = answer

    def registry_digest(self, ref: str) -> str:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "said", "kept"),
    [
        (OTHER, "-> " + OTHER, False),
        (RegistryUnreachable("dial tcp: no such host", status_code=500), "not verified", True),
    ],
)
def test_refresh_bases_updates_only_where_the_registry_answers(
    answer: str | Exception,
    said: str,
    kept: bool,
    stacks_dir: Path,
    run_cli: Callable[..., Result],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = read_lock(stacks_dir / f"{STACK}.lock")
    monkeypatch.setattr(Settings, "connect_or_why", lambda self: (_Registry(answer), None))
    result = run_cli("lock", STACK, "--refresh-bases", stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    assert said in result.output
    after = read_lock(stacks_dir / f"{STACK}.lock")
    assert (after.bases.build.digest == before.bases.build.digest) is kept
    assert after.python == before.python and after.inputs_hash == before.inputs_hash
