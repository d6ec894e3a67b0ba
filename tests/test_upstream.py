"""outdated, propose and diff against a package index on 127.0.0.1 serving recorded PyPI pages
and metadata (tests/fixtures/index/), so the real requests code runs; one test asks PyPI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from packaging.version import Version

from builder import REPO_ROOT
from builder.errors import StackError
from builder.knowledge import loader as knowledge
from builder.knowledge.yamlsafe import load_yaml
from builder.lock.bases import resolve_base
from builder.lock.inputs import lock_path, original_bases
from builder.lock.lockfile import UNPINNED, Lock, LockedBase, LockedBases
from builder.lock.reading import read_lock
from builder.lock.writing import write_lock
from builder.manifest import rules
from builder.manifest.check import check_stack
from builder.manifest.resolve import ResolvedStack, resolve
from builder.upstream.carried_bases import carry_bases
from builder.upstream.index import IndexClient
from builder.upstream.releases import classify, newer
from tests.support.index_server import FIXTURES, Served, index_server, wheel_bytes
from tests.support.locks import lock_of, packages_of


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Served]]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # a CI proxy must not see these
    with index_server() as served:
        yield served


def _probe(**python: object) -> dict[str, object]:
    """The frozen vllm-0.22-marlin of the fixtures, with python settings replaced."""
    data = yaml.safe_load((FIXTURES / "upstream-probe.yaml").read_text())
    data["python"].update(python)
    assert isinstance(data, dict)
    return data


@pytest.fixture
def offline(index: tuple[str, Served], write_stack: Callable[..., Path], stacks_dir: Path) -> Path:
    """stacks/offline: the probe stack on the fixture index."""
    url, _ = index
    write_stack("offline", _probe(index_url=f"{url}/simple"))
    return stacks_dir


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- releases ----------------------------------------------------------------------------------


def test_moves_are_sized_by_the_first_release_component_that_differs() -> None:
    assert classify("0.22.1", "0.33.0") == "minor"
    assert classify("2.11.0", "3.0") == "major"
    assert classify("0.6.11.post2", "0.6.11.post3") == "patch"
    assert classify("13.0.88", "13.1.80") == "minor"
    assert classify("0.33.0", "0.22.1") == "minor"  # a move back is sized the same way


def test_prereleases_count_only_when_the_pin_is_one() -> None:
    versions = [Version(v) for v in ("0.7.1rc4", "0.7.1", "0.7.2rc3")]
    assert newer("0.7.0", versions) == [Version("0.7.1")]
    assert newer("0.7.1rc3", versions) == versions
    # An index's local label is not a newer release than the same public version.
    assert newer("2.11.0", [Version("2.11.0+cu130"), Version("2.11.1+cu130")]) == [
        Version("2.11.1+cu130")
    ]


# --- outdated ----------------------------------------------------------------------------------


def test_outdated_lists_newer_releases_skipping_yanked_and_prereleases(
    offline: Path, run_cli: Callable[..., Result]
) -> None:
    before = _tree(offline)
    result = run_cli("outdated", "offline", "--json", stacks_dir=offline)
    assert result.exit_code == 0, result.output
    rows = {row["package"]: row for row in json.loads(result.output)["rows"]}
    assert set(rows) == {
        "torch",
        "vllm",
        "flashinfer-python",
        "flashinfer-cubin",
        "apache-tvm-ffi",
        "nvidia-cutlass-dsl",
        "nvidia-cuda-nvcc",
        "nvidia-nvvm",
        "nvidia-cuda-crt",
    }
    assert rows["vllm"]["newest"] == {"major": None, "minor": "0.33.0", "patch": None}
    tvm = [n["version"] for n in rows["apache-tvm-ffi"]["newer"]]
    # On PyPI 0.1.13, 0.1.14 and 0.1.15 are yanked and 0.1.14rc0-2 pre-releases.
    assert tvm == [
        "0.1.10",
        "0.1.11",
        "0.1.12",
        "0.1.13.post2",
        "0.1.13.post3",
        "0.1.14.post0",
        "0.1.14.post1",
        "0.1.15.post1",
        "0.1.15.post2",
    ]
    assert all(n["kind"] == "patch" for n in rows["apache-tvm-ffi"]["newer"])
    assert rows["nvidia-cuda-nvcc"]["newest"]["minor"] == "13.5.37"
    # The stack carries the sampler freeze's mitigation; flashinfer 0.6.14 fixes the freeze.
    assert rows["flashinfer-python"]["retires"] == {"flashinfer-sampler-freeze-sm12x": "0.6.14"}
    assert rows["vllm"]["retires"] == {}
    assert _tree(offline) == before  # outdated changes no file


def test_outdated_locked_adds_the_lock_s_other_packages(
    offline: Path, run_cli: Callable[..., Result]
) -> None:
    _lock(offline, "offline", {"vllm": "0.22.1", "six": "1.16.0"})
    result = run_cli("outdated", "offline", "--locked", "--json", stacks_dir=offline)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    assert [(r["package"], r["source"]) for r in rows if r["package"] in ("vllm", "six")] == [
        ("vllm", "pin"),
        ("six", "lock"),
    ]
    assert rows[-1]["note"] == "on none of the stack's indexes"


def test_outdated_table(offline: Path, run_cli: Callable[..., Result]) -> None:
    result = run_cli("outdated", "offline", stacks_dir=offline)
    assert result.exit_code == 0, result.output
    assert "0.33.0" in result.output and "nvidia-cutlass-dsl" in result.output


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("down", "answered HTTP 503"),
        ("html", "does not answer the JSON simple API"),
        ("garbage", "answered garbage"),
        ("closed", "is not reachable"),
    ],
)
def test_an_index_that_is_down_or_answers_garbage_is_an_error_naming_it(
    index: tuple[str, Served],
    write_stack: Callable[..., Path],
    stacks_dir: Path,
    run_cli: Callable[..., Result],
    where: str,
    expected: str,
) -> None:
    url, _ = index
    bad = (
        f"http://127.0.0.1:{_closed_port()}/simple"
        if where == "closed"
        else f"{url}/{where}/simple"
    )
    write_stack("broken", _probe(index_url=bad))
    result = run_cli("outdated", "broken", stacks_dir=stacks_dir)
    assert result.exit_code == 2
    assert expected in result.output and f"index {bad}" in result.output


def test_with_several_stacks_a_failing_index_is_a_row_error(
    offline: Path,
    index: tuple[str, Served],
    write_stack: Callable[..., Path],
    run_cli: Callable[..., Result],
) -> None:
    url, _ = index
    write_stack("broken", _probe(index_url=f"{url}/down/simple"))
    result = run_cli("outdated", "offline", "broken", "--json", stacks_dir=offline)
    assert result.exit_code == 1
    rows = json.loads(result.output.split("\nfailed:")[0])["rows"]
    assert {r["stack"] for r in rows if r["error"]} == {"broken"}
    assert all("HTTP 503" in r["error"] for r in rows if r["stack"] == "broken")
    assert any(r["newer"] for r in rows if r["stack"] == "offline")


# --- propose -----------------------------------------------------------------------------------


def test_propose_pins_what_the_release_requires_and_writes_nothing_else(
    offline: Path, index: tuple[str, Served], run_cli: Callable[..., Result]
) -> None:
    _, served = index
    result = run_cli(
        "propose",
        "try",
        "--from",
        "offline",
        "--set",
        "vllm=0.33.0",
        "--no-lock",
        "--json",
        stacks_dir=offline,
    )
    assert result.exit_code == 0, result.output
    proposal = json.loads(result.output)
    moves = {m["package"]: (m["old"], m["new"], m["kind"]) for m in proposal["moves"]}
    assert moves == {
        "vllm": ("0.22.1", "0.33.0", "minor"),
        "torch": ("2.11.0", "2.14.0", "minor"),
        "flashinfer-python": ("0.6.11.post2", "0.7.2.post1", "minor"),
        "apache-tvm-ffi": ("0.1.9", "0.1.11", "patch"),
        "nvidia-cutlass-dsl": ("4.5.2", "4.8.0", "minor"),
        # released with flashinfer-python, and the fixture index (like PyPI) has no 0.7.2.post1
        "flashinfer-cubin": ("0.6.11.post2", None, "dropped"),
    }
    # The sampler freeze is fixed in flashinfer 0.6.14: the rule, and the setting, can go.
    assert proposal["rules_retire"] == ["flashinfer-sampler-freeze-sm12x"]
    assert any("env.VLLM_USE_FLASHINFER_SAMPLER" in w for w in proposal["warnings"])
    assert proposal["written"] == [str(offline / "try.yaml")]
    text = (offline / "try.yaml").read_text()
    assert "a child\n# stack cannot remove a pin" in text  # dropping a pin makes a full copy
    packages = resolve("try", offline).manifest.python.packages
    assert {n: p.version for n, p in packages.items()} == {
        "torch": "2.14.0",
        "vllm": "0.33.0",
        "flashinfer-python": "0.7.2.post1",
        "apache-tvm-ffi": "0.1.11",
        "nvidia-cutlass-dsl": "4.8.0",
        "nvidia-cuda-nvcc": "13.0.88",
        "nvidia-nvvm": "13.0.88",
        "nvidia-cuda-crt": "13.0.88",
    }
    assert packages["nvidia-cutlass-dsl"].extras == ["cu13"]  # the extras are kept
    assert not (offline / "try.lock").exists()
    assert not list(offline.parent.glob(".propose-*"))
    # torch's page gives no PEP 658 metadata: read out of the wheel by ranges, not downloaded.
    wheel = "torch-2.14.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    size = len(wheel_bytes(wheel, (FIXTURES / "files" / f"{wheel}.metadata").read_bytes()))
    assert 0 < served.bytes_for(wheel) < size / 2
    assert any(
        p.endswith("vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl.metadata")
        for p, _, _ in served.requests
    )


def test_propose_extends_the_stack_follows_ranges_and_reports_rules_it_retires(
    index: tuple[str, Served],
    write_stack: Callable[..., Path],
    stacks_dir: Path,
    run_cli: Callable[..., Result],
) -> None:
    """flashinfer_cutlass crashes on flashinfer 0.6.11 to 0.6.x (a rule that fires); 0.7.2.post1
    asks apache-tvm-ffi>=0.1.11 and nvidia-cutlass-dsl>=4.6.2a0, which move to the newest that
    do. Nothing is dropped, so the proposal extends the stack."""
    url, _ = index
    data = _probe(index_url=f"{url}/simple")
    del data["python"]["packages"]["flashinfer-cubin"]  # type: ignore[index]
    data["serve"]["moe_backend"] = "flashinfer_cutlass"  # type: ignore[index]
    write_stack("fi-cutlass", data)
    result = run_cli(
        "propose",
        "fi-next",
        "--from",
        "fi-cutlass",
        "--set",
        "flashinfer-python=0.7.2.post1",
        "--no-lock",
        "--json",
        stacks_dir=stacks_dir,
    )
    assert result.exit_code == 0, result.output
    proposal = json.loads(result.output)
    assert proposal["rules_retire"] == [
        "flashinfer-cutlass-trtllm-nvfp4-moe-crash-sm120",
        "flashinfer-sampler-freeze-sm12x",
    ]
    manifest = yaml.safe_load((stacks_dir / "fi-next.yaml").read_text())
    assert manifest["extends"] == "fi-cutlass" and manifest["status"] == "experimental"
    assert set(manifest) == {"description", "extends", "status", "python"}
    assert manifest["python"] == {
        "packages": {
            "flashinfer-python": "0.7.2.post1",
            "apache-tvm-ffi": "0.1.15.post2",  # 0.1.15 is yanked
            "nvidia-cutlass-dsl": {"version": "4.8.1", "extras": ["cu13"]},
        }
    }
    assert resolve("fi-next", stacks_dir).manifest.serve.moe_backend == "flashinfer_cutlass"


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["vllm=0.99.0"], "vllm 0.99.0 does not exist on http://127.0.0.1"),
        (["apache-tvm-ffi=0.1.13"], "apache-tvm-ffi 0.1.13 is yanked"),
        (["vllm=0.33.0", "torch=2.13.0"], "cannot resolve: vllm 0.33.0 requires torch==2.14.0"),
        (["no-such-package=1.0"], "no-such-package is on none of the stack's indexes"),
    ],
)
def test_propose_refuses_what_does_not_exist_or_resolve_and_writes_nothing(
    offline: Path, run_cli: Callable[..., Result], sets: list[str], expected: str
) -> None:
    args = [arg for value in sets for arg in ("--set", value)]
    result = run_cli("propose", "nope", "--from", "offline", *args, "--no-lock", stacks_dir=offline)
    assert result.exit_code == 2
    assert expected in result.output
    assert not (offline / "nope.yaml").exists()


def test_propose_refuses_a_known_bad_result(
    offline: Path, write_stack: Callable[..., Path], run_cli: Callable[..., Result]
) -> None:
    write_stack("trtllm", {"extends": "offline", "serve": {"moe_backend": "flashinfer_trtllm"}})
    result = run_cli(
        "propose",
        "nope",
        "--from",
        "trtllm",
        "--set",
        "vllm=0.33.0",
        "--no-lock",
        stacks_dir=offline,
    )
    assert result.exit_code == 2
    assert (
        "flashinfer-trtllm-no-sm120-cubins" in result.output
        and "nothing was written" in result.output
    )
    assert not (offline / "nope.yaml").exists()
    assert not list(offline.parent.glob(".propose-*"))


def test_a_lock_that_cannot_resolve_leaves_nothing_behind(
    index: tuple[str, Served],
    write_stack: Callable[..., Path],
    stacks_dir: Path,
    run_cli: Callable[..., Result],
) -> None:
    """The fixture index has only the pinned packages' pages and no wheels to hash: uv (really
    run) fails, and the manifest, checked and ready, is not written either. Python 3.11 here,
    the tests' own, so that uv does not go looking for another interpreter."""
    url, _ = index
    write_stack("offline", _probe(index_url=f"{url}/simple", version="3.11"))
    result = run_cli(
        "propose", "nope", "--from", "offline", "--set", "vllm=0.33.0", stacks_dir=stacks_dir
    )
    assert result.exit_code == 2
    assert "uv could not resolve" in result.output and "nothing was written" in result.output
    assert not (stacks_dir / "nope.yaml").exists() and not (stacks_dir / "nope.lock").exists()
    assert not list(stacks_dir.parent.glob(".propose-*"))


