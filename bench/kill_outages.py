"""The kill sweep with the registry or the engine killed (issue 34 item 2; bench/FAULTS.md
"Kill it anywhere").

bench/kill_sweep.py kills the tool; this kills what the tool talks to, at the same kinds of
points (fractions of the command's reference run, and right after its Nth printed line), while
the tool runs on:

  registry  a docker-registry of this run's own (its own loopback port and data folder; the
            shared :5000 is never touched), SIGKILLed and started again on the same data once
            the command has ended, for `push`, `pull` into a fresh build folder, `pin` from the
            registry's evidence (a folder with no record) and `evidence`;
  engine    a private dockerd in its own network namespace (scripts/fleet-netns.sh, fleet
            sm120-outage, net 10.236), SIGKILLed and started again on the same data as systemd
            would (`fleet-netns.sh restart-engine 1 KILL`), for `build`, `push` (to this run's
            registry), `test` and `deploy --apply`; the tool runs inside that namespace.

After each point the same command runs again (what a user does next) and the invariants are
checked (kill_sweep's, plus):

  failed-said  a command that failed printed one `error:`/`failed:` line and no traceback;
  next         the next command exits 0;
  pushed       no record names a push whose manifest and whole evidence (verdict, SBOM,
               provenance: manifests and blobs) the registry lacks; no moving tag over an
               image without its whole evidence;
  pin-accepts  after the point, `pin` in a folder with no record (so it reads the registry's
               evidence) succeeds exactly when that evidence is whole;
  unfinished   no image tagged, and no record saying built or tested, by a run that failed;
  leftovers    after the next command no container, volume or network of the first run (its
               owner label) on the engine it used, no process of its session.

Writes OUT (default bench/results/kill-sweep/outages/): sweep.jsonl (kill_sweep's Point
fields, "killed_before_end" for its bool, plus "slice": "outages" and "killed": "registry" or
"engine"), COMMAND-POINT-{killed,next}.txt per point, table.md and FAULTS-section.md. Exit 1 on
any violation. Root only (namespaces). The fleet goes down at the end, on failure too.

  OUTAGE_PARTS=registry,engine  OUTAGE_COMMANDS=push,pull,pin,evidence,build,test,deploy
  KILL_FRACTIONS / KILL_LINE_POINTS (kill_sweep's), ENGINE_FRACTIONS / ENGINE_LINE_POINTS
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("OUT", str(ROOT / "bench/results/kill-sweep/outages"))
os.environ.setdefault("RUN_ID", "o" + os.urandom(2).hex())
PORT = int(os.environ.get("OUTAGE_REGISTRY_PORT") or _free_port())
os.environ["KILL_REGISTRY"] = f"127.0.0.1:{PORT}"  # kill_sweep.manifest_served asks ours
sys.path.insert(0, str(ROOT / "bench"))

import kill_sweep as ks  # noqa: E402  (after the environment it reads at import)
from kill_sweep import Point, Ran  # noqa: E402

OUT = ks.OUT
RUN = ks.RUN
STACK = ks.STACK
REGISTRY = ks.REGISTRY
BASE = "local/cuda:13.0.2-devel-bookworm"
MIRROR = f"{REGISTRY}/outage-base/cuda:13.0.2-devel-bookworm"
# Every command of both parts builds FROM the copy in this run's registry: one content hash for
# the shared engine and the private one (whose only way to the base is that registry).
os.environ["SM120_STACKS_BASE_SUBSTITUTE"] = f"{BASE}={MIRROR}"
ks.ENV["SM120_STACKS_BASE_SUBSTITUTE"] = f"{BASE}={MIRROR}"  # kill_sweep.run's commands too
ENV = ks.ENV
#: OUTAGE_FLEET_NAME / OUTAGE_FLEET_NET: a second fleet beside a run still going (a re-run).
FLEET_NAME = os.environ.get("OUTAGE_FLEET_NAME", "sm120-outage")
FLEET = {
    **os.environ,
    "SM120_FLEET_NAME": FLEET_NAME,
    "SM120_FLEET_NET": os.environ.get("OUTAGE_FLEET_NET", "236"),
    "SM120_FLEET_REGISTRY_PORT": str(PORT),
}
NS = f"/run/netns/{FLEET_NAME}-h1"
SOCK = f"/run/{FLEET_NAME}/h1/docker.sock"
ENGINE = f"unix://{SOCK}"
IN_NS = ["nsenter", f"--net={NS}", "env", f"DOCKER_HOST={ENGINE}"]
MODELS = ROOT / "build/tiny-model"
REPO = "sm120-stacks"
VERDICT = "application/vnd.sm120-stacks.verdict.v1+json"
SBOM = "application/vnd.cyclonedx+json"
PROVENANCE = "application/vnd.in-toto+json"
MANIFESTS = ",".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)
SLICE_LOG: list[dict[str, object]] = []
#: Each invocation's point repositories are new even in a kept registry (OUTAGE_REGISTRY_HOME).
NONCE = os.urandom(2).hex()


def fractions(name: str, default: str) -> tuple[float, ...]:
    return tuple(float(f) for f in os.environ.get(name, default).split(","))


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- what gets killed ---------------------------------------------------------------------


class OwnRegistry:
    """docker-registry on 127.0.0.1:PORT with its own data folder (as scripts/host-setup.sh
    writes its config: filesystem storage, deletes enabled)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.data = home / "data"
        self.config = home / "registry.yml"
        self.proc: subprocess.Popen[bytes] | None = None
        self.data.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {self.data}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {REGISTRY}\n"
        )

    def start(self) -> None:
        log = (self.home / "registry.log").open("ab")
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(self.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ["PATH"]},
            start_new_session=True,
        )
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"registry on {REGISTRY} did not answer: {self.home}/registry.log")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def recover(self) -> None:
        self.start()

    def stop(self) -> None:
        self.kill()


