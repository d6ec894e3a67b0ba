"""Bad input beyond manifests, through the command line: corrupt or hand-edited records, pins
and locks, unknown hosts and stacks, malformed options. Each is one message naming what is
wrong, exit status 2, no traceback (the runner does not catch exceptions: one would fail the
test), and nothing written. Tested through the CLI so they hold whatever the files' internals.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from builder.manifest.resolve import resolve
from builder.render.context import render
from tests.support.served import served_json

#: A stack without a lock renders in milliseconds; the lock cases use a locked one.
STACK = "bad-state"
LOCKED = "vllm-0.22-marlin"
REPO = "127.0.0.1:5000/sm120-stacks"
DIGEST_REF = f"{REPO}@sha256:{'b' * 64}"


def refused(result: Result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output, result.output
    return result.output


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# --- records -----------------------------------------------------------------------------------


@pytest.fixture
def record(stacks_dir: Path, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The record of the stack's current content hash, tested and pushed: `pin` reads it."""
    (stacks_dir / f"{STACK}.yaml").write_text("extends: vllm-0.22-b12x\n")
    content_hash = render(resolve(STACK, stacks_dir)).content_hash()
    path = tmp_path / "build" / STACK / "records" / f"{content_hash[:16]}.json"
    path.parent.mkdir(parents=True)
    good = {
        "schema_version": 1,
        "stack": STACK,
        "content_hash": content_hash,
        "image_id": "sha256:" + "a" * 64,
        "tests": "passed",
        "report": None,
        "smoke": "passed",
        "pushed": {REPO: DIGEST_REF},
        "served": served_json(),
    }
    path.write_text(json.dumps(good))
    return path, good