def test_propose_refuses_an_existing_name(offline: Path, run_cli: Callable[..., Result]) -> None:
    result = run_cli(
        "propose",
        "vllm-0.22-b12x",
        "--from",
        "offline",
        "--set",
        "vllm=0.33.0",
        "--no-lock",
        stacks_dir=offline,
    )
    assert result.exit_code == 2 and "already exists" in result.output


# --- propose: a rule's remedy -------------------------------------------------------------------

RULE = "cuda-python-12.6-overwrites-cuda-bindings"


@pytest.fixture
def uv_as_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, str]]:
    """make_lock as uv resolved vLLM 0.33 here (stacks/vllm-0.33-marlin.lock, versions_from
    .differs): without a cuda-python pin it picks 12.6.2.post1 beside cuda-bindings 13.5.0 (the
    bare cuda-python>=12.0 of flashinfer-python 0.7.2.post1); with cuda-python 13.4.4 pinned,
    cuda-bindings 13.4.4 (its ~=13.4.4). The fixture index has no wheels for uv to resolve the
    whole set from; everything else about propose (index pages, metadata, rules) is real, the
    base digests too: asked as make_lock asks them, of an engine that is not there (DOCKER_HOST
    names a socket nobody listens on), so no registry is reachable. Returns the versions of each
    lock made."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    made: list[dict[str, str]] = []

    def make_lock(stack: ResolvedStack, engine: object, prefer: object = None) -> Lock:
        versions = {n: p.version for n, p in stack.manifest.python.packages.items()}
        pinned = versions.get("cuda-python")
        if pinned is None:
            versions.update({"cuda-python": "12.6.2.post1", "cuda-bindings": "13.5.0"})
        else:
            versions["cuda-bindings"] = pinned
        made.append(versions)
        bases = {r: resolve_base(*b, engine) for r, b in original_bases(stack).items()}  # type: ignore[arg-type]
        return _lock_of(stack, versions).model_copy(update={"bases": LockedBases(**bases)})

    monkeypatch.setattr("builder.upstream.propose.make_lock", make_lock)
    return made


def test_propose_applies_a_rule_s_remedy_says_so_and_the_stack_checks_clean(
    offline: Path, run_cli: Callable[..., Result], uv_as_recorded: list[dict[str, str]]
) -> None:
    """The weekly loop's move: vLLM 0.22 -> 0.33. The first lock holds cuda-python
    12.6.2.post1 and the rule fires; its remedy pins the newest cuda-python >=12.8 on the
    stack's index (13.4.4 on the recorded page: 13.5 does not exist), the lock again is clean.
    No registry is reachable: the parent's pinned base digests (and their note) are carried over,
    so `check` passes on the proposal as written."""
    parent = _lock_pinned_as_marlin(offline)
    args = ("propose", "try", "--from", "offline", "--set", "vllm=0.33.0")
    result = run_cli(*args, "--json", stacks_dir=offline)
    assert result.exit_code == 0, result.output
    proposal = json.loads(result.output)
    written = read_lock(offline / "try.lock")
    assert written.bases == parent.bases  # digest and "not verified from this machine" note
    assert [(b["role"], b["source"], b["digest"]) for b in proposal["bases"]] == [
        ("build", "parent", parent.bases.build.digest),
        ("runtime", "parent", parent.bases.runtime.digest),
    ]
    assert not any("base" in w for w in proposal["warnings"])
    assert [v.get("cuda-python") for v in uv_as_recorded] == ["12.6.2.post1", "13.4.4"]
    assert proposal["remedies_applied"] == [
        {
            "rule": RULE,
            "package": "cuda-python",
            "version": "13.4.4",
            "newest": ">=12.8",
            "why": next(r.remedy.why for r in rules.load_rules() if r.id == RULE and r.remedy),
        }
    ]
    moves = {m["package"]: m for m in proposal["moves"]}
    assert (moves["cuda-python"]["old"], moves["cuda-python"]["new"]) == (None, "13.4.4")
    assert moves["cuda-python"]["why"] == f"remedy of rule {RULE}: the newest cuda-python >=12.8"
    assert moves["vllm"]["new"] == "0.33.0" and moves["torch"]["new"] == "2.14.0"
    assert any(RULE in w and "cuda-python 13.4.4" in w for w in proposal["warnings"])
    assert RULE not in proposal["rules_apply"]
    assert proposal["written"] == [str(offline / "try.yaml"), str(offline / "try.lock")]
    # the pin is in the manifest (a full copy: flashinfer-cubin is dropped), its header says why
    text = (offline / "try.yaml").read_text()
    assert f"#   cuda-python: (new) -> 13.4.4  (remedy of rule {RULE}:" in text
    assert resolve("try", offline).manifest.python.packages["cuda-python"].version == "13.4.4"
    check = run_cli("check", "try", stacks_dir=offline)
    assert check.exit_code == 0, check.output
    assert not list(offline.parent.glob(".propose-*"))


def test_a_propose_killed_between_its_writes_leaves_no_stack_and_the_next_replaces_its_lock(
    offline: Path,
    run_cli: Callable[..., Result],
    uv_as_recorded: list[dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 34's state slice: propose wrote its manifest, then its lock, so a SIGKILL between
    the two left a stack without its lock. The manifest is now written last: a kill between
    leaves a lock alone, which names no stack, and the next propose replaces it."""
    import builder.files
    import builder.lock.writing
    import builder.upstream.propose

    _lock_pinned_as_marlin(offline)
    order: list[str] = []

    def writes(path: Path, text: str | bytes, *args: object, **kwargs: object) -> None:
        order.append(Path(path).name)
        builder.files.write_atomic(path, text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builder.upstream.propose, "write_atomic", writes)
    monkeypatch.setattr(builder.lock.writing, "write_atomic", writes)
    args = ("propose", "try", "--from", "offline", "--set", "vllm=0.33.0")
    result = run_cli(*args, "--json", stacks_dir=offline)
    assert result.exit_code == 0, result.output
    assert [n for n in order if n.startswith("try.")] == ["try.lock", "try.yaml"]
    assert json.loads(result.output)["written"] == [str(offline / n) for n in order[-2:][::-1]]

    (offline / "try.yaml").unlink()  # what a kill between the two writes leaves
    (offline / "try.lock").write_text((offline / "try.lock").read_text() + "# the killed run's\n")
    again = run_cli(*args, stacks_dir=offline)
    assert again.exit_code == 0, again.output
    assert (offline / "try.yaml").is_file()
    assert "the killed run's" not in (offline / "try.lock").read_text()
    assert check_stack(resolve("try", offline)).ok

    (offline / "try.yaml").unlink()
    unlocked = run_cli(*args, "--no-lock", stacks_dir=offline)
    assert unlocked.exit_code == 0, unlocked.output
    assert not (offline / "try.lock").exists()  # a lock alone is not the new manifest's