class PrivateEngine:
    """Host 1 of fleet sm120-outage: SIGKILL, then started again on the same data."""

    def kill(self) -> None:
        done = subprocess.run(
            [str(ROOT / "scripts/fleet-netns.sh"), "restart-engine", "1", "KILL"],
            env=FLEET,
            capture_output=True,
            text=True,
        )
        with (OUT / "engine-restarts.txt").open("a") as log:
            log.write(f"[{time.strftime('%H:%M:%S')}] exit {done.returncode}\n{done.stderr}")

    def recover(self) -> None:
        pass  # restart-engine started it again


# --- running a command while its service dies -----------------------------------------------


def run_outage(
    args: list[str],
    work: Path,
    service: OwnRegistry | PrivateEngine | None,
    kill_at: float | None = None,
    kill_after_line: int | None = None,
    in_ns: bool = False,
    timeout: float = 600,
) -> tuple[Ran, bool]:
    """Run the tool in WORK; kill SERVICE at KILL_AT seconds or after KILL_AFTER_LINE lines
    (the tool runs on). Returns the run and whether the kill landed before the tool's end."""
    began = time.monotonic()
    proc = subprocess.Popen(
        [*(IN_NS if in_ns else []), ks.CLI, *args],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=ENV,
        text=True,
        start_new_session=True,
    )
    ran = Ran(None, 0.0, [], proc.pid)
    landed = threading.Event()
    killers: list[threading.Thread] = []
    lock = threading.Lock()

    def kill() -> None:
        with lock:
            if killers or service is None or proc.poll() is not None:
                return
            landed.set()
            killer = threading.Thread(target=service.kill)
            killers.append(killer)
            killer.start()

    timer = threading.Timer(kill_at, kill) if kill_at is not None else None
    if timer:
        timer.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        ran.lines.append(line)
        if kill_after_line is not None and len(ran.lines) == kill_after_line:
            kill()
    try:
        ran.code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        ran.code = proc.wait()
        ran.lines.append(f"[outage bench: the tool hung past {timeout:.0f} s and was killed]\n")
    if timer:
        timer.cancel()
    with lock:
        for killer in killers:
            killer.join()
        if killers and service is not None:
            service.recover()
    ran.seconds = time.monotonic() - began
    return ran, landed.is_set()


def said_failure(ran: Ran, which: str) -> list[str]:
    """A failed command says one error:/failed: line and shows no traceback."""
    if ran.code == 0:
        return []
    text = "".join(ran.lines)
    found = []
    if "Traceback (most recent call last)" in text:
        found.append(f"{which} command printed a traceback")
    said = [line for line in ran.lines if line.startswith(("error:", "failed:"))]
    if len(said) != 1:
        found.append(
            f"{which} command exit {ran.code} with {len(said)} error lines: "
            f"{''.join(ran.lines[-3:]).strip()[:200]}"
        )
    if "hung past" in text:
        found.append(f"{which} command hung")
    if said and not _names_what_to_do(ran.lines[ran.lines.index(said[0]) :]):
        found.append(f"{which} command's message names nothing to do: {said[0].strip()[:160]}")
    return found


#: Words of a message that tells the user what to do next (a hint, a command, again).
_TO_DO = re.compile(
    r"(?<![/\w.-])(again|hint|start|run|fix|check|free|install|set|pass|raise|wait|retry|remove"
    r"|login)\b",
    re.IGNORECASE,
)


