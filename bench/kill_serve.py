"""The kill sweep's serve slice (issue 34; bench/FAULTS.md "Kill it anywhere", serve slice).

The commands that judge and publish what an image does: `test` of a ci-mini variant (static
checks, JIT table, the CPU smoke against a server container of its own), `smoke --record`
against a deployed ci-mini server (the verdict joins the image's evidence in the registry),
`report` (one HTML page per tested image, with the registry's evidence) and `docs` (README.md's
and docs/'s generated tables, in an export of the repository). Each is run once whole (the
reference), then SIGKILLed (its own pid only, bench/kill_sweep.py's run()) at fractions of the
reference's time and after its Nth printed line, then the command a user runs next (the same
one again), and the invariants are checked:

  half-written   every record, report, lock, pin and memo under the workspace parses; every
                 HTML page ends as a page does; each README/docs file is the old bytes or the new
  unfinished     test: a record says passed only with its whole report, saying passed, beside
                 it; smoke --record: the registry's evidence of the image stays readable whole
                 (`evidence` exits 0), the record names a smoke verdict only the registry holds
  leftovers      after the next command: no temporary file or folder of the killed run (TMPDIR is
                 the workspace's tmp/), no container, volume or network labelled with the killed
                 pid, no process of its session
  next           the next command exits 0, or fails with one error line naming what to do

Writes OUT (default bench/results/kill-sweep/serve/): sweep.jsonl (kill_sweep's Point fields
plus "slice": "serve"), COMMAND-POINT-{killed,next}.txt, COMMAND-reference.txt, setup-*.txt,
table.md. KILL_COMMANDS picks commands (test, smoke, report, docs). Exit 1 on any violation.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kill_state as kst  # (the state slice's checks: half-written, temporaries, next failure)
import kill_sweep as ks  # (the shared helpers: run, save, points, leftovers)

ROOT = ks.ROOT
OUT = Path(os.environ.get("OUT", ROOT / "bench/results/kill-sweep/serve"))
ks.OUT = kst.OUT = OUT
RUN = ks.RUN
REGISTRY = ks.REGISTRY
REPOSITORY = f"{REGISTRY}/sm120-kill-serve-{RUN}"
HOST = f"kill-{RUN}-serve"
MODELS = ROOT / "build/tiny-model"  # `make build/tiny-model`: answers ci-mini's smoke
ks.FRACTIONS = tuple(
    float(f) for f in os.environ.get("KILL_FRACTIONS", "0.1,0.3,0.5,0.7,0.9").split(",")
)
ks.LINE_POINTS = int(os.environ.get("KILL_LINE_POINTS", "4"))

Checks = Callable[[Path, Any, ks.Ran, str], list[str]]


def pages_cut_short(work: Path) -> list[str]:
    """An HTML page the tool wrote that does not end as a page does: written in place, cut."""
    bad = []
    for page in (work / "build").rglob("*.html"):
        if ks.TEMP_NAME.search(page.name):
            continue
        if not page.read_bytes().rstrip().endswith(b"</html>"):
            bad.append(f"half-written {page.relative_to(work)}: no </html> at its end")
    return bad


def sweep(
    command: str,
    work: Path,
    before: Callable[[str], tuple[Any, list[str]]],
    checks: Checks,
    results: list[ks.Point],
) -> None:
    """kill_state's sweep, with the pages checked too and the points marked as this slice's."""
    kst.sweep(command, work, before, checks, results, 900, also=pages_cut_short, slice_name="serve")


def build_variant(work: Path, value: str) -> str:
    hashed = ks.variant(work, value)
    built = ks.run(["build", ks.STACK], work)
    if built.code != 0:
        ks.save(f"setup-build-{value}", built)
        raise SystemExit(f"build of {value} failed: {OUT}/setup-build-{value}.txt")
    return hashed


# --- test ---------------------------------------------------------------------------------------


def verdict_problem(work: Path, hashed: str, when: str) -> list[str]:
    """A record with a test's verdicts has its whole report beside it, saying the same."""
    data = ks.record_of(work, hashed)
    static = data.get("static")
    tested = [s for s in data.get("served") or [] if isinstance(s, dict) and s["source"] == "test"]
    if static is None and not tested:
        return ["the next test recorded no verdict"] if when == "next" else []
    report = Path(str(data.get("report") or ""))
    report = report if report.is_absolute() else work / report
    if not report.is_file():
        return [f"the record ({when}) has a test verdict, and no report at {report}"]
    try:
        said = json.loads(report.read_text())
    except ValueError:
        return [f"the record ({when}) has a test verdict, its report is cut short"]
    found = []
    if static != said.get("verdicts", {}).get("static"):
        found.append(f"the record ({when}) says static {static}, its report otherwise")
    if any(s.get("passed") for s in tested) and not said.get("passed"):
        found.append(f"the record ({when}) says served passed, its report did not pass")
    if when == "next" and not said.get("passed"):
        found.append("the next test did not pass")
    return found


