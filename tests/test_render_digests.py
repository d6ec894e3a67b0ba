"""Large context files: hashed by digest (remembered by size and mtime), copied, never held."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from builder.errors import StackError
from builder.manifest.resolve import resolve
from builder.render.context import render, write_context
from builder.render.digests import DigestCache
from tests.golden import STACKS

WHEEL = "tiny-1.0-py3-none-any.whl"


def _stack_with_wheel(tmp_path: Path, content: bytes) -> tuple[Path, Path]:
    stacks = tmp_path / "stacks"
    shutil.copytree(STACKS, stacks)
    wheel = tmp_path / WHEEL
    wheel.write_bytes(content)
    (stacks / "wheel-test.yaml").write_text(f"extends: ci-mini\npython:\n  wheels: [{wheel}]\n")
    return stacks, wheel


def test_a_copied_file_is_named_by_its_bytes_and_written_whole(tmp_path: Path) -> None:
    stacks, wheel = _stack_with_wheel(tmp_path, b"one")
    first = render(resolve("wheel-test", stacks))
    assert f"wheels/{WHEEL}" in first.copied
    assert f"wheels/{WHEEL}" not in first.files
    target = write_context(first, tmp_path / "ctx")
    assert (target / "wheels" / WHEEL).read_bytes() == b"one"
    assert (target / "wheels" / WHEEL).stat().st_mode & 0o777 == 0o644

    wheel.write_bytes(b"two")
    os.utime(wheel, ns=(1, 1))
    assert render(resolve("wheel-test", stacks)).content_hash() != first.content_hash()


def test_a_file_changed_after_hashing_is_refused_not_copied(tmp_path: Path) -> None:
    stacks, wheel = _stack_with_wheel(tmp_path, b"one")
    rendered = render(resolve("wheel-test", stacks))
    wheel.write_bytes(b"something else")
    with pytest.raises(StackError, match="changed while the context was written"):
        write_context(rendered, tmp_path / "ctx")
    assert not (tmp_path / "ctx").exists()


def test_digest_cache_reuses_a_digest_while_size_and_mtime_hold(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 3_000_000)
    store = tmp_path / "cache" / "digests.json"
    cache = DigestCache(store)
    expected = hashlib.sha256(big.read_bytes()).hexdigest()
    assert cache.sha256(big) == expected
    cache.save()

    # A second command: the digest comes from the file, not from reading 3 MB again.
    entries = json.loads(store.read_text())
    key = str(big.resolve())
    entries[key][1] = "0" * 64
    store.write_text(json.dumps(entries))
    assert DigestCache(store).sha256(big) == "0" * 64

    # Any change of size or mtime re-reads the bytes.
    big.write_bytes(b"y" * 3_000_000)
    assert DigestCache(store).sha256(big) == hashlib.sha256(big.read_bytes()).hexdigest()


def test_a_damaged_digest_cache_costs_a_rehash_not_an_error(tmp_path: Path) -> None:
    store = tmp_path / "digests.json"
    store.write_text("{not json")
    small = tmp_path / "f"
    small.write_bytes(b"abc")
    assert DigestCache(store).sha256(small) == hashlib.sha256(b"abc").hexdigest()
