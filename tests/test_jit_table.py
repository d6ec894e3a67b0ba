"""The JIT table shows every kernel family a stack's serve path compiles: the modules the image
precompiled, the manifest's `jit_cache.not_precompiled` families (status not-precompiled), and,
after a GPU smoke, each kernel of FlashInfer's CuTe-DSL disk cache as a hit or a miss.

No engine, no GPU: the caches here are laid out in tmp_path as flashinfer-python 0.7.2.post1
writes them (jit/env.py, jit/cute_dsl_core.py `_export`, fused_moe/cute_dsl/blackwell_sm12x/
moe_dispatch.py `_disk_kernel_name`), and the smoke --url test serves a fake chat server while
a thread plays the server compiling into the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from builder.engine.protocol import Container, ContainerSpec
from builder.errors import StackError
from builder.knowledge.loader import KNOWLEDGE_DIR
from builder.knowledge.yamlsafe import load_yaml
from builder.manifest.resolve import ResolvedStack, resolve
from builder.manifest.runtime_caches import (
    KNOWLEDGE_FILE,
    cache_layouts,
    group_patterns,
    layouts_of,
)
from builder.verify import report as reports
from builder.verify.compiles import find_compiles
from builder.verify.kernel_cache import classify
from builder.verify.kernel_listing import (
    Listing,
    list_directory,
    listing_command,
    parse_kernel_name,
    parse_module_dir,
)
from builder.verify.kernel_watch import (
    CacheWatches,
    DirectoryWatch,
    container_watch,
    directory_watch,
)
from builder.verify.smoke import run_smoke, run_smoke_url
from builder.verify.smoke_report import SmokeReport, format_table
from builder.verify.validate import (
    add_smoke,
    cache_table,
    kernel_rows,
    not_precompiled_rows,
    short_why,
)
from tests.conftest import STACKS
from tests.support.fake_chat import Behaviour, fake_chat_server, url_of

LAYOUT_ID = "flashinfer_cute_dsl"
FI_VERSION = "0.7.2.post1"
#: FLASHINFER_CUDA_ARCH_LIST=12.0f -> the workspace's arch folder; a 12.0 device -> sm_120a.
CUDA_ARCHS = "120f"
MODULE_DIR = "b12x_moe_sm120a_cute_dsl"
META = {
    "arch": "sm120a",
    "cute_dsl_version": "nvidia-cutlass-dsl==4.8.0;nvidia-cutlass-dsl-libs-cu13==4.8.0",
    "source_sha256": hashlib.sha256(b"the ten kernel sources").hexdigest(),
}
LOG_PREFIX = "2026-11-30 20:41:07,001 - INFO - cute_dsl_core.py:177 - flashinfer.jit: "


def layout() -> Any:
    return cache_layouts()[LAYOUT_ID]


def disk_name(prefix: str, *key: object) -> str:
    """moe_dispatch._disk_kernel_name: the shape prefix and 16 hex of sha256(repr(key))."""
    return f"{prefix}_{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}"


STATIC = disk_name("static_k4096_n1024_t8_r128", "static", "nvfp4", 129, 128, 4096, 1024, 8)
MICRO = disk_name("micro_m1_k4096_n1024_t8_r128", "micro", "nvfp4", 129, 128, 1, 4096, 1024)
DYNAMIC = disk_name("dynamic_e128_k4096_n1024_t8", "dynamic", "nvfp4", 128, 4096, 1024, 8)


def ops_dir(workspace: Path) -> Path:
    """FLASHINFER_JIT_DIR: {workspace}/.cache/flashinfer/{version}/{archs}/cached_ops."""
    return workspace / ".cache" / "flashinfer" / FI_VERSION / CUDA_ARCHS / "cached_ops"


def export(workspace: Path, kernel: str, body: bytes = b"\x7fELF kernel", meta: Any = None) -> Path:
    """JitSpecCuteDsl._export: the .o through a temporary name, then meta.json (the module's
    commit marker) only where it differs from what this process expects."""
    module = ops_dir(workspace) / MODULE_DIR
    module.mkdir(parents=True, exist_ok=True)
    target = module / f"{kernel}.o"
    tmp = target.with_suffix(f".o.tmp.{os.getpid()}")
    tmp.write_bytes(body)
    os.replace(tmp, target)
    meta_path = module / "meta.json"
    wanted = META if meta is None else meta
    current = json.loads(meta_path.read_text()) if meta_path.is_file() else None
    if current != wanted:
        meta_path.write_text(json.dumps(wanted, indent=2))
    return target


def age(path: Path, seconds: int = 3600) -> None:
    """Back-date a file, as one persisted by an earlier start is."""
    stamp = time.time() - seconds
    os.utime(path, (stamp, stamp))


def precompiled_module(workspace: Path) -> None:
    """An image's precompiled (ninja) module beside the CuTe-DSL ones: never a kernel row."""
    module = ops_dir(workspace) / "sampling"
    module.mkdir(parents=True, exist_ok=True)
    (module / "sampling.so").write_bytes(b"so")
    (module / "build.ninja").write_text("rule cuda_compile\n")
    (module / "csrc_sampling.cuda.o").write_bytes(b"o")


