"""Commands that behave alike (issue 25 item 4), through the real command line: the console's
width, one mount syntax, one --registry, --hosts-dir beside --stacks-dir, one verify table, one
deploy path for one host or all."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import Result

from builder import REPO_ROOT
from tests.conftest import STACKS

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _list(build_dir: Path, env: dict[str, str], **streams: Any) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from builder.cli.main import main; main()"]
    args = ["--stacks-dir", str(STACKS), "--build-dir", str(build_dir), "list"]
    return subprocess.run(
        [*command, *args], cwd=REPO_ROOT, env=env, text=True, check=False, **streams
    )


def _widest(text: str) -> int:
    return max(len(ANSI.sub("", line)) for line in text.splitlines() if "│" in line)


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def test_the_console_takes_the_width_of_the_terminal(tmp_path: Path) -> None:
    """A terminal of 90 columns gets rows of at most 90; a pipe gets 160 (wide enough for
    grep, not the 80 rich would guess); COLUMNS wins over both, also for a kept listing."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 90, 0, 0))
    with contextlib.closing(os.fdopen(leader, "rb", buffering=0)) as reader:
        done = _list(tmp_path / "tty", _plain_env(), stdout=follower, stderr=follower)
        os.close(follower)
        shown = b""
        with contextlib.suppress(OSError):  # EIO: the child closed the terminal
            while chunk := reader.read(65536):
                shown += chunk
    assert done.returncode == 0, shown
    assert _widest(shown.decode(errors="replace")) <= 90

    piped = _list(tmp_path / "pipe", _plain_env(), capture_output=True)
    assert piped.returncode == 0, piped.stderr
    assert 90 < _widest(piped.stdout) <= 160

    for columns in ("100", "130"):  # the second listing of a build folder is its kept text
        narrow = _list(tmp_path / "cols", {**_plain_env(), "COLUMNS": columns}, capture_output=True)
        assert narrow.returncode == 0, narrow.stderr
        assert _widest(narrow.stdout) <= int(columns)


def test_the_smoke_title_names_the_server_in_one_pair_of_parentheses(
    tmp_path: Path, stacks_dir: Path
) -> None:
    from click.testing import CliRunner

    from builder.cli.main import cli
    from tests.support.fake_chat import Behaviour, fake_chat_server, url_of

    (stacks_dir / "url-smoke.yaml").write_text(
        "extends: vllm-0.22-b12x\n"
        "smoke: {concurrency: 2, floors: {single_stream_tok_s: 0, batched_tok_s: 0}}\n"
    )
    with fake_chat_server(Behaviour(answers=True)) as server:
        url = url_of(server)
        args = ["--stacks-dir", str(stacks_dir), "smoke", "url-smoke", "--url", url]
        said = CliRunner().invoke(
            cli, [*args, "--report", str(tmp_path / "s.json")], catch_exceptions=False
        )
    assert said.exit_code == 0, said.output
    assert f"smoke url-smoke (server at {url}): PASSED" in said.stderr
    assert "((" not in said.stderr and "))" not in said.stderr


# --- deploy and verify: one path for one host or all -------------------------------------------

NOWHERE = "unix:///nonexistent/sm120-alike.sock"


def _pinned(stacks_dir: Path, tmp_path: Path, folder: Path, **options: Any) -> None:
    from builder.hosts.pins import write_pin
    from tests.test_fleet import _pin

    write_pin(folder, _pin(stacks_dir, tmp_path, **options))


def test_options_that_judge_a_start_are_refused_without_apply(
    run_cli: Callable[..., Result],
) -> None:
    for given in (
        ["--no-smoke"],
        ["--gate-timeout", "5"],
        ["--json"],
        ["--require-warm"],
        ["--cold"],
    ):
        for target in (["gpu-a"], ["--all"]):
            refused = run_cli("deploy", *target, *given)
            assert refused.exit_code == 2, (given, refused.output)
            assert f"{given[0]} applies to a deploy that starts the server" in refused.output
    product = run_cli("deploy", "gpu-a", "--gpu-product", "NVIDIA-RTX-PRO-6000")
    assert product.exit_code == 2 and "with --format k8s only" in product.output