def _names_what_to_do(lines: list[str]) -> bool:
    return bool(_TO_DO.search("".join(line for line in lines if not line.startswith("[exit"))))


# --- what the registry holds ----------------------------------------------------------------


def _get(path: str, accept: str = MANIFESTS) -> tuple[dict[str, object], str] | None:
    request = urllib.request.Request(f"http://{REGISTRY}/v2/{path}", headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read()), answer.headers.get("Docker-Content-Digest", "")
    except (OSError, ValueError):
        return None


def _blob_served(repo: str, digest: str) -> bool:
    request = urllib.request.Request(f"http://{REGISTRY}/v2/{repo}/blobs/{digest}", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=10):
            return True
    except OSError:
        return False


def evidence_whole(repo: str, reference: str) -> tuple[bool, str]:
    """Whether REPO (host-less) serves REFERENCE's manifest, and a verdict, an SBOM and a
    provenance naming it, each manifest and blob there (the referrers tag: docker-registry has
    no referrers API). Read over plain HTTP here, not by the tool's own code."""
    got = _get(f"{repo}/manifests/{reference}")
    if got is None:
        return False, "no manifest"
    _, digest = got
    if not digest:
        return False, "no digest header"
    index = _get(f"{repo}/manifests/sha256-{digest.split(':', 1)[1]}")
    if index is None:
        return False, "no referrers index"
    kinds = set()
    for entry in index[0].get("manifests") or []:  # type: ignore[union-attr]
        assert isinstance(entry, dict)
        artifact = _get(f"{repo}/manifests/{entry['digest']}")
        if artifact is None:
            return False, f"artifact {entry['digest'][:19]} not served"
        manifest = artifact[0]
        layers = manifest.get("layers") or []
        assert isinstance(layers, list)
        if not all(_blob_served(repo, layer["digest"]) for layer in layers):
            return False, f"a blob of artifact {entry['digest'][:19]} not served"
        subject = manifest.get("subject") or {}
        assert isinstance(subject, dict)
        if subject.get("digest") == digest:
            kinds.add(manifest.get("artifactType") or entry.get("artifactType"))
    wanted = (("verdict", VERDICT), ("SBOM", SBOM), ("provenance", PROVENANCE))
    missing = [name for name, kind in wanted if kind not in kinds]
    return (not missing), ("whole" if not missing else "no " + ", ".join(missing))


def tags_in(repo: str) -> list[str]:
    got = _get(f"{repo}/tags/list", accept="application/json")
    return list((got[0].get("tags") or []) if got else [])  # type: ignore[arg-type]


def pushed_checks(work: Path, hashed: str, target: str) -> list[str]:
    """The record names no push whose manifest and evidence are not whole; no moving tag over
    an image whose evidence is not whole."""
    found = []
    pushed = ks.record_of(work, hashed).get("pushed") or {}
    assert isinstance(pushed, dict)
    for repo, ref in pushed.items():
        if not repo.startswith(REGISTRY + "/"):
            continue
        digest = str(ref).rsplit("@", 1)[-1]
        whole, why = evidence_whole(repo.split("/", 1)[1], digest)
        if not whole:
            found.append(f"record names a push whose registry copy is not whole ({why}): {ref}")
    repo = f"{target.split('/', 1)[1]}/{REPO}"
    if STACK in tags_in(repo):
        whole, why = evidence_whole(repo, STACK)
        if not whole:
            found.append(f"moving tag {STACK} over an image whose evidence is not whole ({why})")
    return found


def pin_accepts(target: str, stacks: Path, label: str) -> list[str]:
    """`pin` in a folder with no record reads the registry's evidence: it must succeed exactly
    when the content tag's evidence is whole."""
    fresh = fresh_folder(stacks)
    try:
        hashed = content_hash(fresh)
        tag = f"{STACK}-{hashed[:16]}"
        whole, why = evidence_whole(f"{target.split('/', 1)[1]}/{REPO}", tag)
        pinned = ks.run(ks.pin_args(target, MODELS, 18000, label), fresh)
        ks.save(f"{label}-pincheck", pinned)
        if pinned.code == 0 and not whole:
            return [f"pin accepted {tag} whose evidence is not whole ({why})"]
        if pinned.code != 0 and whole:
            return [f"pin refused {tag} whose evidence is whole: {''.join(pinned.lines)[-160:]}"]
        return said_failure(pinned, "the pin check's") if pinned.code else []
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


# --- the engines' state ---------------------------------------------------------------------


def content_hash(work: Path) -> str:
    """kill_sweep.content_hash with this run's base substitution (the CLI's, from the env)."""
    from builder.manifest.resolve import resolve
    from builder.manifest.substitute import Substitutions
    from builder.render.context import render

    substitutions = Substitutions.parse((ENV["SM120_STACKS_BASE_SUBSTITUTE"],))
    return render(resolve(STACK, work / "stacks", substitutions)).content_hash()


