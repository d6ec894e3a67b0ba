"""A lock is parsed from YAML once per content: later reads take its validated JSON form from
the parse cache (named by the bytes' sha256, so an edited lock is parsed again), and a cache
file that does not load is ignored, never an error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder.lock import lockfile, reading
from tests.conftest import STACKS

LOCK = STACKS / "vllm-0.33-marlin.lock"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("SM120_STACKS_CACHE_DIR", str(folder))
    reading._parsed_lock.cache_clear()
    return folder


def _count_yaml_parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    parsed: list[Path] = []
    real = reading.load_yaml

    def counting(path: Path):  # type: ignore[no-untyped-def]
        parsed.append(path)
        return real(path)

    monkeypatch.setattr(reading, "load_yaml", counting)
    return parsed


def test_second_read_comes_from_the_cache(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "x.lock"
    shutil.copy(LOCK, lock)
    parsed = _count_yaml_parses(monkeypatch)
    first = reading.read_lock(lock)
    assert len(parsed) == 1 and len(list((cache / "parsed-locks").iterdir())) == 1
    reading._parsed_lock.cache_clear()
    assert reading.read_lock(lock) == first and len(parsed) == 1


def test_an_edited_lock_is_parsed_again(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "x.lock"
    shutil.copy(LOCK, lock)
    first = reading.read_lock(lock)
    text = lock.read_text()
    lock.write_text(text.replace(first.inputs_hash, "sha256:" + "0" * 64, 1))
    parsed = _count_yaml_parses(monkeypatch)
    assert reading.read_lock(lock).inputs_hash == "sha256:" + "0" * 64
    assert len(parsed) == 1


def test_a_broken_cache_file_is_ignored(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "x.lock"
    shutil.copy(LOCK, lock)
    first = reading.read_lock(lock)
    (cached,) = (cache / "parsed-locks").iterdir()
    cached.write_text('{"stack": 1}')
    reading._parsed_lock.cache_clear()
    parsed = _count_yaml_parses(monkeypatch)
    assert reading.read_lock(lock) == first and len(parsed) == 1


def test_an_unwritable_cache_costs_time_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SM120_STACKS_CACHE_DIR", str(blocker))  # a file: no folder under it
    reading._parsed_lock.cache_clear()
    assert reading.read_lock(LOCK).stack == "vllm-0.33-marlin"


def test_the_cache_keeps_the_python_digest_of_those_bytes(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JIT cache id takes the locked set by its digest; a warm read takes it from the
    cache, and it is the one the lock's own Python set gives; a changed copy gets its own."""
    lock = tmp_path / "x.lock"
    shutil.copy(LOCK, lock)
    first = reading.read_lock(lock)
    reading._parsed_lock.cache_clear()
    from_cache = reading.read_lock(lock)
    remembered = lockfile._python_digests[id(from_cache)][1]  # from the cache, not worked out
    fresh = lockfile.Lock.model_validate(first.model_dump())
    assert remembered == lockfile.python_digest(fresh) == lockfile.python_digest(first)
    changed = fresh.python.model_copy(update={"version": "3.13"})
    edited = from_cache.model_copy(update={"python": changed})
    assert lockfile.python_digest(edited) != remembered
