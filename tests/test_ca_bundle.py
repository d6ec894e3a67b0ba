"""The proxy CA given to builds (and looked for by `test`): the host's trust store by default.

Behind a TLS-intercepting proxy, pip inside a build fails CERTIFICATE_VERIFY_FAILED unless the
proxy's CA reaches it as the `proxy-ca` BuildKit secret; the host's system trust store holds it
wherever the host itself gets through the proxy, so that is the default. One option, one
resolver: build and test agree on the bundle, so the leak check looks for what builds were given.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import Result

from builder import REPO_ROOT
from builder.errors import EXIT_BAD_INPUT, StackError
from builder.image import cabundle
from builder.image.cabundle import resolve_ca_bundle

STACK = "vllm-0.22-marlin"


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Three candidate system stores, the first missing: the second is the default."""
    paths = [tmp_path / "missing.crt", tmp_path / "bundle.crt", tmp_path / "cert.pem"]
    paths[1].write_text("-----BEGIN CERTIFICATE-----\n")
    paths[2].write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setattr(cabundle, "SYSTEM_TRUST_STORES", tuple(paths))
    monkeypatch.delenv(cabundle.ENV_VAR, raising=False)
    return paths


def test_the_default_is_the_first_system_trust_store_that_exists(stores: list[Path]) -> None:
    assert resolve_ca_bundle(None) == stores[1]
    assert resolve_ca_bundle("none") is None, "`none` opts out"
    assert resolve_ca_bundle(str(stores[2])) == stores[2]
    assert resolve_ca_bundle(None, stores=[stores[0]]) is None, "no store here: no secret"
    assert cabundle.SYSTEM_TRUST_STORES[1:] == tuple(stores[1:])


def test_the_system_stores_are_the_usual_three() -> None:
    assert [str(p) for p in cabundle.SYSTEM_TRUST_STORES] == [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/cert.pem",
    ]


def test_a_bundle_that_does_not_exist_is_an_error(stores: list[Path], tmp_path: Path) -> None:
    with pytest.raises(StackError) as caught:
        resolve_ca_bundle(str(tmp_path / "typo.pem"))
    assert caught.value.key == "--ca-bundle"
    assert "typo.pem does not exist" in str(caught.value)
    assert "none" in str(caught.value.hint)
    with pytest.raises(StackError):
        resolve_ca_bundle(str(tmp_path))  # a folder is not a bundle


def _capture_build(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def build_stack(*args: Any) -> Any:
        seen["options"] = args[-1]
        raise StackError("stopped by the test")

    monkeypatch.setattr("builder.image.make.build_stack", build_stack)
    monkeypatch.setattr("builder.engine.docker_adapter.connect_engine", lambda address: object())
    monkeypatch.setattr("builder.image.make.detect_build_client", lambda **memo: object())
    return seen


def _capture_test(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from builder.cli import verify as cli_verify

    seen: dict[str, Any] = {}

    def validate(*args: Any) -> Any:
        seen["proxy_ca"] = args[-2]
        raise StackError("stopped by the test")

    monkeypatch.setattr(cli_verify, "validate", validate)
    monkeypatch.setattr("builder.engine.docker_adapter.connect_engine", lambda address: object())
    # No engine to ask for a GPU: the smoke is skipped, so no model folder is needed either.
    monkeypatch.setattr(cli_verify, "_smoke_skipped", lambda *args: "skipped by the test")
    return seen


@pytest.mark.parametrize("command", ["build", "test"])
def test_build_and_test_use_the_system_store_unless_told_otherwise(
    command: str,
    stores: list[Path],
    run_cli: Callable[..., Result],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`test` must look for the CA the build was given: the same default, the same opt-out."""
    capture = _capture_build if command == "build" else _capture_test
    seen = capture(monkeypatch)

    def given(*args: str) -> Path | None:
        seen.clear()
        result = run_cli(command, STACK, *args)
        assert "stopped by the test" in result.output, result.output
        value = seen["options"].ca_bundle if command == "build" else seen["proxy_ca"]
        return value if value is None else Path(value)

    assert given() == stores[1]
    assert given("--ca-bundle", "none") is None
    assert given("--ca-bundle", str(stores[2])) == stores[2]
    monkeypatch.setenv(cabundle.ENV_VAR, str(stores[2]))
    assert given() == stores[2]
    monkeypatch.setenv(cabundle.ENV_VAR, "none")
    assert given() is None


@pytest.mark.parametrize("command", ["build", "test"])
def test_a_missing_bundle_exits_2_in_every_command(
    command: str,
    stores: list[Path],
    run_cli: Callable[..., Result],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`test --ca-bundle typo` used to search the image for nothing and pass."""
    seen = (_capture_build if command == "build" else _capture_test)(monkeypatch)
    result = run_cli(command, STACK, "--ca-bundle", str(tmp_path / "typo.pem"))
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "--ca-bundle: CA bundle" in result.output and "typo.pem does not exist" in result.output
    assert "Traceback" not in result.output
    assert seen == {}, "nothing ran"
    monkeypatch.setenv(cabundle.ENV_VAR, str(tmp_path / "typo.pem"))
    assert run_cli(command, STACK).exit_code == EXIT_BAD_INPUT


def test_every_command_taking_a_ca_bundle_shares_one_option() -> None:
    from builder.cli.main import cli

    def option(command: click.Command) -> click.Parameter | None:
        found = [p for p in command.params if p.name == "ca_bundle"]
        return found[0] if found else None

    ctx = click.Context(cli)
    taking = {name: option(cli.get_command(ctx, name)) for name in cli.list_commands(ctx)}  # type: ignore[arg-type]
    taking = {name: p for name, p in taking.items() if p is not None}
    assert {"build", "test"} <= set(taking)
    shapes = {
        (p.opts[0], p.envvar, p.help, p.metavar)  # type: ignore[attr-defined]
        for p in taking.values()
    }
    assert len(shapes) == 1, shapes


def test_scripts_ask_the_same_resolver(stores: list[Path], tmp_path: Path) -> None:
    """scripts/make-base-cuda-local.sh builds outside the tool but with the same default."""

    def resolver(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "builder.image.cabundle", *args],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
        )

    assert resolver("none").stdout == ""
    assert resolver(str(stores[2])).stdout.strip() == str(stores[2])
    missing = resolver(str(tmp_path / "typo.pem"))
    assert missing.returncode == EXIT_BAD_INPUT and "typo.pem does not exist" in missing.stderr
    script = (REPO_ROOT / "scripts" / "make-base-cuda-local.sh").read_text()
    assert "-m builder.image.cabundle" in script
    assert "ca-certificates.crt" not in script.split("set -euo pipefail", 1)[1]
    flagship = (REPO_ROOT / "scripts" / "flagship-local.sh").read_text()
    assert "ca-certificates.crt" not in flagship, "the default is the tool's, not the script's"