def _lock_pinned_as_marlin(stacks_dir: Path) -> Lock:
    """A lock for stacks/offline pinning its bases as stacks/vllm-0.22-marlin.lock does: a
    digest from public sources, with the note that says it was not verified here."""
    marlin = read_lock(REPO_ROOT / "stacks" / "vllm-0.22-marlin.lock").bases.build
    stack = resolve("offline", stacks_dir)
    assert marlin.digest and marlin.image == stack.manifest.bases.build.image
    pins = {n: p.version for n, p in stack.manifest.python.packages.items()}
    lock = lock_of(stack, packages_of(pins), base=marlin)
    write_lock(lock_path(stack), lock)
    return lock


def test_a_base_the_parent_does_not_pin_is_said_with_the_command_that_pins_it(
    offline: Path, run_cli: Callable[..., Result], uv_as_recorded: list[dict[str, str]]
) -> None:
    """Without a parent lock to carry a digest from, and no registry, the proposal's lock does
    not pin its bases: propose says so, names `lock try --refresh-bases`, and `check` refuses."""
    result = run_cli(
        "propose", "try", "--from", "offline", "--set", "vllm=0.33.0", stacks_dir=offline
    )
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "build base nvidia/cuda:13.0.2-devel-ubuntu24.04 is NOT pinned by digest" in flat
    assert "offline has no current lock to carry its digest from" in flat
    assert "`sm120-stacks lock try --refresh-bases` pins it where its registry answers" in flat
    assert read_lock(offline / "try.lock").bases.build.digest is None
    check = run_cli("check", "try", stacks_dir=offline)
    assert check.exit_code == 2 and "not pinned by digest" in check.output
    assert "--refresh-bases" in run_cli("lock", "--help").output  # the command named exists


