"""Damaged runtime cache entries found before a server loads them (builder/warm/integrity.py,
knowledge/cache_integrity.yaml): each damage an interrupted start leaves, in a real folder and
in the artifact's real tar as a capture writes it, and a whole cache that passes."""

from __future__ import annotations

import io
import json
import struct
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.errors import StackError
from builder.knowledge.cache_integrity import cache_integrity
from builder.knowledge.cache_volume import cache_volume
from builder.warm import archive, integrity

MODULE = "flashinfer/.cache/flashinfer/0.7.2.post1/120f/cached_ops/b12x_moe_sm120a_cute_dsl"
KERNEL = f"{MODULE}/static_k4096_n1024_t8_r128_0123456789abcdef.o"
META = {"arch": "sm120a", "cute_dsl_version": "nvidia-cutlass-dsl==4.4.0", "source_sha256": "0"}
TRITON = "triton/QVJDREVGR0hJSktMTU5PUFFSU1RVVldY"
LIVE = "/var/cache/sm120-stacks/live"


def elf_object(body: bytes = b"\x90" * 96) -> bytes:
    """A relocatable ELF64 object as a compiler lays it out: the header, the sections' bytes,
    then the section header table (a null section and one of body) at the end."""
    shoff = 64 + len(body)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 2, 0)
    sections = bytes(64) + struct.pack("<IIQQQQIIQQ", 0, 1, 6, 0, 64, len(body), 0, 0, 16, 0)
    return header + body + sections


def whole_cache(root: Path) -> Path:
    """live/ as a b12x server leaves it after a clean start: a CuTe-DSL module and one Triton
    kernel with its group file (absolute child paths), plus a lock and a writer's temporary."""
    files = {
        KERNEL: elf_object(),
        f"{MODULE}/meta.json": json.dumps(META, indent=2).encode(),
        f"{TRITON}/_fwd_kernel.cubin": b"\x7fELF cubin" * 40,
        f"{TRITON}/_fwd_kernel.json": b'{"name": "_fwd_kernel", "num_warps": 4}',
        f"{TRITON}/_fwd_kernel.ptx": b"//\n.version 8.7\n",
        f"{TRITON}/__grp___fwd_kernel.json": json.dumps(
            {
                "child_paths": {
                    name: f"{LIVE}/{TRITON}/{name}"
                    for name in ("_fwd_kernel.cubin", "_fwd_kernel.json", "_fwd_kernel.ptx")
                }
            }
        ).encode(),
        f"{TRITON}/lock": b"",
        f"{TRITON}/tmp.pid_12_ab/_fwd_kernel.cubin": b"",
        "vllm/modelinfos/empty-is-fine.json": b"",
    }
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return root