def b12x() -> ResolvedStack:
    return resolve("vllm-0.33-b12x", STACKS)


def log_compiles(*kernels: str) -> dict[str, Any]:
    """The smoke's runtime_compiles of a log with FlashInfer's compile line for each kernel."""
    text = "\n".join(f"{LOG_PREFIX}Compiling CuTe-DSL kernel {MODULE_DIR}/{k}" for k in kernels)
    return find_compiles(text).to_json()


# --- static rows ---------------------------------------------------------------------------------


def test_each_not_precompiled_entry_of_vllm_033_b12x_is_a_row() -> None:
    stack = b12x()
    rows = not_precompiled_rows(stack)
    entries = stack.manifest.jit_cache.not_precompiled
    assert [(r.module, r.status, r.kind) for r in rows] == [
        (
            "b12x CuTe-DSL fused MoE kernels (NVFP4 static, micro and dynamic)",
            "not-precompiled",
            "not-precompiled",
        ),
        (
            "b12x W4A16 MoE kernels (NVFP4 checkpoints without activation scales)",
            "not-precompiled",
            "not-precompiled",
        ),
        (
            "b12x direct micro MoE kernel (the smallest NVFP4 decode batches)",
            "not-precompiled",
            "not-precompiled",
        ),
    ]
    assert [r.detail for r in rows] == [short_why(e.why) for e in entries]
    assert rows[0].detail.startswith("FlashInfer 0.7.2.post1 caches them on disk (FI#3874")
    assert rows[1].detail.startswith("Still memory-only in 0.7.2.post1")
    assert all(len(r.detail) <= 160 for r in rows)