def test_a_good_record_pins(
    record: tuple[Path, dict[str, Any]], stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    result = run_cli("pin", "gpu-1", STACK, stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output


RECORDS: list[tuple[str, Callable[[dict[str, Any]], str | bytes], str]] = [
    ("truncated", lambda good: json.dumps(good)[:60], "not valid JSON"),
    ("empty", lambda good: "", "not valid JSON"),
    ("not-an-object", lambda good: "[1, 2]", "valid dictionary"),
    ("not-utf8", lambda good: b"\xff\xfe{}", "cannot read the record"),
    ("wrong-type", lambda good: json.dumps({**good, "tests": "yes"}), "tests:"),
    ("unknown-key", lambda good: json.dumps({**good, "tested": True}), "tested: unknown key"),
    (
        "pushed-not-a-digest",
        lambda good: json.dumps({**good, "pushed": {REPO: "latest"}}),
        f"pushed.{REPO}:",
    ),
    ("other-stack", lambda good: json.dumps({**good, "stack": LOCKED}), "is of stack"),
    ("future-schema", lambda good: json.dumps({**good, "schema_version": 9}), "schema_version"),
]


@pytest.mark.parametrize(("case", "corrupt", "needle"), RECORDS, ids=[c[0] for c in RECORDS])
def test_a_corrupt_or_hand_edited_record_is_refused_by_name(
    case: str,
    corrupt: Callable[[dict[str, Any]], str | bytes],
    needle: str,
    record: tuple[Path, dict[str, Any]],
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
) -> None:
    path, good = record
    body = corrupt(good)
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    result = run_cli("pin", "gpu-1", STACK, stacks_dir=stacks_dir)
    refused(result, path.name, needle, "hint: delete it and run `sm120-stacks test bad-state`")
    assert not (tmp_path / "hosts").exists(), "nothing pinned"


# --- pins --------------------------------------------------------------------------------------


@pytest.fixture
def pin(
    record: tuple[Path, dict[str, Any]],
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
) -> Path:
    assert run_cli("pin", "gpu-1", STACK, stacks_dir=stacks_dir).exit_code == 0
    return tmp_path / "hosts" / "gpu-1.yaml"


PINS: list[tuple[str, Callable[[str], str | bytes], str]] = [
    ("truncated", lambda good: good[: good.index("serve_port")], "gpu-1.yaml"),
    ("empty", lambda good: "", "the file is empty"),
    ("yaml-syntax", lambda good: good + "  - [unclosed\n", "YAML syntax error"),
    ("top-level-list", lambda good: "- a\n", "mapping"),
    ("not-utf8", lambda good: b"host: gpu-1\n\xff\n", "not valid UTF-8"),
    ("unknown-key", lambda good: good + "replicas: 2\n", "replicas: unknown key"),
    ("image-not-a-digest", lambda good: good.replace("@sha256:", "@sha256:zz"), "image:"),
    (
        "port-out-of-range",
        lambda good: good.replace("serve_port: 8000", "serve_port: 99999"),
        "serve_port",
    ),
    (
        "future-schema",
        lambda good: good.replace("schema_version: 2", "schema_version: 7"),
        "schema_version 7",
    ),
    ("other-host", lambda good: good.replace("host: gpu-1", "host: gpu-2"), "pins host 'gpu-2'"),
]


@pytest.mark.parametrize(("case", "corrupt", "needle"), PINS, ids=[c[0] for c in PINS])
def test_a_corrupt_or_hand_edited_pin_is_refused_by_name(
    case: str,
    corrupt: Callable[[str], str | bytes],
    needle: str,
    pin: Path,
    stacks_dir: Path,
    tmp_path: Path,
    run_cli: Callable[..., Result],
) -> None:
    body = corrupt(pin.read_text())
    pin.write_bytes(body if isinstance(body, bytes) else body.encode())
    result = run_cli("deploy", "gpu-1", stacks_dir=stacks_dir)
    refused(result, "gpu-1.yaml", needle)
    assert not (tmp_path / "build" / "hosts").exists(), "no deploy files written"


# --- locks -------------------------------------------------------------------------------------


def _first_sha(text: str) -> str:
    return re.sub(r"inputs_hash: sha256:[0-9a-f]{64}", "inputs_hash: sha256:" + "0" * 64, text)


LOCKS: list[tuple[str, Callable[[str], str | bytes], str]] = [
    ("truncated", lambda good: good[: len(good) // 3], "vllm-0.22-marlin.lock"),
    ("empty", lambda good: "", "the file is empty"),
    ("yaml-syntax", lambda good: good.replace("schema_version: 1", "schema_version: [1"), "YAML"),
    ("not-utf8", lambda good: good.encode()[:300] + b"\xff\xfe", "not valid UTF-8"),
    (
        "future-schema",
        lambda good: good.replace("schema_version: 1", "schema_version: 9"),
        "schema_version",
    ),
    (
        "other-stack",
        lambda good: good.replace(f"stack: {LOCKED}", "stack: vllm-0.22-b12x", 1),
        "made for stack",
    ),
    ("inputs-hash-edited", _first_sha, "edited by hand"),
    (
        "package-dropped",
        lambda good: re.sub(r"\n    pyzmq:\n(      .*\n)+", "\n", good, count=1),
        "locked_hash",
    ),
    (
        "inputs-edited",
        lambda good: good.replace("version: 0.22.1", "version: 0.22.2", 1),
        "edited by hand",
    ),
    (
        "bad-package-hash",
        lambda good: re.sub(r"- sha256:[0-9a-f]{64}", "- sha256:xyz", good, count=1),
        "hashes",
    ),
]


@pytest.mark.parametrize(("case", "corrupt", "needle"), LOCKS, ids=[c[0] for c in LOCKS])
def test_a_corrupt_or_hand_edited_lock_is_refused_by_name(
    case: str,
    corrupt: Callable[[str], str | bytes],
    needle: str,
    stacks_dir: Path,
    run_cli: Callable[..., Result],
) -> None:
    lock = stacks_dir / f"{LOCKED}.lock"
    body = corrupt(lock.read_text())
    lock.write_bytes(body if isinstance(body, bytes) else body.encode())
    refused(run_cli("check", LOCKED, stacks_dir=stacks_dir), "vllm-0.22-marlin.lock", needle)
    if case == "truncated":  # what builds read: the same refusal
        refused(run_cli("render", "--stdout", LOCKED, stacks_dir=stacks_dir), needle)


# --- unknown names and malformed options -------------------------------------------------------

UNKNOWN_STACK = [
    ("show", "nostack"),
    ("check", "nostack"),
    ("render", "nostack"),
    ("build", "nostack"),
    ("test", "nostack"),
    ("push", "nostack", "--registry", "127.0.0.1:5000"),
    ("pull", "nostack", "--registry", "127.0.0.1:5000"),
    ("pin", "gpu-1", "nostack"),
    ("lock", "nostack"),
    ("smoke", "nostack", "--url", "http://127.0.0.1:1"),
    ("diff", STACK, "nostack"),
    ("show", "../../etc/passwd"),
]


@pytest.mark.parametrize("args", UNKNOWN_STACK, ids=[" ".join(a) for a in UNKNOWN_STACK])
def test_an_unknown_stack_is_named(args: tuple[str, ...], run_cli: Callable[..., Result]) -> None:
    refused(run_cli(*args), "no stack named")


@pytest.mark.parametrize("command", ["deploy", "verify"])
def test_an_unknown_or_misspelled_host_is_named(
    command: str, pin: Path, stacks_dir: Path, run_cli: Callable[..., Result]
) -> None:
    refused(run_cli(command, "gpu-9", stacks_dir=stacks_dir), "no pin for host 'gpu-9'", "gpu-1")
    refused(run_cli(command, "GPU_1", stacks_dir=stacks_dir), "'GPU_1' is not a host name")


OPTIONS = [
    (("push", STACK, "--registry", "http://x:5000"), "HOST[:PORT][/NAMESPACE]"),
    (("pin", "gpu-1", STACK, "--gpus", "x,y"), "--gpus"),
    (("pin", "gpu-1", STACK, "--port", "abc"), "ports"),
    (("pin", "gpu-1", STACK, "--volume", "a"), "--volume"),
    (("pin", "gpu-1", STACK, "--env", "=x"), "--env"),
    (("pin", "gpu-1", STACK, "--restart", "sometimes"), "--restart"),
    (("test", STACK, "--soak", "-1"), "--soak"),
    (("test", STACK, "--mount", "nope"), "--mount"),
    (("test", STACK, "--volume", "nope"), "--volume 'nope': write SOURCE:TARGET[:ro]"),
    (("test", STACK, "--volume", "vol:/models"), "the smoke mounts host folders"),
    (("pin", "gpu-1", STACK, "--volume", "a:b:c"), "--volume 'a:b:c': write SOURCE:TARGET[:ro]"),
    (("build", STACK, "--wait", "-5"), "--wait"),
    (("build", STACK, "--max-jobs", "0"), "--max-jobs"),
    (("build", STACK, "--ca-bundle", "/nonexistent"), "does not exist"),
    (("smoke", STACK, "--url", "ftp://x"), "is not an http(s) URL"),
    (("smoke", STACK, "--url", "http://127.0.0.1:1", "--server-pid", "0"), "--server-pid"),
    (("--substitute-base", "nonsense", "show", STACK), "FROM=TO"),
    (("deploy", "gpu-1", "--format", "helm"), "--format"),
]


@pytest.mark.parametrize(("args", "needle"), OPTIONS, ids=[" ".join(o[0]) for o in OPTIONS])
def test_a_malformed_option_is_named(
    args: tuple[str, ...],
    needle: str,
    record: tuple[Path, dict[str, Any]],
    stacks_dir: Path,
    run_cli: Callable[..., Result],
) -> None:
    refused(run_cli(*args, stacks_dir=stacks_dir), needle)


def test_a_build_folder_that_is_a_file_is_named(tmp_path: Path, stacks_dir: Path) -> None:
    from click.testing import CliRunner

    from builder.cli.main import cli

    afile = tmp_path / "afile"
    afile.write_text("x")
    for args in (["list"], ["pin", "gpu-1", STACK]):
        result = CliRunner().invoke(
            cli,
            ["--stacks-dir", str(stacks_dir), "--build-dir", str(afile), *args],
            catch_exceptions=False,
        )
        refused(result, "--build-dir", "is a file")