def variant(work: Path, value: str) -> str:
    (work / "stacks" / f"{STACK}.yaml").write_text(
        f'extends: ci-mini\nenv: {{KILL_SWEEP: "{value}"}}\n'
    )
    return content_hash(work)


def docker(engine: str | None, *args: str) -> str:
    prefix = ["docker", "-H", engine] if engine else ["docker"]
    return subprocess.run([*prefix, *args], capture_output=True, text=True).stdout


def leftovers(engine: str | None, pid: int) -> list[str]:
    found = []
    for kind, fmt in (
        ("ps -a", "{{.Names}} {{.Labels}}"),
        ("volume ls", "{{.Name}} {{.Labels}}"),
        ("network ls", "{{.Name}} {{.Labels}}"),
    ):
        for line in docker(engine, *kind.split(), "--format", fmt).splitlines():
            if re.search(rf"sm120-stacks\.owner=[^,]*:{pid}(@|,|$|\s)", line):
                found.append(f"{kind.split()[0]} {line.split()[0]} of the first run left")
    return found


def content_tags(engine: str | None, hashed: str) -> list[str]:
    listed = docker(engine, "images", "--format", "{{.Repository}}:{{.Tag}}").split()
    return [t for t in listed if hashed[:16] in t]


def set_untested(work: Path, hashed: str) -> None:
    from builder.image.records import load_record, save_record

    record = load_record(work / "build", STACK, hashed)
    record.static = None
    record.served = []
    record.unserved = None
    save_record(work / "build", record)


def mark_tested(work: Path, hashed: str) -> None:
    """kill_sweep.mark_tested's verdicts (a passing static check and a CPU served verdict)."""
    from builder.image.records import ServedVerdict, load_record, save_record

    record = load_record(work / "build", STACK, hashed)
    record.static = "passed"
    record.served = [
        ServedVerdict(
            gpu_kind="cpu",
            gpu_count=1,
            capability="",
            driver="",
            cuda="",
            model_id="/models/tiny",
            serve_args=["transformers", "serve"],
            passed=True,
            source="test",
            at="2026-12-02T00:00:00Z",
        )
    ]
    save_record(work / "build", record)


# --- the sweep ------------------------------------------------------------------------------

Before = Callable[[str], tuple[object, list[str], Path]]
Checks = Callable[[Path, object, Ran, str], list[str]]


def sweep(
    killed: str,
    command: str,
    service: OwnRegistry | PrivateEngine,
    before: Before,
    checks: Checks,
    results: list[Point],
    in_ns: bool = False,
    engine: str | None = None,
    spread: tuple[float, ...] = (),
    line_points: int = 4,
) -> None:
    """The reference run, then per point: the command with SERVICE killed, the same command
    again, the invariants. BEFORE(point) -> (state, args, folder); CHECKS(folder, state, ran,
    'killed'|'next') -> the command's own violations."""
    _, args, work = before("ref")
    reference, _ = run_outage(args, work, None, in_ns=in_ns)
    ks.save(f"{killed}-{command}-reference", reference)
    if reference.code != 0:
        raise SystemExit(
            f"{command}: the reference run failed: {OUT}/{killed}-{command}-reference.txt"
        )
    say(f"{killed} {command}: reference {reference.seconds:.1f} s, {len(reference.lines)} lines")
    count = len(reference.lines)
    lines = sorted({max(1, round(count * (i + 1) / (line_points + 1))) for i in range(line_points)})
    kill_points = [(f"t{f:.2f}", reference.seconds * f, None) for f in spread]
    kill_points += [(f"line{n}of{count}", None, n) for n in lines if n < count]
    for name, at, after in kill_points:
        state, args, work = before(name)
        first, landed = run_outage(args, work, service, at, after, in_ns=in_ns)
        ks.save(f"{killed}-{command}-{name}-killed", first)
        violations = ks.half_written(work) + said_failure(first, "the killed")
        violations += checks(work, state, first, "killed")
        following, _ = run_outage(args, work, None, in_ns=in_ns)
        ks.save(f"{killed}-{command}-{name}-next", following)
        if following.code != 0:
            violations.append(
                f"the next command exit {following.code}: "
                f"{''.join(following.lines[-2:]).strip()[:200]}"
            )
        violations += said_failure(following, "the next") + ks.half_written(work)
        violations += [f"temporary file left: {t}" for t in ks.temp_files(work)]
        violations += leftovers(engine, first.pid) + ks.live_processes(first.pid, work)
        violations += checks(work, state, following, "next")
        point = Point(command, name, landed, round(first.seconds, 1), following.code, violations)
        results.append(point)
        row = asdict(point)
        row["killed_before_end"] = row.pop("killed")
        row |= {"slice": "outages", "killed": killed, "first_code": first.code}
        SLICE_LOG.append(row)
        with (OUT / "sweep.jsonl").open("a") as out:
            out.write(json.dumps(row) + "\n")
        say(
            f"  {killed} {command} {name:14} landed={landed!s:5} first exit {first.code} "
            f"at {first.seconds:5.1f} s  next exit {following.code}  "
            f"violations {len(violations)} {violations[:2]}"
        )
        for temp in ks.temp_files(work):
            (work / temp).unlink(missing_ok=True)