def captured_tar(live: Path, out: Path) -> Path:
    """The artifact's tar, written by the capture's own repack from a tar stream of live/."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        tar.add(live, arcname="live")

    def chunks() -> Iterator[bytes]:
        yield stream.getvalue()

    archive.repack(chunks(), "live", out, cache_volume())
    return out


def found(live: Path, tmp_path: Path) -> list[str]:
    """What the folder check and the tar check say, which must agree."""
    in_folder = integrity.inspect_folder(live)
    in_tar = integrity.inspect_tar(captured_tar(live, tmp_path / "cache.tar"))
    assert in_folder == in_tar
    return [d.describe() for d in in_folder]


def test_a_whole_cache_passes(tmp_path: Path) -> None:
    live = whole_cache(tmp_path / "live")
    assert found(live, tmp_path) == []


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: p.write_bytes(b""), "is empty"),
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "is cut short: 100 bytes"),
        (lambda p: p.write_bytes(p.read_bytes()[:40]), "less than its ELF header"),
        (lambda p: p.write_bytes(bytes(len(p.read_bytes()))), "no ELF magic"),
    ],
    ids=["zero-length", "truncated", "truncated-header", "zero-filled"],
)
def test_a_damaged_cute_dsl_object_is_found(tmp_path: Path, damage: object, expected: str) -> None:
    live = whole_cache(tmp_path / "live")
    damage(live / KERNEL)  # type: ignore[operator]
    said = found(live, tmp_path)
    assert len(said) == 1 and said[0].startswith(f"{KERNEL}: ") and expected in said[0], said


def test_a_module_without_its_meta_json_is_found(tmp_path: Path) -> None:
    live = whole_cache(tmp_path / "live")
    (live / MODULE / "meta.json").unlink()
    said = found(live, tmp_path)
    assert len(said) == 1 and said[0].startswith(f"{MODULE}/meta.json: missing beside *.o")


def test_a_truncated_or_incomplete_meta_json_is_found(tmp_path: Path) -> None:
    live = whole_cache(tmp_path / "live")
    meta = live / MODULE / "meta.json"
    meta.write_bytes(meta.read_bytes()[:20])
    assert "is not whole JSON" in found(live, tmp_path)[0]
    meta.write_text(json.dumps({"arch": "sm120a"}))
    assert "lacks cute_dsl_version, source_sha256" in found(live, tmp_path)[0]


def test_a_triton_group_naming_a_missing_or_empty_file_is_found(tmp_path: Path) -> None:
    live = whole_cache(tmp_path / "live")
    group = f"{TRITON}/__grp___fwd_kernel.json"
    (live / TRITON / "_fwd_kernel.ptx").unlink()
    assert found(live, tmp_path) == [
        f"{group}: names {TRITON}/_fwd_kernel.ptx, which is not there (a start killed while it "
        "wrote them)"
    ]
    (live / TRITON / "_fwd_kernel.ptx").write_bytes(b"")
    assert found(live, tmp_path) == [f"{group}: names {TRITON}/_fwd_kernel.ptx, which is empty"]
    # Triton before 3.0 listed names in the group's folder: the same rule holds.
    (live / TRITON / "_fwd_kernel.ptx").unlink()
    (live / group).write_text(json.dumps({"child_paths": ["_fwd_kernel.cubin", "gone.ttir"]}))
    assert found(live, tmp_path) == [
        f"{group}: names {TRITON}/gone.ttir, which is not there (a start killed while it wrote "
        "them)"
    ]
    (live / group).write_text(json.dumps({"child_paths": {"x": "/root/.triton/cache/x/k"}}))
    assert "outside the cache volume's /var/cache/sm120-stacks/live" in found(live, tmp_path)[0]


def test_the_refusals_list_the_damage_and_the_remedy(tmp_path: Path) -> None:
    live = whole_cache(tmp_path / "live")
    (live / KERNEL).write_bytes(b"")
    (live / TRITON / "_fwd_kernel.cubin").write_bytes(b"")
    damage = integrity.inspect_folder(live)
    capture = integrity.refused_capture(damage, "gpu-1", "sm120-stacks-cache-x", "reg/img@sha256:1")
    assert isinstance(capture, StackError)
    assert "holds 3 damaged cache files" in capture.message
    assert "nothing was pushed" in capture.message
    assert f"  {KERNEL}: is empty" in capture.message
    assert capture.hint is not None
    assert (
        "docker run --rm -v sm120-stacks-cache-x:/w --entrypoint rm reg/img@sha256:1 -rf -- "
        f"/w/live/{MODULE} /w/live/{TRITON}"
    ) in capture.hint
    assert "restart the server to regenerate them" in capture.hint
    restore = integrity.refused_restore(damage)
    assert "nothing was restored" in restore.message and "and 2 more" in restore.message


def test_every_rule_names_a_folder_of_the_cache_volume() -> None:
    """A rule for a folder the volume does not have would never judge anything."""
    folders = {folder.path for folder in cache_volume().folders}
    for entry in cache_integrity().entries:
        assert entry.folder.split("/")[0] in folders, entry.name
        assert entry.files, entry.name
