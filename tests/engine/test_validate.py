"""`sm120-stacks test` end to end on ci-mini's real image: the testinfra checks, the JIT table,
the smoke prompt, and the record `push` and `pin` trust. A planted leak must fail it."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder.image.names import content_tag, local_ref
from builder.image.records import load_record
from builder.manifest.resolve import resolve
from builder.render.context import render

pytestmark = pytest.mark.engine


def _test(cli_process: Callable[..., Any], stack: str, models: dict[str, Path]) -> Any:
    result = cli_process(
        "test", stack, "--volume", f"{models['trained']}:/models/tiny", "--json", check=False
    )
    assert result.stdout.startswith("{"), f"no JSON report:\n{result.stdout}\n{result.stderr}"
    return result.returncode, json.loads(result.stdout)


@pytest.mark.needs_ci_mini("the static checks and the JIT table on ci-mini's real image")
def test_the_image_passes_every_check_and_is_recorded_as_tested(
    ci_mini: dict[str, str],
    cli_process: Callable[..., Any],
    models: dict[str, Path],
    workspace: Path,
) -> None:
    status, report = _test(cli_process, "ci-mini", models)
    failed = [c for c in report["checks"] if not c["passed"] and not c["skipped"]]
    assert (status, failed) == (0, [])
    names = {c["name"] for c in report["checks"]}
    assert {"no_secret_left_in_the_image", "nvcc_matches_the_stack_cuda"} <= names
    assert len(names) >= 10
    assert [(r["module"], r["status"], r["archs"]) for r in report["jit_cache"]] == [
        ("norm", "hit", ["sm_120f"])
    ]
    assert report["smoke"]["passed"] is True
    record = load_record(workspace / "build", "ci-mini", ci_mini["hash"])
    assert (record.tests, record.report, record.smoke) == ("passed", report["path"], "passed")


def test_a_leaked_proxy_ca_fails_the_image_and_push_refuses_it(
    tiny_stack: dict[str, str],
    cli_process: Callable[..., Any],
    models: dict[str, Path],
    tiny_variant: Callable[[str, str], str],
    workspace: Path,
    proxy_ca: tuple[Path, str],
    api: Any,
) -> None:
    """The image of a stack, with the build's proxy CA left in /opt as a careless COPY would: a
    variant of the tiny stack (the subject is the leak check and push's refusal; its smoke
    needs a GPU, so `test` runs the static checks alone, as on any machine without one)."""
    name = tiny_variant("tiny-leak", "description: ci-tiny with a planted proxy CA")
    cli_process("build", name)
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    container = api.containers.create(local_ref(name, content_hash))  # not started
    try:
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.add(proxy_ca[0], arcname="leaked-ca.pem")
        container.put_archive("/opt", archive.getvalue())
        container.commit(repository="sm120-stacks", tag=content_tag(name, content_hash))
    finally:
        container.remove(force=True)
    status, report = _test(cli_process, name, models)
    failed = [c["name"] for c in report["checks"] if not c["passed"] and not c["skipped"]]
    assert (status, failed) == (1, ["no_secret_left_in_the_image"])
    detail = {c["name"]: c["detail"] for c in report["checks"]}["no_secret_left_in_the_image"]
    assert "/opt/leaked-ca.pem" in detail
    assert load_record(workspace / "build", name, content_hash).tests == "failed"
    pushed = cli_process("push", name, "--registry", "127.0.0.1:1", check=False)
    assert pushed.returncode == 2 and "failed" in pushed.stderr