def fresh_folder(stacks: Path) -> Path:
    work = Path(tempfile.mkdtemp(prefix="sm120-outage-fresh."))
    shutil.copytree(stacks, work / "stacks")
    (work / "build").mkdir()
    (work / "build/wheels").symlink_to(ROOT / "build/wheels")
    (work / "patches").symlink_to(ROOT / "patches")
    return work


def registry_part(
    reg: OwnRegistry, work: Path, hashed: str, only: set[str], results: list[Point]
) -> str:
    spread = fractions("KILL_FRACTIONS", "0.05,0.25,0.5,0.75,0.95")
    lines = int(os.environ.get("KILL_LINE_POINTS", "4"))
    # The layers go up once here: each point's push then sends its manifests and evidence for
    # real and mounts the layers, as the reference does.
    target = f"{REGISTRY}/outage-{RUN}-pinned"
    pushed = ks.run(["push", STACK, "--registry", target], work)
    ks.save("registry-setup-push", pushed)
    if pushed.code != 0:
        raise SystemExit(f"setup push failed: {OUT}/registry-setup-push.txt")
    count = [0]
    if "push" in only:

        def before_push(name: str) -> tuple[object, list[str], Path]:
            count[0] += 1
            target = f"{REGISTRY}/outage-{RUN}-{NONCE}-{count[0]}"
            return target, ["push", STACK, "--registry", target], work

        def check_push(work: Path, target: object, ran: Ran, when: str) -> list[str]:
            assert isinstance(target, str)
            found = pushed_checks(work, hashed, target)
            found += pin_accepts(target, work / "stacks", f"registry-push-{count[0]}-{when}")
            pushed = ks.record_of(work, hashed).get("pushed") or {}
            assert isinstance(pushed, dict)
            if when == "next" and not any(r.startswith(target + "/") for r in pushed):
                found.append("the next push recorded nothing")
            return found

        sweep(
            "registry",
            "push",
            reg,
            before_push,
            check_push,
            results,
            spread=spread,
            line_points=lines,
        )
    folders: list[Path] = []
    if "pull" in only:

        def before_pull(name: str) -> tuple[object, list[str], Path]:
            folder = fresh_folder(work / "stacks")
            folders.append(folder)
            return folder, ["pull", STACK, "--registry", target], folder

        def check_pull(folder: Path, _: object, ran: Ran, when: str) -> list[str]:
            record = ks.record_of(folder, hashed)
            if ran.code != 0 and when == "killed" and record.get("static") == "passed":
                whole, why = evidence_whole(f"{target.split('/', 1)[1]}/{REPO}", STACK)
                if not whole:
                    return [
                        f"a failed pull recorded verdicts over evidence that is not whole ({why})"
                    ]
            if when == "next" and record.get("static") != "passed":
                return ["the next pull recorded no passing verdict"]
            return []

        sweep(
            "registry",
            "pull",
            reg,
            before_pull,
            check_pull,
            results,
            spread=spread,
            line_points=lines,
        )
    if "pin" in only:

        def before_pin(name: str) -> tuple[object, list[str], Path]:
            folder = fresh_folder(work / "stacks")  # no record: pin reads the registry
            folders.append(folder)
            return (folder, name), ks.pin_args(target, MODELS, 18001, f"pin-{name}"), folder

        def check_pin(folder: Path, state: object, ran: Ran, when: str) -> list[str]:
            pin = folder / "hosts" / f"{ks.HOST}.yaml"
            assert isinstance(state, tuple)
            written = pin.is_file() and f"KILL_POINT: pin-{state[1]}" in pin.read_text()
            if when == "killed" and ran.code != 0 and written:
                return ["a pin that failed wrote the pin"]
            if when == "next" and not written:
                return ["the next pin did not write the pin"]
            return []

        sweep(
            "registry", "pin", reg, before_pin, check_pin, results, spread=spread, line_points=lines
        )
    if "evidence" in only:

        def listing(folder: Path) -> dict[str, float]:
            return {
                str(p.relative_to(folder)): p.stat().st_mtime
                for p in folder.rglob("*")
                if p.is_file() and "wheels" not in p.parts
            }

        def before_evidence(name: str) -> tuple[object, list[str], Path]:
            return listing(work), ["evidence", STACK, "--registry", target], work

        def check_evidence(folder: Path, state: object, ran: Ran, when: str) -> list[str]:
            found = []
            assert isinstance(state, dict)
            changed = [p for p, m in listing(folder).items() if state.get(p) != m]
            changed = [p for p in changed if not p.startswith("build/kill-") or "logs" not in p]
            if changed and ran.code != 0:
                found.append(f"a failed evidence changed files: {changed[:3]}")
            if when == "next" and not any("static: passed" in line for line in ran.lines):
                found.append("the next evidence showed no verdict")
            return found

        sweep(
            "registry",
            "evidence",
            reg,
            before_evidence,
            check_evidence,
            results,
            spread=spread,
            line_points=lines,
        )
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    return target


def fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "scripts/fleet-netns.sh"), *args], env=FLEET, capture_output=True, text=True
    )


def engine_part(reg: OwnRegistry, target: str, only: set[str], results: list[Point]) -> None:
    spread = fractions("ENGINE_FRACTIONS", "0.1,0.4,0.7")
    lines = int(os.environ.get("ENGINE_LINE_POINTS", "2"))
    eng = PrivateEngine()
    up = fleet("up", "1")
    (OUT / "engine-fleet-up.txt").write_text(up.stdout + up.stderr)
    if up.returncode != 0:
        raise SystemExit(f"fleet up failed: {OUT}/engine-fleet-up.txt")
    work = ks.workspace()
    try:
        shutil.copy(ROOT / "stacks/ci-mini.yaml", work / "stacks")
        cache = ["--cache-from-registry", target]
        hashed = variant(work, "engine-pushed")
        warm, _ = run_outage(["build", STACK, *cache], work, None, in_ns=True)
        ks.save("engine-setup-build", warm)
        if warm.code != 0:
            raise SystemExit(
                f"the private engine's first build failed: {OUT}/engine-setup-build.txt"
            )
        if "build" in only:

            def before_build(name: str) -> tuple[object, list[str], Path]:
                return variant(work, f"engine-build-{name}"), ["build", STACK, *cache], work

            def check_build(work: Path, hashed: object, ran: Ran, when: str) -> list[str]:
                assert isinstance(hashed, str)
                tags = content_tags(ENGINE, hashed)
                if when == "next":
                    return [] if tags else ["the next build tagged nothing"]
                if ran.code != 0 and tags:
                    return [f"tagged by the failed build: {tags}"]
                if ran.code != 0 and ks.record_of(work, hashed).get("image_id"):
                    return ["recorded as built by the failed build"]
                return []

            sweep(
                "engine",
                "build",
                eng,
                before_build,
                check_build,
                results,
                in_ns=True,
                engine=ENGINE,
                spread=spread,
                line_points=lines,
            )
        hashed = variant(work, "engine-pushed")
        mark_tested(work, hashed)
        count = [0]
        if "push" in only:
            # The layers go up from this engine once, so that the reference and each point
            # send manifests and evidence and mount the layers (as in the registry part).
            warm, _ = run_outage(
                ["push", STACK, "--registry", f"{REGISTRY}/outage-{RUN}-{NONCE}-engine-0"],
                work,
                None,
                in_ns=True,
            )
            ks.save("engine-setup-push", warm)

            def before_push(name: str) -> tuple[object, list[str], Path]:
                count[0] += 1
                target = f"{REGISTRY}/outage-{RUN}-{NONCE}-engine-{count[0]}"
                return target, ["push", STACK, "--registry", target], work

            def check_push(work: Path, target: object, ran: Ran, when: str) -> list[str]:
                assert isinstance(target, str)
                found = pushed_checks(work, hashed, target)
                found += pin_accepts(target, work / "stacks", f"engine-push-{count[0]}-{when}")
                pushed = ks.record_of(work, hashed).get("pushed") or {}
                assert isinstance(pushed, dict)
                if when == "next" and not any(r.startswith(target + "/") for r in pushed):
                    found.append("the next push recorded nothing")
                return found

            sweep(
                "engine",
                "push",
                eng,
                before_push,
                check_push,
                results,
                in_ns=True,
                engine=ENGINE,
                spread=spread,
                line_points=lines,
            )
        if "test" in only:
            tested = variant(work, "engine-tested")
            built, _ = run_outage(["build", STACK, *cache], work, None, in_ns=True)
            ks.save("engine-setup-build-tested", built)

            def before_test(name: str) -> tuple[object, list[str], Path]:
                set_untested(work, tested)
                return None, ["test", STACK, "--volume", f"{MODELS}:/models/tiny:ro"], work

            def check_test(work: Path, _: object, ran: Ran, when: str) -> list[str]:
                static = ks.record_of(work, tested).get("static")
                if when == "killed" and ran.code != 0 and static == "passed":
                    served = ks.record_of(work, tested).get("served") or []
                    if served:
                        return ["a failed test recorded verdicts as passed"]
                if when == "next" and static != "passed":
                    return ["the next test recorded no passing verdict"]
                return []

            sweep(
                "engine",
                "test",
                eng,
                before_test,
                check_test,
                results,
                in_ns=True,
                engine=ENGINE,
                spread=spread,
                line_points=lines,
            )
        if "deploy" in only:
            variant(work, "engine-pushed")
            deploy_target = f"{REGISTRY}/outage-{RUN}-{NONCE}-engine-deploy"
            pushed, _ = run_outage(
                ["push", STACK, "--registry", deploy_target], work, None, in_ns=True
            )
            ks.save("engine-setup-push-deploy", pushed)
            port = _free_port()

            def before_deploy(name: str) -> tuple[object, list[str], Path]:
                pinned, _ = run_outage(
                    ks.pin_args(deploy_target, MODELS, port, f"deploy-{name}"),
                    work,
                    None,
                    in_ns=True,
                )
                if pinned.code != 0:
                    raise SystemExit(
                        f"the pin before deploy {name} failed: {''.join(pinned.lines)}"
                    )
                return name, ["deploy", ks.HOST, "--apply"], work

            def check_deploy(work: Path, name: object, ran: Ran, when: str) -> list[str]:
                if when != "next":
                    return []
                listed = docker(
                    ENGINE,
                    "ps",
                    "-a",
                    "--filter",
                    f"label=sm120-stacks.host={ks.HOST}",
                    "--format",
                    "{{.Names}} {{.State}}",
                )
                found = (
                    []
                    if len(listed.splitlines()) == 1
                    else [f"containers of the host after the next deploy: {listed!r}"]
                )
                env = docker(
                    ENGINE, "inspect", f"sm120-stacks-{ks.HOST}", "--format", "{{json .Config.Env}}"
                )
                if f"KILL_POINT=deploy-{name}" not in env:
                    found.append("the container does not run the pin after the next deploy")
                return found

            sweep(
                "engine",
                "deploy",
                eng,
                before_deploy,
                check_deploy,
                results,
                in_ns=True,
                engine=ENGINE,
                spread=spread,
                line_points=lines,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _row(label: str, mine: list[dict[str, object]]) -> str:
    landed = sum(bool(r["killed_before_end"]) for r in mine)
    failed = sum(r["first_code"] != 0 for r in mine)
    next_ok = sum(r["next_code"] == 0 for r in mine)
    violations = sum(len(r["violations"]) for r in mine)  # type: ignore[arg-type]
    return f"| {label} | {len(mine)} | {landed} | {failed} | {next_ok} | {violations} |"


def table(rows: list[dict[str, object]]) -> str:
    head = [
        "| killed | command | kill points | kill landed before its end | killed command failed "
        "| next command exit 0 | violations |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = dict.fromkeys((str(r["killed"]), str(r["command"])) for r in rows)
    for killed, command in keys:
        mine = [r for r in rows if r["killed"] == killed and r["command"] == command]
        head.append(_row(f"{killed} | `{command}`", mine))
    head.append(_row("all |", rows))
    found = [
        f"- {r['killed']} killed, {r['command']} {r['point']}: {v}"
        for r in rows
        for v in r["violations"]  # type: ignore[attr-defined]
    ]
    return "\n".join(head) + "\n\n" + ("\n".join(found) if found else "no violations") + "\n"


def section(took: str, text: str) -> str:
    return f"""### The registry or the engine killed (`bench/kill_outages.py`; issue 34 item 2)

What the tool talks to, killed while the tool runs on, at points spread over a reference run of
the same command (by time: its fractions; and right after its Nth printed line), then the same
command again and the invariants checked. **registry**: a docker-registry of the run's own (own
loopback port and data folder), SIGKILLed and started again on the same data once the command
ended; `push` (a new repository per point), `pull` into a fresh build folder, `pin` from the
registry's evidence (a folder with no record), `evidence`. **engine**: a private dockerd in its
own network namespace (`scripts/fleet-netns.sh`, fleet sm120-outage), SIGKILLed and started
again at once on the same data (`restart-engine 1 KILL`); `build` (a ci-mini variant: an env
value), `push` (to the run's registry), `test`, `deploy --apply`; the tool inside the namespace.
Invariants, beside kill_sweep's (no half-written file, no temporary file, no container, volume,
network or process of the first run after the next command): a command that failed says one
`error:`/`failed:` line and no traceback; the next command exits 0; no record names a push whose
manifest and whole evidence (verdict, SBOM, provenance: each manifest and blob, read over plain
HTTP) the registry lacks, and no moving tag over an image without it; after each push point a
`pin` in a folder with no record succeeds exactly when the content tag's evidence is whole; no
image tagged, and no record of built or passed, by a run that failed. {took} (raw:
`bench/results/kill-sweep/outages/`: `sweep.jsonl`, `KILLED-COMMAND-POINT-{{killed,next}}.txt`,
`*-pincheck.txt`, `engine-restarts.txt`).

{text}"""


def rejudge() -> int:
    """Judge a finished run's raw output again by said_failure (a check added after it ran):
    each row's violations gain what the check finds in its killed and next output, marked
    (judged again); table.md and FAULTS-section.md are written anew."""
    rows = [json.loads(line) for line in (OUT / "sweep.jsonl").read_text().splitlines()]
    for row in rows:
        for which, part in (("the killed", "killed"), ("the next", "next")):
            path = OUT / f"{row['killed']}-{row['command']}-{row['point']}-{part}.txt"
            text = path.read_text().splitlines(keepends=True)
            code = re.search(r"\[exit (-?\d+|None)", text[-1] if text else "")
            ran = Ran(int(code.group(1)) if code and code.group(1) != "None" else None, 0, text, 0)
            for found in said_failure(ran, which):
                again = f"{found} (judged again)"
                if found not in row["violations"] and again not in row["violations"]:
                    row["violations"].append(again)
    (OUT / "sweep.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    took = (OUT / "table.md").read_text().splitlines()[0].removesuffix(", judged again")
    took += ", judged again"
    text = table(rows)
    (OUT / "table.md").write_text(f"{took}\n\n" + text)
    (OUT / "FAULTS-section.md").write_text(section(took, text))
    print(text)
    return 1 if any(row["violations"] for row in rows) else 0


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # main's finally takes the fleet down


def main() -> int:
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*"):
        if old.is_file():
            old.unlink()
    parts = set(os.environ.get("OUTAGE_PARTS", "registry,engine").split(","))
    only = set(
        os.environ.get("OUTAGE_COMMANDS", "push,pull,pin,evidence,build,test,deploy").split(",")
    )
    kept = os.environ.get("OUTAGE_REGISTRY_HOME")  # trials: keep the registry's data
    home = Path(kept) if kept else Path(tempfile.mkdtemp(prefix="sm120-outage-registry."))
    reg = OwnRegistry(home)
    reg.start()
    work, results = ks.workspace(), []
    began = time.monotonic()
    say(f"run {RUN}: workspace {work}, registry {REGISTRY} (data {reg.data})")
    try:
        subprocess.run(["docker", "tag", BASE, MIRROR], check=True)
        based = subprocess.run(["docker", "push", MIRROR], capture_output=True, text=True)
        # (a kept registry already holds it: the push then only checks)
        (OUT / "setup-base.txt").write_text(based.stdout + based.stderr)
        if based.returncode != 0:
            raise SystemExit(f"pushing the base failed: {OUT}/setup-base.txt")
        hashed = variant(work, "pushed")
        built = ks.run(["build", STACK], work)
        ks.save("setup-build", built)
        if built.code != 0:
            raise SystemExit(f"setup build failed: {OUT}/setup-build.txt")
        mark_tested(work, hashed)
        target = f"{REGISTRY}/outage-{RUN}-pinned"
        if "registry" in parts:
            target = registry_part(reg, work, hashed, only, results)
        else:
            pushed = ks.run(["push", STACK, "--registry", target], work)
            ks.save("registry-setup-push", pushed)
        if "engine" in parts:
            engine_part(reg, target, only, results)
    finally:
        down = fleet("down")
        (OUT / "engine-fleet-down.txt").write_text(down.stdout + down.stderr)
        ks.cleanup(work)
        docker(None, "rmi", MIRROR)
        reg.stop()
        if not kept:
            shutil.rmtree(home, ignore_errors=True)
        text = table(SLICE_LOG)
        took = f"run {RUN}, {time.monotonic() - began:.0f} s"
        (OUT / "table.md").write_text(f"{took}\n\n" + text)
        (OUT / "FAULTS-section.md").write_text(section(took, text))
        print(text)
    return 1 if any(p.violations for p in results) else 0


if __name__ == "__main__":
    sys.exit(rejudge() if sys.argv[1:] == ["rejudge"] else main())
