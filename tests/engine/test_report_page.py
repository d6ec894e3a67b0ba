"""`sm120-stacks report STACK` from a real test run: ci-mini's image tested with a short soak and
pushed with its evidence, then its page loaded in a real headless Chromium, which must show the
verdict, the JIT table's row, the smoke's answer, the evidence and a chart that decoded, with
nothing fetched from anywhere. About a minute beside the build (test, soak, push, Chromium)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder.image.registry import Registry
from tests.conftest import REQUIRE_ENGINE
from tests.support import chromium

pytestmark = [
    pytest.mark.engine,
    pytest.mark.needs_ci_mini("a real smoke and soak of transformers serve"),
]

PAGE_FACTS = """JSON.stringify({
  verdict: document.querySelector('#verdict').innerText,
  jit: [...document.querySelectorAll('#jit tr.jit-row')]
    .map(r => [...r.cells].map(c => c.innerText)),
  answers: document.querySelector('#answers').innerText,
  soak: document.querySelector('#soak-verdict').innerText,
  charts: [...document.querySelectorAll('img.chart')]
    .map(i => [i.complete, i.naturalWidth, i.naturalHeight]),
  evidence: [...document.querySelectorAll('table.evidence td:first-child')].map(c => c.innerText),
  body: document.body.innerText,
  fetched: performance.getEntriesByType('resource').map(e => e.name),
})"""


@pytest.fixture(scope="module")
def browser_present() -> None:
    if not chromium.available():
        message = "no chromium here (.ci/run installs Debian's chromium)"
        if REQUIRE_ENGINE:
            pytest.fail(message)
        pytest.skip(message)


def test_the_report_page_shows_a_real_test_run(
    browser_present: None,
    ci_mini: dict[str, str],
    cli_process: Callable[..., Any],
    models: dict[str, Path],
    registry: Registry,
    tmp_path: Path,
) -> None:
    build = ["--build-dir", str(tmp_path / "build")]
    mount = f"{models['trained']}:/models/tiny"
    tested = cli_process(*build, "test", "ci-mini", "--volume", mount, "--soak", "4", "--json")
    assert json.loads(tested.stdout)["passed"]
    # The repository the other engine tests push ci-mini to: its layers are there already (a
    # repository of its own took 4 minutes to receive 3.6 GB here).
    cli_process(*build, "push", "ci-mini", "--registry", registry.host)

    written = cli_process(*build, "report", "ci-mini")
    page = Path(written.stdout.split()[0])
    assert page.name == f"ci-mini-{ci_mini['hash'][:16]}.html" and page.is_file()
    with chromium.browser() as browser:
        session = browser.open(page.as_uri())
        facts = json.loads(browser.evaluate(session, PAGE_FACTS))
    assert facts["verdict"] == "PASSED"
    assert [row[0] for row in facts["jit"]] == ["norm"]
    assert facts["jit"][0][2:5] == ["sm_120f", "2.7 MB", "hit"]
    assert "The capital of Kentucky is Frankfort." in facts["answers"]
    assert facts["soak"].startswith("passed after")
    assert facts["charts"] and all(done and w > 0 and h > 0 for done, w, h in facts["charts"])
    assert {"provenance", "sbom", "verdict"} <= set(facts["evidence"])
    assert "SBOM components: python" in facts["body"]
    assert "no_secret_left_in_the_image" in facts["body"]
    assert "flashinfer_autotune" in facts["body"]  # every compile kind, found or not
    assert facts["fetched"] == []  # self-contained: nothing loaded beside the page
