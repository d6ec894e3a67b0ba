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
from pathlib import Path
from typing import Any

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

    from tests.conftest import cli
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
