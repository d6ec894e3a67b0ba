"""The audit's requirement and switch diffs, on small wheels the tests make, with the pins looked
up on the fixture index (tests/support/index_server.py) by the real index client."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.upstream import source_audit as src
from builder.upstream.index import IndexClient
from builder.upstream.metadata import Target
from builder.upstream.stand_in import Unresolved, unresolved
from tests.support.index_server import index_server

TARGET = Target("linux/amd64", "3.12")


def _wheel(folder: Path, version: str, requires: list[str], files: dict[str, str]) -> Path:
    """vllm-VERSION's wheel: its METADATA and the Python files given."""
    path = folder / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    lines = ["Metadata-Version: 2.1", "Name: vllm", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"vllm-{version}.dist-info/METADATA", "\n".join(lines) + "\n")
        for name, text in files.items():
            archive.writestr(name, text)
    return path


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    with index_server() as (url, _served):
        yield f"{url}/simple"


OLD_ENVS = (
    'environment_variables = {\n    "VLLM_KEEP": lambda: 1,\n    "VLLM_GONE": lambda: 0,\n}\n'
)
NEW_ENVS = (
    "removed_environment_variables: dict[str, str] = {\n"
    '    "VLLM_GONE": "removed: use something else",\n'
    "}\n"
    'environment_variables = {\n    "VLLM_KEEP": lambda: 1,\n    "VLLM_NEW": lambda: 2,\n}\n'
)
INTERFACE = (
    "def check(os):\n"
    "    for env, value in os.environ.items():\n"
    '        if env == "VLLM_USE_V2_MODEL_RUNNER":\n'
    '            if value != "1":\n'
    "                raise ValueError(\n"
    '                    "Model Runner V1 has been removed. Unset this variable."\n'
    "                )\n"
)


def test_pins_the_index_lacks_are_found_with_the_nearest_versions_and_moves_are_said(
    tmp_path: Path, index: str
) -> None:
    old = _wheel(tmp_path, "1.0.0", ["flashinfer-python==0.6.13", "transformers<5.21"], {})
    new = _wheel(tmp_path, "1.1.0", ["flashinfer-python==0.6.13.post9", "transformers<5.23"], {})
    found = src.requirement_findings(
        src.WheelSource(new), src.WheelSource(old), TARGET, IndexClient(), [index]
    )
    texts = {(f.subject, f.text, f.where) for f in found}
    missing = [t for t in texts if "is not on" in t[1]]
    assert missing == [
        (
            "flashinfer-python",
            f"flashinfer-python==0.6.13.post9 is not on {index} (nearest: 0.6.13, 0.6.14)",
            "vllm-1.1.0.dist-info/METADATA:4",
        )
    ]
    assert ("transformers", "moves: <5.21 -> <5.23", "vllm-1.1.0.dist-info/METADATA:5") in texts


def test_switches_added_removed_and_newly_raising_carry_their_file_and_line(
    tmp_path: Path,
) -> None:
    old = _wheel(tmp_path, "1.0.0", [], {"vllm/envs.py": OLD_ENVS})
    new = _wheel(
        tmp_path,
        "1.1.0",
        [],
        {"vllm/envs.py": NEW_ENVS, "vllm/platforms/interface.py": INTERFACE},
    )
    found, names = src.switch_findings(
        src.WheelSource(new), src.WheelSource(old), {"VLLM_GONE": "1"}, {"VLLM_KEEP"}
    )
    said = {(f.subject, f.text.split(":")[0].split(";")[0], f.where) for f in found}
    assert ("VLLM_NEW", "added", "vllm/envs.py:6") in said
    assert ("VLLM_GONE", "newly raises at start", "vllm/envs.py:2") in said, said
    assert (
        "VLLM_USE_V2_MODEL_RUNNER",
        "newly raises at start",
        "vllm/platforms/interface.py:3-7",
    ) in said
    gone = next(f for f in found if f.subject == "VLLM_GONE" and "raises" in f.text)
    assert gone.text == (
        "newly raises at start; the stack's env sets it: the start fails: "
        "removed: use something else"
    )
    runner = next(
        f for f in found if f.subject == "VLLM_USE_V2_MODEL_RUNNER" and "raises" in f.text
    )
    assert runner.text.endswith("Model Runner V1 has been removed. Unset this variable.")
    assert names == ["VLLM_GONE", "VLLM_KEEP", "VLLM_NEW", "VLLM_USE_V2_MODEL_RUNNER"]


