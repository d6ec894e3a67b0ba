"""`sm120-stacks smoke STACK --url URL`: the smoke's judge on a server the tool did not start.

The server is real: `transformers serve` as a plain local process (no engine) on the tiny
model, its output going to a log file the smoke reads. CPU only; about a minute.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from builder import REPO_ROOT
from builder.manifest.resolve import resolve
from builder.verify.smoke import run_smoke_url
from builder.verify.smoke_judge import server_log_path
from builder.verify.smoke_report import CHECK_ANSWER, CHECK_JIT, CHECK_UP
from tests.conftest import STACKS
from tests.support.net import free_port
from tests.support.tinymodel import make_tiny_model

QA = [("What is the capital of Kentucky?", "The capital of Kentucky is Frankfort.")]
TRANSFORMERS = Path(sys.executable).with_name("transformers")
NVCC_LINE = (
    "[1/3] /usr/local/cuda/bin/nvcc -gencode=arch=compute_120f,code=sm_120f -c csrc/norm.cu -o "
    "/opt/flashinfer-cache/.cache/flashinfer/0.6.11.post2/120f/cached_ops/norm/norm.cuda.o"
)

pytestmark = pytest.mark.skipif(
    not TRANSFORMERS.exists(), reason="transformers[serving] is not in this environment"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    """(base URL, log file, model dir) of a `transformers serve` process on the tiny model."""
    work = tmp_path_factory.mktemp("url-server")
    model = make_tiny_model(work / "tiny", QA)
    log = work / "server.log"
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with log.open("w") as sink:
        process = subprocess.Popen(
            [str(TRANSFORMERS), "serve", str(model), "--host", "127.0.0.1", "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.5)
        else:
            pytest.fail(f"transformers serve did not come up:\n{log.read_text()[-2000:]}")
        yield url, log, model
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_cli_judges_a_running_server_and_names_what_it_read(
    server: tuple[str, Path, Path], tmp_path: Path
) -> None:
    url, log, model = server
    report_path = tmp_path / "url-smoke.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "builder",
            "--build-dir",
            str(tmp_path / "build"),
            "smoke",
            "ci-mini",
            "--url",
            url,
            "--server-log",
            str(log),
            "--model",
            str(model),
            "--report",
            str(report_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(report_path.read_text())
    assert report["passed"] and report["target"] == "url"
    assert report["image"] == f"server at {url}"
    answers = [c["detail"] for c in report["checks"] if c["name"] == CHECK_ANSWER]
    assert answers and all("Frankfort" in a for a in answers)
    assert report["runtime_compiles"] == {"kinds": [], "events": []}
    assert report["kernel_cache"] is None  # no --jit-cache-dir: no cache listed
    assert "Uvicorn running" in server_log_path(report_path).read_text()
    assert "runtime compiles in the server log" in result.stderr


def test_a_compile_in_the_given_log_fails_the_smoke_and_is_named(
    server: tuple[str, Path, Path], tmp_path: Path
) -> None:
    url, log, model = server
    copied = tmp_path / "server.log"
    shutil.copy(log, copied)
    with copied.open("a") as sink:
        sink.write(NVCC_LINE + "\n")
    report = run_smoke_url(
        url,
        resolve("ci-mini", STACKS),
        report_path=tmp_path / "smoke.json",
        server_log=copied,
        model=str(model),
        log=lambda _: None,
    )
    failed = {c.name: c.detail for c in report.checks if not c.passed}
    assert set(failed) == {CHECK_JIT}
    assert failed[CHECK_JIT].startswith("flashinfer: 1 compile line(s): norm")


def test_without_a_log_compiles_are_not_judged_and_the_table_says_so(
    server: tuple[str, Path, Path], tmp_path: Path
) -> None:
    url, _, model = server
    lines: list[str] = []
    report = run_smoke_url(
        url,
        resolve("ci-mini", STACKS),
        report_path=tmp_path / "smoke.json",
        model=str(model),
        log=lines.append,
    )
    assert report.passed and report.runtime_compiles is None
    assert CHECK_JIT not in {c.name for c in report.checks}
    assert "runtime compiles: not judged" in lines[-1]


def test_a_server_that_does_not_answer_fails_the_smoke(tmp_path: Path) -> None:
    """Nothing listens: after the wait, the smoke fails (the manifest's timeout, cut short)."""
    stack = resolve("ci-mini", STACKS)
    smoke = stack.manifest.smoke.model_copy(update={"health_timeout_s": 2})
    stack = dataclasses.replace(stack, manifest=stack.manifest.model_copy(update={"smoke": smoke}))
    report = run_smoke_url(
        f"http://127.0.0.1:{free_port()}",
        stack,
        report_path=tmp_path / "smoke.json",
        log=lambda _: None,
    )
    assert not report.passed
    assert {c.name for c in report.failed()} == {"server ready"}
    assert CHECK_UP not in {c.name for c in report.checks}