class _Logs:
    """A container that already ran the image's `flashinfer_jit.py verify`."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout

    def wait(self, timeout: float) -> int:
        return 0

    def logs(self, *, stdout: bool = True, stderr: bool = True) -> bytes:
        return self.stdout.encode() if stdout else b""

    def remove(self, *, force: bool = False) -> None:
        pass


class _VerifyEngine:
    def __init__(self, modules: tuple[str, ...]) -> None:
        self.lines = "\n".join(
            json.dumps({"module": m, "status": "hit", "archs": ["sm_120f"], "bytes": 2_000_000})
            for m in modules
        )

    def run(self, spec: ContainerSpec) -> _Logs:
        return _Logs(self.lines)

    def containers(self, *, label: str | None = None, volume: str | None = None) -> list[Any]:
        return []  # no container a dead run left behind (engine/owner.py reap_orphans)


def test_the_jit_table_lists_precompiled_modules_then_the_not_precompiled_families() -> None:
    stack = b12x()
    rows = cache_table(_VerifyEngine(stack.jit_modules), stack, "image")  # type: ignore[arg-type]
    assert [(r.module, r.status) for r in rows] == [
        ("sampling", "hit"),
        ("fp4_gemm_cutlass_sm120", "hit"),
        (next(m for m in stack.jit_modules if m.startswith("batch_prefill")), "hit"),
        ("b12x CuTe-DSL fused MoE kernels (NVFP4 static, micro and dynamic)", "not-precompiled"),
        ("b12x W4A16 MoE kernels (NVFP4 checkpoints without activation scales)", "not-precompiled"),
        ("b12x direct micro MoE kernel (the smallest NVFP4 decode batches)", "not-precompiled"),
    ]


def test_a_stack_without_not_precompiled_entries_has_no_such_row() -> None:
    assert not_precompiled_rows(resolve("vllm-0.33-marlin", STACKS)) == []


def test_the_printed_table_shows_the_not_precompiled_rows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from builder.cli.verify import print_report

    report = reports.TestReport("vllm-0.33-b12x", "0" * 64, "image")
    report.jit_cache = not_precompiled_rows(b12x())
    report.smoke_skipped = "GPU smoke skipped: no GPU"
    print_report(report)
    printed = capsys.readouterr().out
    assert printed.count("not-precompiled") >= 2
    assert "b12x W4A16 MoE kernels" in printed
    assert "the GPU smoke lists each" in printed


def test_short_why_keeps_version_numbers_and_cuts_at_the_first_sentence() -> None:
    assert short_why("Needs the GPU 12.0f at dispatch.post1. Second sentence.") == (
        "Needs the GPU 12.0f at dispatch.post1."
    )
    cut = short_why("word " * 100)
    assert cut.endswith("...") and len(cut) <= 160


# --- the file-name grammar ---------------------------------------------------------------------


def test_kernel_file_names_parse_into_their_shape_keys() -> None:
    static = parse_kernel_name(layout(), MODULE_DIR, STATIC)
    assert (static.module, static.arch, static.kind) == ("b12x_moe", "sm120a", "static")
    assert static.shape == {"k": 4096, "n": 1024, "t": 8, "r": 128}
    assert static.digest == STATIC[-16:]
    assert static.describe() == "static k=4096 n=1024 t=8 r=128"
    micro = parse_kernel_name(layout(), MODULE_DIR, MICRO)
    assert (micro.kind, micro.shape) == ("micro", {"m": 1, "k": 4096, "n": 1024, "t": 8, "r": 128})
    dynamic = parse_kernel_name(layout(), MODULE_DIR, DYNAMIC)
    assert (dynamic.kind, dynamic.shape) == ("dynamic", {"e": 128, "k": 4096, "n": 1024, "t": 8})
    assert dynamic.key() == {"kind": "dynamic", "e": 128, "k": 4096, "n": 1024, "t": 8} | {
        "digest": DYNAMIC[-16:]
    }


def test_names_outside_the_grammar_are_kept_unparsed() -> None:
    # FlashInfer 0.6.18rc7 named the static kernel static_m.._k..: not this version's grammar.
    old = parse_kernel_name(layout(), MODULE_DIR, "static_m8_k4096_n1024_t8_r128_0123456789abcdef")
    assert (old.kind, old.shape, old.digest) == (None, {}, None)
    other = parse_kernel_name(layout(), "nvfp4_quantize_sm120a_cute_dsl", "quantize_k4096_abc")
    assert (other.module, other.arch, other.kind) == ("nvfp4_quantize", "sm120a", None)
    assert parse_module_dir(layout(), "b12x_moe_sm121a_cute_dsl") == ("b12x_moe", "sm121a")
    assert parse_module_dir(layout(), "sampling") is None


# --- the knowledge file, checked when read -----------------------------------------------------

KEY = "caches.flashinfer_cute_dsl"


@pytest.mark.parametrize(
    ("edit", "key", "message"),
    [
        (
            ("_(?P<arch>sm[0-9]+[a-z]?)_cute_dsl", "_(sm[0-9]+[a-z]?)_cute_dsl"),
            f"{KEY}.module_dir",
            "the regex has no group 'arch': it needs (?P<module>...), (?P<arch>...)",
        ),
        (
            ("'^(?P<kernel>[A-Za-z0-9_]+)", "'^(?P<name>[A-Za-z0-9_]+)"),
            f"{KEY}.kernel_file",
            "the regex has no group 'kernel'",
        ),
        (
            ("static_k(?P<k>[0-9]+)", "static_k(?P<k>[0-9a-z]+)"),
            f"{KEY}.families.b12x_moe.kinds.static",
            "group 'k' ([0-9a-z]+) must match digits only",
        ),
        (
            ("micro_m(?P<m>[0-9]+)", "micro_m(?P<m>[0-9]*)"),  # may be empty: int("") fails
            f"{KEY}.families.b12x_moe.kinds.micro",
            "group 'm' ([0-9]*) must match digits only",
        ),
        (
            ("'^dynamic_e(?P<e>[0-9]+)_k", "'^dynamic_e(?P<e>[0-9]+_k"),
            f"{KEY}.families.b12x_moe.kinds.dynamic",
            "not a regular expression: missing ), unterminated subpattern",
        ),
        (
            ("/cached_ops$'", "/cached_ops$('"),
            f"{KEY}.ops_dir.regex",
            "not a regular expression",
        ),
        (('"==0.7.2.post1"', '"0.7.2.post1"'), f"{KEY}.versions", "is not a version specifier"),
    ],
)
def test_a_bad_entry_in_runtime_caches_names_file_key_and_line(
    tmp_path: Path, edit: tuple[str, str], key: str, message: str
) -> None:
    """A missing group (module, arch, kernel) or a shape group that is no integer raised inside
    classify, in the smoke's `finally`, and lost its report: now the file is refused when read."""
    text = (KNOWLEDGE_DIR / KNOWLEDGE_FILE).read_text()
    assert text.count(edit[0]) == 1
    edited = text.replace(edit[0], edit[1])
    path = tmp_path / KNOWLEDGE_FILE
    path.write_text(edited)
    with pytest.raises(StackError) as caught:
        layouts_of(load_yaml(path))
    error = caught.value
    assert (error.file, error.key) == (path, key)
    assert error.line == edited[: edited.index(edit[1])].count("\n") + 1
    assert message in error.message


def test_the_shipped_layouts_pass_their_checks_and_groups_are_read_as_written() -> None:
    assert layouts_of(load_yaml(KNOWLEDGE_DIR / KNOWLEDGE_FILE)) == cache_layouts()
    assert group_patterns(r"^a(?P<k>[0-9]+)_(?:x(?P<d>[)(\]]{2}))?\((?P<n>\d{1,4})$") == {
        "k": "[0-9]+",
        "d": "[)(\\]]{2}",
        "n": "\\d{1,4}",
    }


# --- listings and the before/after verdict ---------------------------------------------------