def sweep_test(work: Path, results: list[ks.Point]) -> None:
    """A new variant (an env value: its last layers only) built before each point, so each
    `test` judges an image no run has judged."""

    def before(name: str) -> tuple[str, list[str]]:
        hashed = build_variant(work, f"test-{name}")
        return hashed, ["test", ks.STACK, "--volume", f"{MODELS}:/models/tiny:ro"]

    def checks(work: Path, hashed: str, ran: ks.Ran, when: str) -> list[str]:
        return verdict_problem(work, hashed, when)

    sweep("test", work, before, checks, results)


# --- smoke --record -----------------------------------------------------------------------------


def evidence(work: Path) -> tuple[int, dict[str, Any]]:
    """What `evidence --json` prints of the variant (stdout only), with its exit status."""
    done = subprocess.run(
        [ks.CLI, "evidence", ks.STACK, "--registry", REPOSITORY, "--json"],
        cwd=work,
        env=ks.ENV,
        capture_output=True,
        text=True,
    )
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError:
        return done.returncode, {"stdout": done.stdout[-200:], "stderr": done.stderr[-200:]}


def smoke_verdicts(found: Any) -> list[str]:
    """The `at` of every served verdict from a smoke --url in an evidence or record document."""
    if isinstance(found, dict):
        mine = [str(found.get("at"))] if found.get("source") == "smoke --url" else []
        return mine + [at for value in found.values() for at in smoke_verdicts(value)]
    if isinstance(found, list):
        return [at for value in found for at in smoke_verdicts(value)]
    return []


def wait_serving(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise SystemExit(f"the server at {url} did not answer in {seconds:.0f} s")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def sweep_smoke(work: Path, results: list[ks.Point]) -> None:
    """The pushed variant deployed on this engine (a pin with the tiny model), smoked with
    --record into the variant's repository at each point."""
    hashed = build_variant(work, "smoke")
    ks.mark_tested(work, hashed)
    pushed = ks.run(["push", ks.STACK, "--registry", REPOSITORY], work)
    ks.save("setup-push", pushed)
    if pushed.code != 0:
        raise SystemExit(f"setup push failed: {OUT}/setup-push.txt")
    port = free_port()
    pinned = ks.run(
        [
            *["pin", HOST, ks.STACK, "--gpus", "none", "--registry", REPOSITORY],
            *["--port", f"127.0.0.1:{port}:8000", "--volume", f"{MODELS}:/models/tiny:ro"],
        ],
        work,
    )
    ks.save("setup-pin", pinned)
    deployed = ks.run(["deploy", HOST, "--apply"], work)
    ks.save("setup-deploy", deployed)
    if pinned.code != 0 or deployed.code != 0:
        raise SystemExit(f"setup pin/deploy failed: {OUT}/setup-pin.txt, setup-deploy.txt")
    url = f"http://127.0.0.1:{port}"
    wait_serving(url, 240)
    args = ["smoke", ks.STACK, "--url", url, "--record", "--registry", REPOSITORY]

    def before(name: str) -> tuple[str, list[str]]:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()), args

    def checks(work: Path, began: str, ran: ks.Ran, when: str) -> list[str]:
        code, held = evidence(work)
        if code != 0:
            return [f"evidence ({when}) exit {code}: {str(held)[:160]}"]
        in_registry = set(smoke_verdicts(held))
        in_record = set(smoke_verdicts(ks.record_of(work, hashed)))
        found = [
            f"the record names a smoke verdict of {at} the registry does not hold"
            for at in sorted(in_record - in_registry)
            if at >= began
        ]
        if when == "next" and not any(at >= began for at in in_registry):
            found.append("the next smoke --record added no verdict to the evidence")
        return found

    sweep("smoke", work, before, checks, results)