def test_a_changed_base_is_not_carried_and_is_said_with_the_command(
    offline: Path, write_stack: Callable[..., Path]
) -> None:
    """A proposal whose base reference differs from the parent's gets none of the parent's
    digest: unpinned (no registry), it says which base changed and the command that pins it."""
    parent = _lock_pinned_as_marlin(offline)
    moved = _probe()
    image = "nvidia/cuda:13.0.2-devel-ubuntu22.04"
    moved["bases"] = {"build": {"image": image}, "runtime": {"image": image}}
    write_stack("moved", moved)
    stack = resolve("moved", offline)
    unpinned = LockedBase(image=image, note=UNPINNED + "no Docker engine to ask a registry")
    made = lock_of(stack, packages_of({"vllm": "0.33.0"}), base=unpinned)
    lock, bases = carry_bases("moved", stack, made, resolve("offline", offline))
    assert lock.bases.build == unpinned and lock.bases.build != parent.bases.build
    build = bases[0]
    assert (build.role, build.source, build.digest) == ("build", "unpinned", None)
    assert build.pin_command == "sm120-stacks lock moved --refresh-bases"
    assert build.said is not None
    assert f"it differs from offline's {parent.bases.build.image}" in build.said
    assert "no Docker engine to ask a registry" in build.said
    assert f"`{build.pin_command}`" in build.said