def test_a_citation_that_moved_is_re_anchored_and_one_that_went_is_said(tmp_path: Path) -> None:
    body = "def gate():\n    return probe()\n"
    old = _wheel(tmp_path, "1.0.0", [], {"vllm/utils.py": body + "def other():\n    pass\n"})
    new = _wheel(tmp_path, "1.1.0", [], {"vllm/utils.py": "# moved\n\n" + body})
    found, anchored = src.citation_findings(
        src.WheelSource(new),
        src.WheelSource(old),
        {"gate": ["vllm/utils.py:1-2 (gate)", "vllm/utils.py:3-4 (other)"]},
    )
    assert anchored == {"gate": ["vllm/utils.py:3-4 (gate)"]}
    assert [(f.text, f.where) for f in found] == [
        ("gate: moved to vllm/utils.py:3-4", "vllm/utils.py:3-4"),
        ("gate: the cited lines are gone or changed", "vllm/utils.py:3-4"),
    ]


def test_a_gutted_package_is_named_once_at_its_top_most_folder(tmp_path: Path) -> None:
    proposers = {f"vllm/v1/spec_decode/p{i}.py": "" for i in range(5)}
    kept = {"vllm/v1/spec_decode/metrics.py": ""} | {f"vllm/v1/m{i}.py": "" for i in range(9)}
    old = _wheel(tmp_path, "1.0.0", [], {**proposers, **kept, "vllm/v1/spec_decode/x/a.py": ""})
    new = _wheel(tmp_path, "1.1.0", [], kept)
    found = src.removed_packages(src.WheelSource(new), src.WheelSource(old))
    assert [(f.subject, f.text) for f in found] == [
        (
            "vllm/v1/spec_decode/",
            "removed 6 of its 7 Python files (first: vllm/v1/spec_decode/p0.py)",
        )
    ]


def _package(folder: Path, name: str, files: dict[str, str]) -> Path:
    """A wheel of the distribution NAME holding those files (a stand-in candidate)."""
    path = folder / f"{name}-9.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def test_a_stand_in_resolves_the_names_imported_from_it_or_says_which_it_lacks(
    tmp_path: Path,
) -> None:
    importer = _wheel(
        tmp_path,
        "1.1.0",
        [],
        {
            "vllm/a.py": "from flashinfer.fused import moe, top_k\nimport flashinfer.jit\n",
            "vllm/b.py": "def f():\n    from b12x.kernels import run\n",  # another package
        },
    )
    full = {
        "flashinfer/__init__.py": "",
        "flashinfer/jit/__init__.py": "",
        "flashinfer/fused.py": (
            "def moe(): ...\ntry:\n    from .x import top_k\n"
            "except ImportError:\n    top_k = None\n"
        ),
        "b12x/__init__.py": "",  # the stub FlashInfer's wheels carry: not FlashInfer's name
    }
    lacking = {**full, "flashinfer/fused.py": "def moe(): ...\n"}
    source = src.WheelSource(importer)
    assert unresolved(
        source, src.WheelSource(_package(tmp_path, "a", full)), "flashinfer-python"
    ) == (3, [])
    count, missing = unresolved(
        source, src.WheelSource(_package(tmp_path, "b", lacking)), "flashinfer-python"
    )
    assert (count, missing) == (3, [Unresolved("flashinfer.fused", "top_k", "vllm/a.py:1")])