# --- report -------------------------------------------------------------------------------------


def sweep_report(work: Path, results: list[ks.Point]) -> None:
    """Pages of every tested image of the variant (the test sweep's and smoke's), each point's
    pages removed first so each run writes them all."""
    pages = work / "build" / ks.STACK / "reports"

    def before(name: str) -> tuple[None, list[str]]:
        for page in pages.glob("*.html"):
            page.unlink()
        return None, ["report", ks.STACK]

    def checks(work: Path, state: None, ran: ks.Ran, when: str) -> list[str]:
        if when == "next" and not list(pages.glob("*.html")):
            return ["no page after the next report"]
        return []

    sweep("report", work, before, checks, results)


# --- docs ---------------------------------------------------------------------------------------


def export(into: Path) -> Path:
    """The committed tree (git archive), where `docs` writes README.md and docs/."""
    tree = into / "repo"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    (tree / "build").mkdir(exist_ok=True)
    for sub in ("tmp", "cache", "hosts"):
        (tree / sub).mkdir(exist_ok=True)
    return tree


def docs_files(tree: Path) -> dict[str, str]:
    found = [tree / "README.md", *(tree / "docs").rglob("*.md")]
    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest() for p in found}


def sweep_docs(results: list[ks.Point], parent: Path) -> None:
    """A stack manifest added before every other point and removed before the rest, so each
    `docs` rewrites the stacks table: each file is then the old bytes or the new."""
    tree = export(parent)
    ks.ENV["PYTHONPATH"] = str(tree)  # the export's builder: its REPO_ROOT is the export
    extra = tree / "stacks" / f"{ks.STACK}-docs.yaml"
    count = [0]

    def before(name: str) -> tuple[dict[str, dict[str, str]], list[str]]:
        count[0] += 1
        if count[0] % 2:
            extra.write_text("extends: ci-mini\nstatus: experimental\n")
        else:
            extra.unlink(missing_ok=True)
        return {"old": docs_files(tree)}, ["docs"]

    def checks(work: Path, state: dict[str, dict[str, str]], ran: ks.Ran, when: str) -> list[str]:
        now = docs_files(work)
        if when == "killed":
            state["killed"] = now
            return []
        found = []
        for path, digest in state["killed"].items():
            if digest not in (state["old"].get(path), now.get(path)):
                found.append(f"{path} after the kill is neither the old bytes nor the new")
        if now == state["old"]:
            found.append("the next docs changed nothing")
        return found

    try:
        sweep("docs", tree, before, checks, results)
    finally:
        ks.ENV.pop("PYTHONPATH", None)


# --- the run ------------------------------------------------------------------------------------


def main() -> int:
    if "--table" not in sys.argv:
        OUT.mkdir(parents=True, exist_ok=True)
        for old in OUT.glob("*"):
            if old.is_file():
                old.unlink()
        only = set(os.environ.get("KILL_COMMANDS", "test,smoke,report,docs").split(","))
        work, results = kst.workspace("serve"), []
        began = time.monotonic()
        print(f"run {RUN}: workspace {work}, registry {REPOSITORY}", flush=True)
        try:
            if "test" in only:
                sweep_test(work, results)
            if "smoke" in only:
                sweep_smoke(work, results)
            if "report" in only:
                sweep_report(work, results)
            if "docs" in only:
                sweep_docs(results, work)
        finally:
            ks.cleanup(work, HOST, f"sm120-kill-serve-{RUN}")
        header = f"run {RUN}, {time.monotonic() - began:.0f} s"
    else:
        header = "judged from sweep.jsonl"
    lines = [json.loads(line) for line in (OUT / "sweep.jsonl").read_text().splitlines()]
    points = [ks.Point(**{k: v for k, v in line.items() if k != "slice"}) for line in lines]
    text = ks.table(points)
    (OUT / "table.md").write_text(f"{header}\n\n{text}")
    print(text)
    return 1 if any(p.violations for p in points) else 0


if __name__ == "__main__":
    sys.exit(main())