def test_the_remedy_shows_in_the_proposal_table(
    offline: Path, run_cli: Callable[..., Result], uv_as_recorded: list[dict[str, str]]
) -> None:
    result = run_cli(
        "propose", "try", "--from", "offline", "--set", "vllm=0.33.0", stacks_dir=offline
    )
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert f"rule {RULE} fired on the proposal; its remedy pins cuda-python 13.4.4" in flat
    assert "remedy of rule" in flat


def test_without_a_remedy_the_rule_refuses_the_proposal(
    offline: Path,
    run_cli: Callable[..., Result],
    uv_as_recorded: list[dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What propose did before the rule carried its remedy: the lock fires the rule, nothing is
    written. (The start switches' remedies stay: without them the rule on the switches refuses
    the proposal before anything is locked.)"""
    bare = tuple(
        r.model_copy(update={"remedy": None}) if r.id == RULE else r for r in rules.load_rules()
    )
    monkeypatch.setattr(rules, "load_rules", lambda: bare)
    result = run_cli(
        "propose", "try", "--from", "offline", "--set", "vllm=0.33.0", stacks_dir=offline
    )
    assert result.exit_code == 2
    assert RULE in result.output and "nothing was written" in result.output
    assert not (offline / "try.yaml").exists() and not (offline / "try.lock").exists()


@pytest.mark.parametrize(
    ("newest", "expected"),
    [
        ("<12.8", f"rule {RULE} still fires after its remedy (cuda-python 12.6.2.post1)"),
        (">=99", f"rule {RULE} fires, and its remedy finds no release of cuda-python >=99"),
    ],
)
def test_a_remedy_that_does_not_clear_its_rule_writes_nothing(
    offline: Path,
    run_cli: Callable[..., Result],
    uv_as_recorded: list[dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    newest: str,
    expected: str,
) -> None:
    def edited(rule: rules.Rule) -> rules.Rule:
        if rule.id != RULE or not isinstance(rule.remedy, rules.PinRemedy):
            return rule
        remedy = rule.remedy.model_copy(update={"newest": newest})
        return rule.model_copy(update={"remedy": remedy})

    changed = tuple(edited(r) for r in rules.load_rules())
    monkeypatch.setattr(rules, "load_rules", lambda: changed)
    result = run_cli(
        "propose", "try", "--from", "offline", "--set", "vllm=0.33.0", stacks_dir=offline
    )
    assert result.exit_code == 2
    assert expected in " ".join(result.output.split()) and "nothing was written" in result.output
    assert not (offline / "try.yaml").exists() and not (offline / "try.lock").exists()


def test_an_explicit_set_is_not_overruled_by_a_remedy(
    offline: Path, run_cli: Callable[..., Result], uv_as_recorded: list[dict[str, str]]
) -> None:
    result = run_cli(
        "propose",
        "try",
        "--from",
        "offline",
        "--set",
        "vllm=0.33.0",
        "--set",
        "cuda-python=12.6.2.post1",
        stacks_dir=offline,
    )
    assert result.exit_code == 2
    flat = " ".join(result.output.split())
    assert f"rule {RULE} fires, and its remedy would pin cuda-python" in flat
    assert "--set (a new pin) cuda-python 12.6.2.post1 overrules" in flat
    assert not (offline / "try.yaml").exists()


# --- propose: a rule's remedy sets the start switches --------------------------------------------

SWITCHES_RULE = "serve-path-reaches-network"
GATE_RULE = "trtllm-gate-follows-network"
GATE_OFF = "--attention-config.use_trtllm_attention=false"
#: What knowledge/serve_switches.yaml has the image set (its switches' variables).
SWITCH_ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "FLASHINFER_NO_DOWNLOAD": "1",
}


def _why(rule_id: str) -> str:
    remedy = next(r.remedy for r in rules.load_rules() if r.id == rule_id)
    assert remedy is not None
    return " ".join(remedy.why.split())


def test_propose_sets_the_start_switches_the_rule_s_remedy_names(
    offline: Path, run_cli: Callable[..., Result]
) -> None:
    """vLLM 0.22 -> 0.33 from a stack that predates the switches: the proposal sets each in its
    env, says so, and the written stack checks clean and leaves none open."""
    args = ("propose", "try", "--from", "offline", "--set", "vllm=0.33.0", "--no-lock")
    result = run_cli(*args, "--json", stacks_dir=offline)
    assert result.exit_code == 0, result.output
    proposal = json.loads(result.output)
    # marlin's route never reaches FlashInfer attention: the gate is not asked, so not set
    assert proposal["settings_applied"] == [
        {"rule": SWITCHES_RULE, "env": SWITCH_ENV, "extra_args": [], "why": _why(SWITCHES_RULE)}
    ]
    assert any(
        w.startswith(f"rule {SWITCHES_RULE} fired on the proposal") for w in proposal["warnings"]
    )
    assert SWITCHES_RULE not in proposal["rules_apply"]
    text = (offline / "try.yaml").read_text()
    assert f"#   env.HF_HUB_OFFLINE: set by the remedy of rule {SWITCHES_RULE}" in text
    stack = resolve("try", offline)
    assert {k: stack.manifest.env[k] for k in SWITCH_ENV} == SWITCH_ENV
    assert stack.manifest.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"  # the parent's env is kept
    assert stack.start_switches is not None and stack.start_switches.open == ()
    assert check_stack(stack).violations == []  # no rule fires (not locked: --no-lock)


def test_propose_turns_the_gate_off_after_the_parent_s_arguments(
    index: tuple[str, Served],
    write_stack: Callable[..., Path],
    stacks_dir: Path,
    run_cli: Callable[..., Result],
) -> None:
    """An fp8 KV cache reaches FlashInfer attention, whose decode kernel follows the network on
    0.33 unless the gate is off: the proposal (extending its parent, nothing dropped) writes the
    parent's serve.extra_args with the gate's argument after them, and the variables under env.
    One digest, one route: the decode kernel is the same with and without a network."""
    url, _ = index
    data = _probe(index_url=f"{url}/simple")
    del data["python"]["packages"]["flashinfer-cubin"]  # type: ignore[index]
    data["serve"]["model"].update(checkpoint_kv_cache_dtype="fp8_e4m3", head_dim=128)  # type: ignore[index]
    data["serve"].update(dtype="bfloat16", extra_args=["--trust-remote-code"])  # type: ignore[index]
    write_stack("fp8-kv", data)
    args = ("propose", "try", "--from", "fp8-kv", "--set", "vllm=0.33.0", "--no-lock", "--json")
    result = run_cli(*args, stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    applied = json.loads(result.output)["settings_applied"]
    assert [(s["rule"], s["env"], s["extra_args"]) for s in applied] == [
        (GATE_RULE, {}, [GATE_OFF]),
        (SWITCHES_RULE, SWITCH_ENV, [GATE_OFF]),
    ]
    manifest = yaml.safe_load((stacks_dir / "try.yaml").read_text())
    assert manifest["extends"] == "fp8-kv"
    assert manifest["serve"] == {"extra_args": ["--trust-remote-code", GATE_OFF]}
    assert manifest["env"] == SWITCH_ENV
    stack = resolve("try", stacks_dir)
    switches = stack.start_switches
    assert switches is not None and switches.gate_reached and switches.gate == "off"
    assert switches.open == () and switches.decode(online=True) == switches.decode(online=False)
    assert check_stack(stack).violations == []


def test_a_switches_remedy_that_does_not_clear_its_rule_writes_nothing(
    offline: Path, run_cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The remedy set to name one switch of three: the rule still fires, and says what was set."""

    def narrowed(rule: rules.Rule) -> rules.Rule:
        if rule.id != SWITCHES_RULE or rule.remedy is None:
            return rule
        return rule.model_copy(
            update={"remedy": rule.remedy.model_copy(update={"switches": ["usage-stats"]})}
        )

    changed = tuple(narrowed(r) for r in rules.load_rules())
    monkeypatch.setattr(rules, "load_rules", lambda: changed)
    args = ("propose", "try", "--from", "offline", "--set", "vllm=0.33.0", "--no-lock")
    result = run_cli(*args, stacks_dir=offline)
    assert result.exit_code == 2
    flat = " ".join(result.output.split())
    assert (
        f"rule {SWITCHES_RULE} still fires after its remedy "
        "(env VLLM_NO_USAGE_STATS=1, env DO_NOT_TRACK=1)"
    ) in flat
    assert "nothing was written" in flat and not (offline / "try.yaml").exists()


GATE_SWITCHES = "      switches: [trtllm-attention-gate]\n"


@pytest.mark.parametrize(
    ("edit", "key", "message"),
    [
        (
            (GATE_SWITCHES, "      switches: [trtllm-attention-gate, no-such-switch]\n"),
            "switches[1]",
            "sets 'no-such-switch', which knowledge/serve_switches.yaml does not record",
        ),
        (("      start.trtllm_gate: network\n", ""), "switches", "no condition of the rule reads"),
        ((GATE_SWITCHES, "      switches: []\n"), "switches", "sets no switch"),
    ],
)
def test_bad_switches_remedy_data_is_a_load_error_naming_file_key_and_line(
    tmp_path: Path, edit: tuple[str, str], key: str, message: str
) -> None:
    text = knowledge.read_knowledge("rules.yaml").path.read_text()
    assert text.count(edit[0]) == 1
    edited = text.replace(edit[0], edit[1])
    (tmp_path / "rules.yaml").write_text(edited)
    index = next(i for i, r in enumerate(rules.load_rules()) if r.id == GATE_RULE)
    with pytest.raises(StackError) as caught:
        rules.rules_of(load_yaml(tmp_path / "rules.yaml"))
    error = caught.value
    assert error.file == tmp_path / "rules.yaml" and error.key == f"rules[{index}].remedy.{key}"
    block = edited.index("      switches:", edited.index(f"id: {GATE_RULE}"))
    assert error.line == edited[:block].count("\n") + 1 and message in error.message


REMEDY_LINE = '      newest: ">=12.8"\n'


@pytest.mark.parametrize(
    ("edit", "key", "message"),
    [
        ((REMEDY_LINE, '      newest: "12.8"\n'), "newest", "is not a version specifier"),
        ((REMEDY_LINE, '      newest: ""\n'), "newest", "an empty specifier allows every"),
        (("      pin: cuda-python\n", "      pin: cuda python\n"), "pin", "is not a package name"),
        (("      pin: cuda-python\n", "      pin: numpy\n"), "pin", "which no condition"),
        ((REMEDY_LINE, REMEDY_LINE + "      constraint: x\n"), "constraint", "unknown key"),
        ((REMEDY_LINE, ""), "newest", "Field required"),
    ],
)
def test_bad_remedy_data_is_a_load_error_naming_file_key_and_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_cli: Callable[..., Result],
    edit: tuple[str, str],
    key: str,
    message: str,
) -> None:
    folder = tmp_path / "knowledge"
    shutil.copytree(knowledge.KNOWLEDGE_DIR, folder)
    text = (folder / "rules.yaml").read_text()
    assert text.count(edit[0]) == 1
    edited = text.replace(edit[0], edit[1])
    (folder / "rules.yaml").write_text(edited)
    index = next(i for i, r in enumerate(rules.load_rules()) if r.id == RULE)
    # the line of the key in the rule's remedy block, else (a key left out) of the block
    block = edited.index("    remedy:\n", edited.index(f"id: {RULE}"))
    spelled = edited.find(f"      {key}:", block)
    line = edited[: spelled if spelled >= 0 else block].count("\n") + 1
    with pytest.raises(StackError) as caught:
        rules.rules_of(load_yaml(folder / "rules.yaml"))
    error = caught.value
    assert error.file == folder / "rules.yaml"
    assert error.key == f"rules[{index}].remedy.{key}"
    assert error.line == line and message in error.message
    # and the command that reads the rules exits 2 with it
    monkeypatch.setattr(knowledge, "KNOWLEDGE_DIR", folder)
    for cached in (knowledge.read_knowledge, rules.load_rules):
        cached.cache_clear()
    try:
        result = run_cli("check", "vllm-0.33-marlin")
    finally:
        for cached in (knowledge.read_knowledge, rules.load_rules):
            cached.cache_clear()
    assert result.exit_code == 2
    assert f"rules.yaml:{line}: rules[{index}].remedy.{key}: " in result.output
    assert message in result.output


# --- diff --------------------------------------------------------------------------------------


def _lock(stacks_dir: Path, name: str, versions: dict[str, str]) -> None:
    """A lock matching the stack's manifest, holding these versions (no resolution)."""
    stack = resolve(name, stacks_dir)
    write_lock(lock_path(stack), _lock_of(stack, versions))


def _lock_of(stack: ResolvedStack, versions: dict[str, str]) -> Lock:
    return lock_of(stack, packages_of(versions))


@pytest.fixture
def two_stacks(write_stack: Callable[..., Path], stacks_dir: Path) -> Path:
    write_stack("left", _probe())
    right = _probe()
    right["python"]["packages"].update(  # type: ignore[index]
        {"vllm": "0.33.0", "torch": "2.14.0", "flashinfer-python": "0.7.2.post1"}
    )
    del right["python"]["packages"]["flashinfer-cubin"]  # type: ignore[index]
    right["serve"]["moe_backend"] = "flashinfer_trtllm"  # type: ignore[index]
    write_stack("right", right)
    common = {"nvidia-cuda-nvcc": "13.0.88"}
    _lock(stacks_dir, "left", {**common, "vllm": "0.22.1", "torch": "2.11.0", "six": "1.16.0"})
    _lock(stacks_dir, "right", {**common, "vllm": "0.33.0", "torch": "3.0.0", "numpy": "2.3.0"})
    return stacks_dir


def test_diff_shows_manifest_lock_rules_and_dockerfile(
    two_stacks: Path, run_cli: Callable[..., Result]
) -> None:
    before = _tree(two_stacks)
    result = run_cli("diff", "left", "right", "--json", stacks_dir=two_stacks)
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    changed = {c["key"]: (c["a"], c["b"], c["only"]) for c in d["manifest"]}
    assert changed["python.packages.vllm.version"] == ("0.22.1", "0.33.0", None)
    assert changed["serve.moe_backend"] == ("marlin", "flashinfer_trtllm", None)
    assert changed["python.packages.flashinfer-cubin.version"] == ("0.6.11.post2", None, "a")
    assert d["locks"]["a"] == d["locks"]["b"] == "locked"
    assert d["locks"]["same"] == 1
    assert {p["package"]: (p["change"], p["kind"]) for p in d["locks"]["packages"]} == {
        "numpy": ("added", None),
        "six": ("removed", None),
        "torch": ("moved", "major"),
        "vllm": ("moved", "minor"),
    }
    # right is a 0.33 stack that sets none of the start switches (knowledge/serve_switches.yaml)
    assert d["rules"]["only_b"] == [
        "flashinfer-trtllm-no-sm120-cubins",
        "serve-path-reaches-network",
    ]
    assert d["rules"]["a"] == []
    # vLLM 0.33's start switches are derived for b alone (knowledge/serve_switches.yaml covers
    # no 0.22): the gate left to the network, not reached by marlin's route, three switches open.
    derived = {c["key"]: (c["b"], c["only"]) for c in d["derived"]}
    assert derived["start_switches.trtllm_gate"] == ("network", "b")
    assert derived["start_switches.trtllm_gate_reached"] == (False, "b")
    assert [o.split(":")[0] for o in derived["start_switches.open"][0]] == [
        "usage-stats",
        "hf-hub-lookups",
        "flashinfer-cubin-download",
    ]
    assert all(k.startswith("start_switches.") for k in derived) and d["render_errors"] == {}
    assert d["dockerfile"][:2] == ["--- left/Dockerfile", "+++ right/Dockerfile"]
    assert any(line.startswith("+") and "0.7.2.post1" in line for line in d["dockerfile"])
    assert _tree(two_stacks) == before


def test_diff_table(two_stacks: Path, run_cli: Callable[..., Result]) -> None:
    result = run_cli("diff", "left", "right", stacks_dir=two_stacks)
    assert result.exit_code == 0, result.output
    for text in ("serve.moe_backend", "flashinfer_trtllm", "numpy", "major", "--- left/Dockerfile"):
        assert text in result.output


# --- the real index ----------------------------------------------------------------------------


@pytest.mark.network
def test_pypi_answers_the_json_simple_api() -> None:
    """One request to PyPI (through the proxy CA where one is set)."""
    ca = os.environ.get("SM120_STACKS_CA_BUNDLE")
    project = IndexClient(Path(ca) if ca else None).project("https://pypi.org/simple", "six")
    assert project is not None
    assert Version("1.16.0") in project.available()


def test_propose_gives_the_mtp_draft_its_own_backend_on_the_way_to_0_33(
    index: tuple[str, Served],
    write_stack: Callable[..., Path],
    stacks_dir: Path,
    run_cli: Callable[..., Result],
) -> None:
    """An MTP stack on 0.22 with its draft inheriting marlin, moved to 0.33: the draft falls to
    auto there (FlashInfer CUTLASS BF16 on sm120, not precompiled), so rule
    draft-moe-auto-compiles-fused-moe-120-sm12x fires on the proposal and its `set` remedy
    writes serve.speculative.moe_backend: triton, after which the proposal checks clean."""
    url, _ = index
    data = _probe(index_url=f"{url}/simple")
    serve = data["serve"]
    assert isinstance(serve, dict)
    serve["speculative"] = {"method": "mtp"}
    serve["model"]["draft_head_quantization"] = "bf16"  # the MTP head NVIDIA ships unquantized
    write_stack("mtp", data)
    args = ("propose", "try", "--from", "mtp", "--set", "vllm=0.33.0", "--no-lock", "--json")
    result = run_cli(*args, stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    proposal = json.loads(result.output)
    rule = "draft-moe-auto-compiles-fused-moe-120-sm12x"
    applied = [s for s in proposal["settings_applied"] if s["rule"] == rule]
    assert applied and applied[0]["serve"] == {"speculative.moe_backend": "triton"}
    written = yaml.safe_load((stacks_dir / "try.yaml").read_text())
    assert written["serve"]["speculative"]["moe_backend"] == "triton"
    stack = resolve("try", stacks_dir)
    assert check_stack(stack).violations == []  # no rule fires (not locked: --no-lock)
    assert stack.draft is not None and stack.draft.moe_backend == "triton"