def test_the_listing_finds_the_cute_dsl_modules_from_any_folder_above_them(tmp_path: Path) -> None:
    volume = tmp_path / "volume"  # the pin's volume: FLASHINFER_WORKSPACE_BASE is volume/flashinfer
    workspace = volume / "flashinfer"
    precompiled_module(workspace)
    export(workspace, STATIC)
    (ops_dir(workspace) / MODULE_DIR / f"{MICRO}.o.tmp.77").write_bytes(b"half")  # mid-export
    for root in (volume, workspace, ops_dir(workspace), ops_dir(workspace) / ".."):
        listing = list_directory(layout(), root)
        (module,) = listing.modules
        assert Path(module["path"]).name == MODULE_DIR
        assert module["meta"] == META
        assert [k["file"] for k in module["kernels"]] == [f"{STATIC}.o"]
    assert list_directory(layout(), tmp_path / "absent").modules == []


def test_hit_miss_and_a_rewritten_file(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    precompiled_module(workspace)
    for kernel in (STATIC, DYNAMIC):
        age(export(workspace, kernel))
    before = list_directory(layout(), workspace)
    export(workspace, MICRO)  # compiled during the smoke
    export(workspace, DYNAMIC, body=b"\x7fELF again")  # compiled again, persisted again
    after = list_directory(layout(), workspace)
    result = classify(
        LAYOUT_ID,
        layout(),
        before,
        after,
        where="directory",
        version=FI_VERSION,
        runtime_compiles=log_compiles(MICRO, DYNAMIC),
    )
    status = {row.name.split("/")[1]: row.status for row in result.kernels}
    assert status == {STATIC: "hit", MICRO: "miss", DYNAMIC: "miss"}
    assert result.counts == {"hit": 1, "miss": 2, "removed": 0, "listed": 0}
    rows = {row.name.split("/")[1]: row for row in result.kernels}
    assert "rewritten" in rows[DYNAMIC].detail
    assert rows[MICRO].detail.startswith("micro m=1 k=4096 n=1024 t=8 r=128; compiled during")
    assert rows[STATIC].shape == {"kind": "static", "k": 4096, "n": 1024, "t": 8, "r": 128} | {
        "digest": STATIC[-16:]
    }
    assert all(row.module == "b12x_moe" and row.arch == "sm120a" for row in result.kernels)
    assert result.notes == []  # the log names exactly the two misses


def test_a_rewrite_that_keeps_the_size_is_still_a_miss(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    age(export(workspace, STATIC, body=b"AAAA"))
    before = list_directory(layout(), workspace)
    export(workspace, STATIC, body=b"BBBB")
    result = classify(LAYOUT_ID, layout(), before, list_directory(layout(), workspace), where="d")
    assert [r.status for r in result.kernels] == ["miss"]


def test_an_invalidated_module_is_wiped_and_its_kernels_miss_or_go(tmp_path: Path) -> None:
    """A new nvidia-cutlass-dsl: FlashInfer wipes the module, the served shape compiles again."""
    workspace = tmp_path / "ws"
    for kernel in (STATIC, MICRO):
        age(export(workspace, kernel))
    before = list_directory(layout(), workspace)
    module = ops_dir(workspace) / MODULE_DIR
    for path in module.iterdir():
        path.unlink()
    export(workspace, STATIC, meta={**META, "cute_dsl_version": "nvidia-cutlass-dsl==4.9.0"})
    result = classify(LAYOUT_ID, layout(), before, list_directory(layout(), workspace), where="d")
    rows = {row.name.split("/")[1]: row for row in result.kernels}
    assert (rows[STATIC].status, rows[MICRO].status) == ("miss", "removed")
    assert "invalidated: meta.json changed" in rows[STATIC].detail
    (module_meta,) = result.modules
    assert module_meta["meta_before"] == META
    assert module_meta["meta_after"]["cute_dsl_version"] == "nvidia-cutlass-dsl==4.9.0"


def test_kernels_of_another_flashinfer_version_are_left_out(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    export(workspace, STATIC)
    other = workspace / ".cache/flashinfer/0.7.4/120f/cached_ops" / MODULE_DIR
    other.mkdir(parents=True)
    (other / f"{DYNAMIC}.o").write_bytes(b"o")
    listing = list_directory(layout(), workspace)
    result = classify(LAYOUT_ID, layout(), listing, listing, where="d", version=FI_VERSION)
    assert [row.name for row in result.kernels] == [f"{MODULE_DIR}/{STATIC}"]
    assert any("0.7.4" in note for note in result.notes)


# --- the server log against the listing --------------------------------------------------------


def test_where_the_log_and_the_listing_disagree_the_result_says_so(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    age(export(workspace, STATIC))
    before = list_directory(layout(), workspace)
    export(workspace, MICRO)
    after = list_directory(layout(), workspace)
    result = classify(
        LAYOUT_ID,
        layout(),
        before,
        after,
        where="d",
        runtime_compiles=log_compiles(STATIC, DYNAMIC),
    )
    status = {row.name.split("/")[1]: row.status for row in result.kernels}
    # STATIC: unchanged on disk, yet this server compiled it (before the first listing)
    assert status == {STATIC: "miss", MICRO: "miss"}
    assert "the server log names its compile" in next(
        r.detail for r in result.kernels if r.name.endswith(STATIC)
    )
    (not_on_disk, not_in_log) = result.notes
    assert (
        "names 1 CuTe-DSL kernel compile(s) not on disk" in not_on_disk and DYNAMIC in not_on_disk
    )
    assert "1 kernel(s) written during the smoke that no compile line" in not_in_log
    assert MICRO in not_in_log


def test_without_a_log_the_listing_alone_decides_and_says_so(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    before = list_directory(layout(), workspace)  # an empty volume: the first start
    export(workspace, STATIC)
    result = classify(LAYOUT_ID, layout(), before, list_directory(layout(), workspace), where="d")
    assert [r.status for r in result.kernels] == ["miss"]
    assert result.notes == ["no server log read: hits and misses are the listing's alone"]


def test_dsl_compile_lines_without_any_kernel_on_disk_are_noted(tmp_path: Path) -> None:
    listing = list_directory(layout(), tmp_path)
    log = "CUTE_DSL - INFO - [jit_runner] - JIT cache miss function=[w4a16_kernel] module_hash=[1]"
    result = classify(
        LAYOUT_ID,
        layout(),
        listing,
        listing,
        where="d",
        runtime_compiles=find_compiles(log).to_json(),
    )
    assert result.kernels == []
    assert len(result.notes) == 1 and "no kernel was written" in result.notes[0]


# --- watches: the container being tested, a directory given -----------------------------------


class _Ran:
    """A container whose command already ran here, as a process with the image's environment."""

    def __init__(self, out: subprocess.CompletedProcess[str]) -> None:
        self.out = out
        self.removed = False

    def wait(self, timeout: float) -> int:
        return self.out.returncode

    def logs(self, *, stdout: bool = True, stderr: bool = True) -> bytes:
        return (self.out.stdout if stdout else self.out.stderr).encode()

    def remove(self, *, force: bool = False) -> None:
        self.removed = True


class _LocalEngine:
    """Runs a container's command on this machine with FLASHINFER_WORKSPACE_BASE set: the listing
    script is exactly what the image's Python would run."""

    def __init__(self, workspace: Path) -> None:
        self.env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(workspace)}
        self.started: list[_Ran] = []

    def run(self, spec: ContainerSpec) -> _Ran:
        assert spec.command is not None and spec.network_mode == "none"
        argv = [sys.executable, *spec.command[1:]]
        self.started.append(
            _Ran(subprocess.run(argv, env=self.env, capture_output=True, text=True))
        )
        return self.started[-1]

    def containers(self, *, label: str | None = None, volume: str | None = None) -> list[Any]:
        return []  # no container a dead run left behind (engine/owner.py reap_orphans)

    def exec_here(self, argv: list[str]) -> tuple[int, str]:
        """What Container.exec of argv answers in a container of the image: run here."""
        done = subprocess.run(
            [sys.executable, *argv[1:]], env=self.env, capture_output=True, text=True
        )
        return done.returncode, done.stdout + done.stderr


class _SmokeContainer:
    id = "c0ffee"

    def __init__(self, engine: _LocalEngine, running: bool = True) -> None:
        self.attrs: dict[str, Any] = {"State": {"Running": running}}
        self.engine = engine

    def reload(self) -> None:
        pass

    def exec(self, argv: list[str]) -> tuple[int, str]:
        return self.engine.exec_here(argv)


def test_the_container_watch_lists_the_image_then_the_smoke_container(tmp_path: Path) -> None:
    workspace = tmp_path / "opt-flashinfer-cache"
    age(export(workspace, STATIC))  # as if the image held it
    engine = _LocalEngine(workspace)
    watch = container_watch(engine, "image", b12x())  # type: ignore[arg-type]
    assert watch is not None
    watch.before()
    assert engine.started and engine.started[0].removed
    export(workspace, DYNAMIC)
    watch.after(_SmokeContainer(engine))  # type: ignore[arg-type]
    results = watch.result(log_compiles(DYNAMIC))
    result = results.cache(LAYOUT_ID)
    assert {r.name.split("/")[1]: r.status for r in result.kernels} == {
        STATIC: "hit",
        DYNAMIC: "miss",
    }
    assert result.where == f"container {workspace}/.cache/flashinfer"
    assert result.notes == []
    tuned = results.cache("flashinfer_autotune")  # watched too, as its own kind: empty here
    assert (tuned.log_kind, tuned.kernels, tuned.listed) == ("flashinfer_autotune", [], True)
    assert tuned.where == f"container {workspace}/.cache/flashinfer/autotune"


def test_the_in_image_listing_is_the_same_as_the_local_one(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    precompiled_module(workspace)
    export(workspace, STATIC)
    argv = listing_command(layout())
    assert argv[:2] == ["/opt/venv/bin/python", "-c"]
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(workspace)}
    ran = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True)
    inside = Listing.from_json(json.loads(ran.stdout))
    assert inside.root == str(workspace / ".cache" / "flashinfer")
    assert inside.modules == list_directory(layout(), workspace).modules


def test_a_stopped_smoke_container_is_a_note_not_a_lost_report(tmp_path: Path) -> None:
    engine = _LocalEngine(tmp_path)
    watch = container_watch(engine, "image", b12x())  # type: ignore[arg-type]
    assert watch is not None
    watch.before()
    watch.after(_SmokeContainer(engine, running=False))  # type: ignore[arg-type]
    for result in watch.result(None).results:
        assert not result.listed and result.kernels == []
        assert "the smoke's container had stopped" in result.notes[0]


def test_only_stacks_whose_flashinfer_has_the_known_layout_are_watched() -> None:
    engine = _LocalEngine(Path("/nonexistent"))
    for name in ("vllm-0.22-b12x", "ci-mini"):  # FlashInfer 0.6.11.post2: in-memory only
        assert container_watch(engine, "i", resolve(name, STACKS)) is None  # type: ignore[arg-type]
    assert container_watch(engine, "i", resolve("vllm-0.33-marlin", STACKS)) is not None  # type: ignore[arg-type]
    (watch,) = directory_watch(resolve("vllm-0.22-b12x", STACKS), Path("/nonexistent")).watches
    assert "the layout was read for ==0.7.2.post1" in watch.failures[0]


# --- into the reports --------------------------------------------------------------------------


def test_the_smoke_report_and_the_test_report_carry_the_kernel_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    age(export(workspace, STATIC))
    before = list_directory(layout(), workspace)
    export(workspace, MICRO)
    result = classify(
        LAYOUT_ID,
        layout(),
        before,
        list_directory(layout(), workspace),
        where="directory x",
        runtime_compiles=log_compiles(MICRO),
    )
    smoke = SmokeReport(stack="s", image="i", gpu=True, started_at="now")
    smoke.add("correct answer", True, "Paris")
    smoke.kernel_cache = result.to_json()
    assert smoke.passed, "a miss is no failure"
    table = format_table(smoke)
    assert "1 hit, 1 miss, 0 removed" in table
    assert f"miss     {MODULE_DIR}/{MICRO}" in table
    data = json.loads(json.dumps(smoke.to_json()))
    rows = kernel_rows(data["kernel_cache"])
    assert sorted((r.status, r.kind, r.archs) for r in rows) == [
        ("hit", "cached-kernel", ["sm120a"]),
        ("miss", "cached-kernel", ["sm120a"]),
    ]
    (micro,) = [r for r in rows if r.status == "miss"]
    assert micro.module == f"{MODULE_DIR}/{MICRO}"
    assert micro.shape["kind"] == "micro" and micro.shape["m"] == 1

    from builder.cli.verify import print_report

    norm = reports.CacheRow("norm", ["sm_120f"], 1, "hit")
    report = reports.TestReport("s", "0" * 64, "i", jit_cache=[norm])
    add_smoke(report, data)
    assert report.smoke == data and report.jit_cache[1:] == rows
    assert report.passed
    assert [r["kind"] for r in report.to_json()["jit_cache"]] == ["module"] + ["cached-kernel"] * 2
    print_report(report)
    printed = capsys.readouterr().out
    assert "1 hit, 1 miss, 0 removed" in printed
    assert f"b12x_moe_sm120a/{MICRO[:-10]} " in printed  # the digest cut to 6 hex
    assert "compiled during the smoke, now persisted" in printed


# --- smoke --url --jit-cache-dir ---------------------------------------------------------------


def test_smoke_url_lists_the_cache_directory_before_and_after_the_requests(
    stacks_dir: Path, run_cli: Callable[..., Result], tmp_path: Path
) -> None:
    """The server (a fake) compiles one new kernel and one again while the smoke asks; the
    volume's third kernel was persisted by an earlier start."""
    (stacks_dir / "b12x-url.yaml").write_text(
        "extends: vllm-0.33-b12x\nsmoke: {floors: {single_stream_tok_s: 0, batched_tok_s: 0}}\n"
    )
    volume = tmp_path / "volume"
    workspace = volume / "flashinfer"
    for kernel in (STATIC, DYNAMIC):
        age(export(workspace, kernel))
    log = tmp_path / "server.log"
    log.write_text(
        f"{LOG_PREFIX}Compiling CuTe-DSL kernel {MODULE_DIR}/{MICRO}\n"
        f"{LOG_PREFIX}Compiling CuTe-DSL kernel {MODULE_DIR}/{DYNAMIC}\n"
    )
    report = tmp_path / "reports" / "smoke.json"
    with fake_chat_server(Behaviour(answers=True)) as server:

        def compile_on_first_request() -> None:
            deadline = time.monotonic() + 60
            while server.requests == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            export(workspace, MICRO)
            export(workspace, DYNAMIC, body=b"\x7fELF again")

        thread = threading.Thread(target=compile_on_first_request, daemon=True)
        thread.start()
        result = run_cli(
            "smoke",
            "b12x-url",
            "--url",
            url_of(server),
            "--server-log",
            str(log),
            "--jit-cache-dir",
            str(volume),
            "--report",
            str(report),
            stacks_dir=stacks_dir,
        )
        thread.join(timeout=60)
    assert result.exit_code == 0, result.output
    smoke = json.loads(report.read_text())
    assert smoke["passed"]
    caches = {c["cache"]: c for c in smoke["kernel_cache"]["caches"]}
    assert sorted(caches) == ["flashinfer_autotune", LAYOUT_ID]
    cache = caches[LAYOUT_ID]
    assert cache["listed"] and cache["where"] == f"directory {volume}"
    assert {k["name"].split("/")[1]: k["status"] for k in cache["kernels"]} == {
        STATIC: "hit",
        MICRO: "miss",
        DYNAMIC: "miss",
    }
    assert cache["counts"] == {"hit": 1, "miss": 2, "removed": 0, "listed": 0}
    assert smoke["kernel_cache"]["counts"] == cache["counts"]  # the autotune store is empty
    assert cache["notes"] == []
    assert "1 hit, 2 miss, 0 removed" in result.output


# --- test --require-gpu: the container being tested ------------------------------------------


class _ServingContainer:
    """The smoke's container: its serve port is the fake chat server's, its log FlashInfer's."""

    id = "5m0ke"
    name = "sm120-smoke-test"
    short_id = "5m0ke"

    def __init__(self, serve_port: int, host_port: int, log: str) -> None:
        self.attrs: dict[str, Any] = {
            "State": {"Running": True},
            "NetworkSettings": {"Ports": {f"{serve_port}/tcp": [{"HostPort": str(host_port)}]}},
        }
        self.log = log
        self.removed = False
        #: Runs a kernel-cache listing as in this container (set to its engine's exec_here).
        self.listing: Callable[[list[str]], tuple[int, str]] | None = None

    def exec(self, argv: list[str]) -> tuple[int, str]:
        """A kernel-cache listing runs as in the container; anything else is the smoke asking
        for the driver cache of a server that compiled no PTX: 0 files, 0 bytes."""
        if self.listing is not None and argv[1:2] == ["-c"]:
            return self.listing(argv)
        return 0, "0\n0\t/var/cache/sm120-stacks/cuda-driver\n"

    def reload(self) -> None:
        pass

    def logs(self, *, stdout: bool = True, stderr: bool = True) -> bytes:
        return self.log.encode()

    def read_archive(self, path: str) -> Iterator[bytes]:
        """The egress watch's file (verify/egress.py) as a server that reached nothing wrote it."""
        line = json.dumps({"event": "watching", "pid": 1, "process": "vllm serve"}).encode()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo(path.rsplit("/", 1)[-1])
            info.size = len(line)
            archive.addfile(info, io.BytesIO(line))
        yield buffer.getvalue()

    def remove(self, *, force: bool = False) -> None:
        self.removed = True
        self.attrs["State"]["Running"] = False


class _SmokeEngine(_LocalEngine):
    """Listing containers run here; the smoke's own container (the image's CMD) serves."""

    def __init__(self, workspace: Path, serving: _ServingContainer) -> None:
        super().__init__(workspace)
        self.serving = serving

    def run(self, spec: ContainerSpec) -> Any:
        return self.serving if spec.command is None else super().run(spec)

    def image(self, ref: str) -> None:
        return None  # no image config: the smoke's egress watch is then alone on PYTHONPATH


def test_run_smoke_lists_the_image_then_its_own_container(tmp_path: Path) -> None:
    """`test --require-gpu`'s path through run_smoke: the listing before runs in a throwaway
    container of the image, the one after in the smoke's container before it is removed."""
    stack = b12x()
    floors = stack.manifest.smoke.floors.model_copy(
        update={"single_stream_tok_s": 0, "batched_tok_s": 0}
    )
    smoke = stack.manifest.smoke.model_copy(update={"floors": floors})
    stack = dataclasses.replace(stack, manifest=stack.manifest.model_copy(update={"smoke": smoke}))
    workspace = tmp_path / "opt-flashinfer-cache"
    age(export(workspace, STATIC))  # in the image
    log = f"{LOG_PREFIX}Compiling CuTe-DSL kernel {MODULE_DIR}/{MICRO}\n"
    with fake_chat_server(Behaviour(answers=True)) as server:
        port = int(url_of(server).rsplit(":", 1)[1])
        serving = _ServingContainer(stack.manifest.serve.port, port, log)
        engine = _SmokeEngine(workspace, serving)
        serving.listing = engine.exec_here

        def compile_on_first_request() -> None:
            deadline = time.monotonic() + 60
            while server.requests == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            export(workspace, MICRO)

        thread = threading.Thread(target=compile_on_first_request, daemon=True)
        thread.start()
        watch = container_watch(engine, "image", stack)  # type: ignore[arg-type]
        report = run_smoke(
            engine,  # type: ignore[arg-type]
            "image",
            stack,
            mounts={},
            gpu=True,
            report_path=tmp_path / "smoke.json",
            log=lambda _: None,
            kernel_cache=watch,
        )
        thread.join(timeout=60)
    assert report.passed, report.failed()
    assert serving.removed and engine.started[0].removed
    assert report.kernel_cache is not None
    cache = {c["cache"]: c for c in report.kernel_cache["caches"]}[LAYOUT_ID]
    assert cache["where"] == f"container {workspace}/.cache/flashinfer"
    assert {k["name"].split("/")[1]: k["status"] for k in cache["kernels"]} == {
        STATIC: "hit",
        MICRO: "miss",
    }
    assert cache["notes"] == []
    written = json.loads((tmp_path / "smoke.json").read_text())
    assert written["kernel_cache"]["counts"] == {"hit": 1, "miss": 1, "removed": 0, "listed": 0}


def test_test_gives_its_gpu_smoke_the_container_watch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`test STACK --require-gpu` on a stack whose FlashInfer persists CuTe-DSL kernels hands
    run_smoke a watch of the image's own workspace."""
    from builder.cli.verify import _smoke_runner
    from builder.verify import smoke as smoke_module
    from builder.verify.kernel_watch import CacheWatches, ContainerWatch

    given: dict[str, Any] = {}

    def fake_run_smoke(engine: Any, image_ref: str, stack: Any, **kwargs: Any) -> SmokeReport:
        given.update(kwargs)
        return SmokeReport(stack=stack.name, image=image_ref, gpu=True, started_at="now")

    monkeypatch.setattr(smoke_module, "run_smoke", fake_run_smoke)
    # skipped=None: the GPU gate (asked before the static checks) let the smoke run.
    runner = _smoke_runner(object(), b12x(), {}, None, as_json=True)  # type: ignore[arg-type]
    outcome = runner("sm120-stacks:vllm-0.33-b12x-0", tmp_path)
    assert isinstance(outcome, dict)
    watches = given["kernel_cache"]
    assert isinstance(watches, CacheWatches)
    assert [w.cache_id for w in watches.watches] == [LAYOUT_ID, "flashinfer_autotune"]
    for watch in watches.watches:
        assert isinstance(watch, ContainerWatch)
        assert watch.image_ref == "sm120-stacks:vllm-0.33-b12x-0"
        assert watch.version == FI_VERSION


# --- a judgement that fails is a note, not a lost report ---------------------------------------


class _ListingOfAnotherShape(DirectoryWatch):
    """Its listing after the smoke lacks each kernel's size (a listing script of another shape):
    classify raises KeyError on it."""

    def _list(self, container: Container | None) -> Listing:
        listing = super()._list(container)
        if self.before_listing is not None:
            for module in listing.modules:
                for item in module["kernels"]:
                    del item["size"]
        return listing


def test_a_kernel_cache_judgement_that_raises_is_a_note_in_the_written_report(
    tmp_path: Path,
) -> None:
    """The judgement runs in the smoke's `finally`, before the report is written: it raised
    there, and the report (every check of the smoke) was lost to a traceback."""
    stack = b12x()
    floors = stack.manifest.smoke.floors.model_copy(
        update={"single_stream_tok_s": 0, "batched_tok_s": 0}
    )
    smoke = stack.manifest.smoke.model_copy(update={"floors": floors})
    stack = dataclasses.replace(stack, manifest=stack.manifest.model_copy(update={"smoke": smoke}))
    workspace = tmp_path / "ws"
    age(export(workspace, STATIC))
    watch = _ListingOfAnotherShape(LAYOUT_ID, layout(), FI_VERSION, workspace)
    lines: list[str] = []
    with fake_chat_server(Behaviour(answers=True)) as server:
        report = run_smoke_url(
            url_of(server),
            stack,
            report_path=tmp_path / "smoke.json",
            log=lines.append,
            kernel_cache=CacheWatches([watch]),
        )
    assert report.passed, report.failed()
    written = json.loads((tmp_path / "smoke.json").read_text())
    assert written["passed"] and written["checks"]
    (cache,) = written["kernel_cache"]["caches"]
    assert not cache["judged"] and cache["kernels"] == []
    assert cache["notes"] == ["judging the listings failed: KeyError: 'size'"]
    assert f"{layout().title} (directory {workspace}): not judged" in lines[-1]
    assert "note: judging the listings failed: KeyError: 'size'" in lines[-1]