def test_one_host_is_deployed_through_the_roll_as_all_are(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    """`deploy HOST --apply` and `deploy --all --apply` say the same, JSON alike. Safe by
    default (issue 43): the pinned image's evidence (in no registry that answers here) is
    read before the roll, so both stop there, exit 2, the engine never asked."""
    hosts = tmp_path / "pins"
    _pinned(stacks_dir, tmp_path, hosts, engine=NOWHERE)
    said = {}
    for target in (["gpu-a"], ["--all"]):
        result = run_cli("--hosts-dir", str(hosts), "deploy", *target, "--apply", "--json")
        assert result.exit_code == 2, result.output
        assert "error: " in result.stderr and "gpu-a: refusing to deploy" in result.stderr
        assert "nothing was pulled, stopped or started" in result.stderr
        assert "engine not reached" not in result.output
        said[target[0]] = result.stderr.splitlines()[-3:]
    assert said["gpu-a"] == said["--all"]


def test_hosts_dir_is_global_and_the_commands_option_its_alias(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    hosts = tmp_path / "pins"
    _pinned(stacks_dir, tmp_path, hosts)
    first = run_cli("--hosts-dir", str(hosts), "deploy", "gpu-a", "--out", str(tmp_path / "g"))
    assert first.exit_code == 0, first.output
    assert (tmp_path / "g" / "compose.yaml").is_file()
    alias = run_cli("deploy", "gpu-a", "--hosts-dir", str(hosts), "--out", str(tmp_path / "a"))
    assert alias.exit_code == 0, alias.output
    assert (tmp_path / "a" / "compose.yaml").read_text() == (
        tmp_path / "g" / "compose.yaml"
    ).read_text()
    missing = run_cli("deploy", "gpu-a")  # hosts/ beside the stacks folder: none there
    assert missing.exit_code == 2 and "no pin for host 'gpu-a'" in missing.output


def test_verify_prints_one_table_for_one_host_or_all(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    hosts = tmp_path / "pins"
    _pinned(stacks_dir, tmp_path, hosts, engine=NOWHERE)
    one = run_cli("--hosts-dir", str(hosts), "verify", "gpu-a")
    every = run_cli("--hosts-dir", str(hosts), "verify", "--all")
    assert one.exit_code == every.exit_code == 1, one.output + every.output
    header = [line for line in one.stdout.splitlines() if "host" in line and "warm" in line]
    assert header and header[0] in every.stdout
    rows = [line for line in one.stdout.splitlines() if line.startswith("│ gpu-a")]
    assert rows and all(row in every.stdout for row in rows)
    drifts = [line for line in one.stdout.splitlines() if line.startswith("gpu-a: DRIFT")]
    assert drifts and all(line in every.stdout for line in drifts)
    assert one.stdout.strip().endswith("drift(s)")
    assert every.stdout.strip().endswith("1 of 1 host(s) drift")


# --- one mount syntax --------------------------------------------------------------------------


def test_test_and_pin_read_mounts_alike(run_cli: Callable[..., Result]) -> None:
    """SOURCE:TARGET[:ro] through one parser: the same refusal, word for word, from both."""
    for bad, said in (
        ("a:b:c", "write SOURCE:TARGET[:ro]"),
        ("/models:relative", "SOURCE is an absolute path or a volume name, TARGET a path"),
    ):
        words = set()
        for command in (["test", "ci-mini"], ["pin", "gpu-1", "ci-mini"]):
            refused = run_cli(*command, "--volume", bad)
            assert refused.exit_code == 2, refused.output
            assert f"--volume {bad!r}: {said}" in refused.output
            words.add(refused.output.split("error: ", 1)[1].split(" (")[0].split("\n")[0])
        assert len(words) == 1, words


def test_the_old_mount_spelling_is_accepted_for_one_release_with_a_warning(
    run_cli: Callable[..., Result], tmp_path: Path
) -> None:
    old = run_cli("test", "ci-mini", "--mount", "nope")
    assert old.exit_code == 2
    assert "warning: --mount is deprecated and goes in the next release: write --volume" in (
        old.stderr
    )
    assert "--mount 'nope': write SOURCE:TARGET[:ro]" in old.stderr
    new = run_cli("test", "ci-mini", "--volume", "nope")
    assert "deprecated" not in new.stderr


# --- one --registry ----------------------------------------------------------------------------

REGISTRY_COMMANDS = {
    "push": ["push", "ci-mini"],
    "pull": ["pull", "ci-mini"],
    "build": ["build", "ci-mini", "--pull-or-build"],
    "pin": ["pin", "gpu-1", "ci-mini"],
    "smoke": ["smoke", "ci-mini", "--url", "http://127.0.0.1:9", "--record"],
    "evidence": ["evidence", "ci-mini"],
}


def test_registry_reads_alike_in_every_command(
    run_cli: Callable[..., Result], monkeypatch: Any
) -> None:
    """HOST[:PORT][/NAMESPACE], default SM120_STACKS_REGISTRY: the same help, and the same
    refusal of a malformed one, given or from the variable, before any work."""
    for name, args in REGISTRY_COMMANDS.items():
        shown = run_cli(args[0], "--help").output
        assert "--registry HOST[:PORT][/NAMESPACE]" in shown, name
        assert "SM120_STACKS_REGISTRY" in " ".join(shown.split()), name
        refused = run_cli(*args, "--registry", "http://x:5000")
        assert refused.exit_code == 2, (name, refused.output)
        assert "registry 'http://x:5000' is not HOST[:PORT][/NAMESPACE]" in refused.output, name
    monkeypatch.setenv("SM120_STACKS_REGISTRY", "http://x:5000")
    for name, args in REGISTRY_COMMANDS.items():
        refused = run_cli(*args)
        assert refused.exit_code == 2, (name, refused.output)
        assert "registry 'http://x:5000' is not HOST[:PORT][/NAMESPACE]" in refused.output, name


def test_an_option_of_smokes_record_is_refused_without_it(run_cli: Callable[..., Result]) -> None:
    for given in (["--registry", "127.0.0.1:5000"], ["--gpu-kind", "NVIDIA H200"]):
        refused = run_cli("smoke", "ci-mini", "--url", "http://127.0.0.1:9", *given)
        assert refused.exit_code == 2, refused.output
        assert f"{given[0]} names where --record adds the verdict" in refused.output


def test_build_refuses_a_registry_it_would_not_ask(run_cli: Callable[..., Result]) -> None:
    refused = run_cli("build", "ci-mini", "--registry", "127.0.0.1:5000")
    assert refused.exit_code == 2, refused.output
    assert "--registry is where --pull-or-build looks for the image" in refused.output


def test_pin_and_test_take_the_model_folder_alike(
    stacks_dir: Path, tmp_path: Path, run_cli: Callable[..., Result]
) -> None:
    """--models DIR is DIR:/models:ro in both: the smoke's mount and the pinned server's."""
    from builder.engine.mounts import DEFAULT_MODELS
    from builder.hosts.pins import load_pin
    from builder.manifest.resolve import resolve
    from tests.test_hosts import STACK, _tested_and_pushed

    _tested_and_pushed(tmp_path / "build", resolve(STACK, stacks_dir))
    models = tmp_path / "models"
    pinned = run_cli("pin", "gpu-1", STACK, "--models", str(models), stacks_dir=stacks_dir)
    assert pinned.exit_code == 0, pinned.output
    volumes = [
        (v.source, v.target, v.read_only) for v in load_pin(tmp_path / "hosts", "gpu-1").volumes
    ]
    assert (str(models), "/models", True) in volumes and len(volumes) == 2  # and the caches
    both = run_cli(
        *("pin", "gpu-1", STACK, "--models", str(models), "--volume", "/srv/m:/models:ro"),
        stacks_dir=stacks_dir,
    )
    assert both.exit_code == 2 and "both name the model folder" in both.output
    for command in ("pin", "test"):
        assert DEFAULT_MODELS in " ".join(run_cli(command, "--help").output.split())


def test_the_roll_table_prints_an_error_that_looks_like_markup(
    capsys: Any,
) -> None:
    """An error naming HOST[:PORT][/NAMESPACE] or [:ro] is text, not rich markup (it raised
    MarkupError: a traceback in place of the roll's table)."""
    from builder.cli.fleet import _print_results
    from builder.hosts.fleet import FAILED, HostResult

    detail = "deploy failed: write --registry HOST[:PORT][/NAMESPACE] or SOURCE:TARGET[:ro]"
    _print_results([HostResult("gpu-a", "local", "r@sha256:" + "a" * 64, FAILED, detail)])
    shown = " ".join(capsys.readouterr().out.split())
    assert "[/NAMESPACE]" in shown and "[:ro]" in shown
