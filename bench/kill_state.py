"""The kill sweep's state slice (issue 34; bench/FAULTS.md "Kill it anywhere", state slice).

The commands that write state other than images: `lock`, `propose`, `pull` into a fresh build
folder, `deploy --all --apply` of a fleet (two pins on this engine), `cache capture`, and a
restore (`deploy HOST --apply --require-warm` into a volume that holds an older live/). Each is
run once whole (the reference), then SIGKILLed (its own pid only, bench/kill_sweep.py's run())
at fractions of the reference's time and after its Nth printed line, then the command a user
runs next (the same one again), and the invariants are checked:

  half-written   every lock, manifest, record, pin, rendered deploy file, memo and parse-cache
                 entry under the workspace parses (a lock also validates: its locked_hash);
                 each lock/manifest/rendered file is the old content or the new
  unfinished     propose: the manifest and its lock both or neither; pull: a record naming the
                 pulled image only with that image here; capture: every artifact the registry
                 lists for the image has its manifest and blobs; restore: live/ of the volume
                 is the old one or the restored one, never both or neither (a pending swap
                 journal is allowed, the next command must finish or undo it)
  leftovers      after the next command: no temporary file or folder of the killed run (the
                 tool's TMPDIR is the workspace's tmp/, so it is seen whole), no container,
                 volume or network labelled with the killed pid, no process of its session
  next           the next command exits 0, or fails with one error line naming what to do

Writes OUT (default bench/results/kill-sweep/state/): sweep.jsonl (kill_sweep's Point fields
plus "slice": "state"), COMMAND-POINT-{killed,next}.txt, COMMAND-reference.txt, setup-*.txt,
table.md and FAULTS-section.md. KILL_COMMANDS picks commands (lock, propose, list: the parse
cache and listing memo, pull, fleet, capture, restore); `--table` only rewrites table.md and
FAULTS-section.md from sweep.jsonl (two sweeps of disjoint commands may run at once into one
OUT). Exit 1 on any violation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kill_sweep as ks  # (the shared helpers: run, save, points, leftovers)

ROOT = ks.ROOT
OUT = Path(os.environ.get("OUT", ROOT / "bench/results/kill-sweep/state"))
ks.OUT = OUT  # save() writes the raw output here
RUN = ks.RUN
REGISTRY = ks.REGISTRY
ks.FRACTIONS = tuple(
    float(f) for f in os.environ.get("KILL_FRACTIONS", "0.05,0.2,0.35,0.5,0.65,0.8,0.95").split(",")
)
ks.LINE_POINTS = int(os.environ.get("KILL_LINE_POINTS", "5"))
NINJA = ("1.13.0", "1.11.1.1")  # the lock sweep alternates these, so each lock replaces one
PREFIX = f"kst-{RUN}"
REPOSITORY = f"{REGISTRY}/sm120-kill-state-{RUN}"
LOCAL_BASE = "local/debian-python:bookworm"
ERROR_LINE = re.compile(r"^(error|failed)\b", re.IGNORECASE)

Checks = Callable[[Path, Any, ks.Ran, str], list[str]]


# --- the workspace and what the tool writes there ---------------------------------------------


def workspace(name: str) -> Path:
    work = Path(tempfile.mkdtemp(prefix=f"sm120-kill-state-{name}."))
    for sub in ("stacks", "build", "hosts", "tmp", "cache"):
        (work / sub).mkdir()
    shutil.copy(ROOT / "stacks/ci-mini.yaml", work / "stacks")
    (work / "build/wheels").symlink_to(ROOT / "build/wheels")
    (work / "patches").symlink_to(ROOT / "patches")
    return work


def use(work: Path) -> None:
    """The tool's temporary files and parse cache inside WORK, where they can all be seen."""
    ks.ENV["TMPDIR"] = str(work / "tmp")
    ks.ENV["SM120_STACKS_CACHE_DIR"] = str(work / "cache")


def written_files(work: Path) -> list[Path]:
    found = []
    for sub in ("stacks", "build", "hosts", "cache"):
        for path in (work / sub).rglob("*"):
            if path.is_symlink() or not path.is_file():
                continue
            if "wheels" in path.parts or "context" in path.parts:
                continue
            found.append(path)
    return found


def half_written(work: Path) -> list[str]:
    """Each file the tool writes parses; a lock validates too, a parse-cache entry loads."""
    from builder.lock.reading import _ParseCacheEntry

    bad = []
    for path in written_files(work):
        if ks.TEMP_NAME.search(path.name):
            continue
        rel = path.relative_to(work)
        try:
            if path.suffix == ".lock":
                problem = lock_problem(path)
                if problem:
                    bad.append(f"half-written {rel}: {problem}")
            elif "parsed-locks" in path.parts:
                _ParseCacheEntry.model_validate_json(path.read_bytes())
            elif path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix in (".yaml", ".yml"):
                yaml.safe_load(path.read_text())
        except (ValueError, yaml.YAMLError, UnicodeDecodeError) as exc:
            bad.append(f"half-written {rel}: {str(exc)[:80]}")
    return bad


def lock_problem(path: Path) -> str | None:
    """None for a whole lock: it parses, validates and pins what its locked_hash says."""
    from builder.errors import StackError
    from builder.knowledge.loader import parse_document
    from builder.knowledge.yamlsafe import load_yaml
    from builder.lock.lockfile import Lock

    try:
        lock = parse_document(load_yaml(path), Lock)
    except (StackError, ValueError) as exc:
        return str(exc).splitlines()[0][:100]
    if lock.locked_hash is not None and lock.locked_hash != lock.pinned_hash():
        return "its locked_hash does not match what it pins"
    return None


def temp_left(work: Path) -> list[str]:
    """Temporary files and folders after the next command: the killed run's, by then."""
    found = [
        str(p.relative_to(work))
        for sub in ("stacks", "build", "hosts", "cache")
        for p in (work / sub).rglob("*")
        if ks.TEMP_NAME.search(p.name) and "wheels" not in p.parts and not p.is_symlink()
    ]
    found += [p.name for p in work.glob(".propose-*")]
    found += [f"tmp/{p.name}" for p in (work / "tmp").iterdir()]
    return [f"temporary file or folder left: {t}" for t in sorted(found)]


def clear_temp(work: Path) -> None:
    """Counted once: the next point starts clean."""
    for line in temp_left(work):
        path = work / line.rsplit(": ", 1)[1]
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def next_failure(ran: ks.Ran) -> list[str]:
    """Exit 0, or one error line (the tool's `Error:`, `error:` or `failed:`) and a remedy."""
    if ran.code == 0:
        return []
    said = [line for line in ran.lines if ERROR_LINE.match(line)]
    if len(said) == 1:
        return []
    tail = "".join(ran.lines[-3:]).strip()[:200]
    return [f"next command exit {ran.code} with {len(said)} error lines: {tail}"]


def record(point: ks.Point, slice_name: str = "state") -> None:
    with (OUT / "sweep.jsonl").open("a") as out:
        out.write(json.dumps({**asdict(point), "slice": slice_name}) + "\n")


def nothing_more(work: Path) -> list[str]:
    return []


def sweep(
    command: str,
    work: Path,
    before: Callable[[str], tuple[Any, list[str]]],
    checks: Checks,
    results: list[ks.Point],
    timeout: float = 600,
    also: Callable[[Path], list[str]] = nothing_more,
    slice_name: str = "state",
) -> None:
    """bench/kill_sweep.py's sweep with this slice's checks: the reference run, then a killed
    run per point, each followed by the next command (the same one). ALSO: checks of another
    slice's, after the kill and after the next command."""
    use(work)
    _, args = before("ref")
    reference = ks.run(args, work, timeout=timeout)
    ks.save(f"{command}-reference", reference)
    if reference.code != 0:
        raise SystemExit(f"{command}: the reference run failed: {OUT}/{command}-reference.txt")
    print(f"{command}: reference {reference.seconds:.1f} s, {len(reference.lines)} lines")
    clear_temp(work)
    for name, at, after_line in ks.points(reference):
        state, args = before(name)
        killed = ks.run(args, work, kill_at=at, kill_after_line=after_line, timeout=timeout)
        ks.save(f"{command}-{name}-killed", killed)
        violations = half_written(work) + also(work) + checks(work, state, killed, "killed")
        following = ks.run(args, work, timeout=timeout)
        ks.save(f"{command}-{name}-next", following)
        violations += next_failure(following) + half_written(work) + also(work)
        violations += temp_left(work)
        violations += ks.engine_leftovers(killed.pid) + ks.live_processes(killed.pid, work)
        violations += checks(work, state, following, "next")
        point = ks.Point(
            command, name, killed.killed, round(killed.seconds, 1), following.code, violations
        )
        results.append(point)
        record(point, slice_name)
        print(
            f"  {command} {name:14} killed={killed.killed!s:5} at {killed.seconds:5.1f} s"
            f"  next exit {following.code}  violations {len(violations)} {violations[:2]}",
            flush=True,
        )
        clear_temp(work)


# --- lock --------------------------------------------------------------------------------------


def pinned_ninja(path: Path) -> str | None:
    """The ninja release the lock installs (the entry with hashes), None in a broken lock."""
    text = path.read_text() if path.is_file() else ""
    found = re.search(r"\n\s+ninja:\n\s+version: ([^\n]+)\n\s+hashes:", text)
    return found.group(1).strip().strip("'\"") if found else None


def sweep_lock(work: Path, results: list[ks.Point]) -> None:
    """A variant of ci-mini whose ninja alternates between two releases, so every lock replaces
    the one before: the killed run's lock must be the old bytes or a whole new lock."""
    stack = f"{PREFIX}-lock"
    lock = work / "stacks" / f"{stack}.lock"
    count = [0]

    def before(name: str) -> tuple[tuple[bytes | None, str], list[str]]:
        count[0] += 1
        version = NINJA[count[0] % 2]
        (work / "stacks" / f"{stack}.yaml").write_text(
            f'extends: ci-mini\npython:\n  packages:\n    ninja: "{version}"\n'
        )
        old = lock.read_bytes() if lock.is_file() else None
        return (old, version), ["lock", stack]

    def checks(work: Path, state: tuple[bytes | None, str], ran: ks.Ran, when: str) -> list[str]:
        old, version = state
        if not lock.is_file():
            return ["the lock is gone"] if old is not None or when == "next" else []
        if when == "killed" and lock.read_bytes() == old:
            return []
        got = pinned_ninja(lock)
        if got != version:
            return [f"the lock ({when}) is neither the old one nor the new: ninja {got}"]
        return []

    sweep("lock", work, before, checks, results)


# --- propose -----------------------------------------------------------------------------------


def sweep_propose(work: Path, results: list[ks.Point]) -> None:
    """A proposal from ci-mini (locked in the setup): its manifest and lock are both written or
    neither ("Nothing is written unless all of that succeeded"). A proposal the killed run
    finished writing makes the next propose refuse its name, with the remedy: that is the
    "fails with one message naming what to do" case, judged as such."""
    name = f"{PREFIX}-prop"
    manifest, lock = work / "stacks" / f"{name}.yaml", work / "stacks" / f"{name}.lock"

    def before(point: str) -> tuple[dict[str, bool], list[str]]:
        manifest.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)
        return {}, ["propose", name, "--from", "ci-mini", "--set", f"ninja={NINJA[1]}"]

    def checks(work: Path, state: dict[str, bool], ran: ks.Ran, when: str) -> list[str]:
        found = []
        # a lock alone names no stack (the manifest is written last): the next propose
        # replaces it; a manifest without its lock is a stack that is not whole
        if manifest.is_file() != lock.is_file() and (manifest.is_file() or when == "next"):
            found.append(
                f"propose ({when}) left {'the manifest' if manifest.is_file() else 'the lock'}"
                " without the other"
            )
        if when == "killed":
            state["complete"] = manifest.is_file() and lock.is_file()
            return found
        if not manifest.is_file() or not lock.is_file():
            found.append("no proposal after the next propose")
        elif ran.code != 0 and not state.get("complete"):
            found.append("the next propose failed though the killed one wrote nothing whole")
        elif ran.code != 0 and not any("delete the old proposal" in line for line in ran.lines):
            found.append("the next propose refused the name without saying what to do")
        if manifest.is_file() and f"ninja: {NINJA[1]}" not in manifest.read_text().replace('"', ""):
            found.append("the proposal does not set ninja")
        return found

    sweep("propose", work, before, checks, results)


# --- list: the lock's parse cache and the listing memo ------------------------------------------


def sweep_list(work: Path, results: list[ks.Point]) -> None:
    """`list` reads every lock of stacks/ (ci-mini's, the lock sweep's, the proposal's) and
    writes each one's parse cache entry, then its listing memo (build/cache/list.json): both
    cleared before each point, so each point's run writes them again."""

    def before(name: str) -> tuple[None, list[str]]:
        shutil.rmtree(work / "cache" / "parsed-locks", ignore_errors=True)
        shutil.rmtree(work / "build" / "cache", ignore_errors=True)
        return None, ["list"]

    def checks(work: Path, state: None, ran: ks.Ran, when: str) -> list[str]:
        if when != "next":
            return []
        locks = len(list((work / "stacks").glob("*.lock")))
        entries = len(list((work / "cache" / "parsed-locks").glob("*.json")))
        found = [] if entries >= locks else [f"{entries} parse cache entries for {locks} locks"]
        if not (work / "build" / "cache" / "list.json").is_file():
            found.append("no listing memo after the next list")
        return found

    sweep("list", work, before, checks, results)


# --- images: the pushed variant, pull into a fresh build folder --------------------------------


def docker(*args: str, check: bool = True) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def setup_pushed_variant(work: Path) -> tuple[str, str]:
    """A ci-mini variant (an env value) built, marked tested and pushed to a repository of this
    run; its content hash and the registry it is in."""
    hashed = ks.variant(work, f"state-{RUN}")
    built = ks.run(["build", ks.STACK], work)
    ks.save("setup-build", built)
    if built.code != 0:
        raise SystemExit(f"setup build failed: {OUT}/setup-build.txt")
    ks.mark_tested(work, hashed)
    pushed = ks.run(["push", ks.STACK, "--registry", REPOSITORY], work)
    ks.save("setup-push", pushed)
    if pushed.code != 0:
        raise SystemExit(f"setup push failed: {OUT}/setup-push.txt")
    return hashed, REPOSITORY


def local_tags(fragment: str) -> list[str]:
    return [
        t
        for t in docker("images", "--format", "{{.Repository}}:{{.Tag}}").split()
        if fragment in t and not t.endswith(":<none>")
    ]


def sweep_pull(source: Path, hashed: str, results: list[ks.Point]) -> None:
    """Each point pulls into a fresh build folder (only the wheels link) with the pulled tags
    removed from this engine first, so each pull fetches and records for real."""
    work = workspace("pull")
    shutil.copy(source / "stacks" / f"{ks.STACK}.yaml", work / "stacks")
    args = ["pull", ks.STACK, "--registry", REPOSITORY]

    def fresh() -> None:
        for entry in (work / "build").iterdir():
            if entry.name != "wheels":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        tags = local_tags(REPOSITORY)
        if tags:
            docker("rmi", *tags, check=False)

    def before(name: str) -> tuple[None, list[str]]:
        fresh()
        return None, args

    def checks(work: Path, state: None, ran: ks.Ran, when: str) -> list[str]:
        found = []
        records = [
            p for p in (work / "build").rglob("*.json") if "records" in p.parts and p.is_file()
        ]
        for path in records:
            try:
                data = json.loads(path.read_text())
            except ValueError:
                continue  # half_written reports it
            image = str(data.get("image") or "")
            if image and not docker("image", "inspect", image, check=False).strip().startswith("["):
                found.append(f"record names {image}, not on this engine ({when})")
        if when == "next" and not records:
            found.append("no record after the next pull")
        if when == "next" and not local_tags(REPOSITORY):
            found.append("no image after the next pull")
        return found

    try:
        sweep("pull", work, before, checks, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- pins of the warm-test server (fleet, capture, restore) ------------------------------------


def pushed_server_image() -> str:
    """The local base image in this run's repository, by digest: what the pins name."""
    if not docker("images", "-q", LOCAL_BASE).strip():
        subprocess.run([str(ROOT / "scripts/make-base-local.sh")], check=True)
    target = f"{REPOSITORY}/server:1"
    docker("tag", LOCAL_BASE, target)
    docker("push", "-q", target)
    digests = docker("inspect", "-f", "{{range .RepoDigests}}{{println .}}{{end}}", target)
    return next(d for d in digests.split() if d.startswith(f"{REPOSITORY}/server@"))


def write_server_pin(
    work: Path, host: str, image: str, port: int, env: dict[str, str], volume: str | None
) -> None:
    from builder.hosts.pins import CACHE_ENV, CACHE_TARGET, PIN_SCHEMA, Pin, write_pin
    from tests.engine.test_warm import SERVER

    pin = Pin.model_validate(
        {
            "schema_version": PIN_SCHEMA,
            "host": host,
            "stack": "warm-test",
            "content_hash": "0" * 64,
            "image": image,
            "pinned_at": "2026-12-02T00:00:00Z",
            "container": f"sm120-stacks-{host}",
            "command": ["python3", "-c", SERVER],
            "serve_port": 8000,
            "env": {**CACHE_ENV, **env},
            "gpus": "none",
            "ports": [f"127.0.0.1:{port}:8000"],
            "volumes": [{"source": volume, "target": CACHE_TARGET}] if volume else [],
            "shm_size": "64m",
            "health": {"interval_s": 600, "start_period_s": 60},
            "needs": {"cuda": "13.0.2", "min_driver": None, "targets": {"sm120": "12.0"}},
        }
    )
    write_pin(work / "hosts", pin)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def host_containers(host: str) -> list[tuple[str, str, str]]:
    listed = docker(
        "ps",
        "-a",
        "--filter",
        f"label=sm120-stacks.host={host}",
        "--format",
        "{{.ID}} {{.Names}} {{.State}}",
    )
    return [tuple(line.split()) for line in listed.splitlines()]  # type: ignore[misc]


def container_env(name: str) -> str:
    return docker("inspect", name, "--format", "{{json .Config.Env}}", check=False)


def sweep_fleet(image: str, results: list[ks.Point]) -> None:
    """Two hosts on this engine (pins without an engine: the local one), both pins changed
    before each point, so each `deploy --all --apply` replaces both containers, one at a time."""
    work = workspace("fleet")
    hosts = {f"{PREFIX}-f{i}": free_port() for i in (1, 2)}
    current = ["first"]

    def before(name: str) -> tuple[tuple[str, str], list[str]]:
        previous = current[0]
        for host, port in hosts.items():
            write_server_pin(work, host, image, port, {"KILL_POINT": f"fleet-{name}"}, None)
        current[0] = f"fleet-{name}"
        return (previous, f"fleet-{name}"), ["deploy", "--all", "--apply"]

    def checks(work: Path, state: tuple[str, str], ran: ks.Ran, when: str) -> list[str]:
        old, new = state
        found = []
        for host in hosts:
            for rendered in (work / "build" / "hosts" / host).glob("*"):
                if not rendered.is_file() or ks.TEMP_NAME.search(rendered.name):
                    continue
                said = set(re.findall(r"KILL_POINT\W+([\w.-]+)", rendered.read_text()))
                if said and not (said <= {old} or said <= {new}):
                    found.append(f"rendered {host}/{rendered.name} is neither old nor new: {said}")
            if when != "next":
                continue
            listed = host_containers(host)
            if len(listed) != 1 or listed[0][2] != "running":
                found.append(f"{host}: containers after the next deploy: {listed}")
            if f"KILL_POINT={new}" not in container_env(f"sm120-stacks-{host}"):
                found.append(f"{host} does not run its pin after the next deploy")
        return found

    try:
        sweep("fleet", work, before, checks, results)
    finally:
        for host in hosts:
            remove_host(host)
        shutil.rmtree(work, ignore_errors=True)


def remove_host(host: str, volume: str | None = None) -> None:
    ids = [c[0] for c in host_containers(host)]
    if ids:
        docker("rm", "-f", *ids, check=False)
    if volume:
        docker("volume", "rm", "-f", volume, check=False)


# --- cache capture and a restore ---------------------------------------------------------------


def volume_listing(volume: str) -> list[str]:
    """Every path in the volume (relative to its root), read by a throwaway of the base image."""
    out = docker(
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "sh",
        "-v",
        f"{volume}:/w:ro",
        LOCAL_BASE,
        "-c",
        "cd /w && find . -mindepth 1 | sort",
    )
    return [line[2:] for line in out.splitlines()]


def registry_get(path: str, accept: str = "") -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{REGISTRY}/v2/{path}", headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except OSError:
        return 0, b""


INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def artifacts_whole(image: str) -> tuple[int, list[str]]:
    """The artifacts the registry lists for image (referrers tag scheme) and what of each is
    missing: every listed manifest must be served, and every blob it names."""
    repository, digest = image.split("/", 1)[1].split("@")
    code, body = registry_get(f"{repository}/manifests/{digest.replace(':', '-')}", INDEX)
    if code == 404:
        return 0, []
    if code != 200:
        return 0, [f"the referrers index answers {code}"]
    problems, count = [], 0
    for entry in json.loads(body).get("manifests", []):
        count += 1
        code, data = registry_get(f"{repository}/manifests/{entry['digest']}", MANIFEST)
        if code != 200:
            problems.append(f"artifact {entry['digest'][:19]} listed, manifest {code}")
            continue
        manifest = json.loads(data)
        for blob in [manifest.get("config", {}), *manifest.get("layers", [])]:
            if not blob.get("digest"):
                continue
            request = urllib.request.Request(
                f"http://{REGISTRY}/v2/{repository}/blobs/{blob['digest']}", method="HEAD"
            )
            try:
                with urllib.request.urlopen(request, timeout=10):
                    pass
            except OSError:
                problems.append(f"artifact {entry['digest'][:19]} lacks blob {blob['digest'][:19]}")
    return count, problems


def live_of(listing: list[str]) -> set[str]:
    return {p[len("live/") :] for p in listing if p.startswith("live/")}


OLD_MARK = "triton/old-kill-state/marker"
KERNEL = "triton/grp0/kernel.cubin"


def sweep_cache(image: str, results: list[ks.Point], only: set[str]) -> None:
    """C1 deployed cold (its server "compiles" into its volume), then `cache capture C1` swept;
    then C2 (the same key, its own volume) restored by `deploy C2 --apply --require-warm` into a
    volume that holds an older live/ (a marker file), swept."""
    work = workspace("cache")
    use(work)
    source, target = f"{PREFIX}-c1", f"{PREFIX}-c2"
    volumes = {h: f"sm120-warm-{h}" for h in (source, target)}
    for host in (source, target):
        write_server_pin(work, host, image, free_port(), {}, volumes[host])
    try:
        deployed = ks.run(["deploy", source, "--apply"], work)
        ks.save("setup-deploy-c1", deployed)
        if deployed.code != 0:
            raise SystemExit(f"setup deploy failed: {OUT}/setup-deploy-c1.txt")
        time.sleep(3)  # the server "compiles" for 1 s at its start
        if "capture" in only:
            sweep_capture(work, source, image, volumes[source], results)
        else:
            captured = ks.run(["cache", "capture", source], work)
            ks.save("setup-capture", captured)
        if "restore" in only:
            sweep_restore(work, target, image, volumes[target], results)
    finally:
        for host in (source, target):
            remove_host(host, volumes[host])
        shutil.rmtree(work, ignore_errors=True)


def sweep_capture(work: Path, host: str, image: str, volume: str, results: list[ks.Point]) -> None:
    live = live_of(volume_listing(volume))

    def before(name: str) -> tuple[None, list[str]]:
        return None, ["cache", "capture", host]

    def checks(work: Path, state: None, ran: ks.Ran, when: str) -> list[str]:
        count, problems = artifacts_whole(image)
        found = [f"capture ({when}): {p}" for p in problems]
        if live_of(volume_listing(volume)) != live:
            found.append(f"capture ({when}) changed live/ of the volume it reads")
        if when == "next" and count == 0:
            found.append("no artifact after the next capture")
        return found

    sweep("capture", work, before, checks, results)


def sweep_restore(work: Path, host: str, image: str, volume: str, results: list[ks.Point]) -> None:
    def before(name: str) -> tuple[None, list[str]]:
        remove_host(host, volume)
        docker(
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "sh",
            "-v",
            f"{volume}:/w",
            LOCAL_BASE,
            "-c",
            f"mkdir -p /w/live/{os.path.dirname(OLD_MARK)} && echo old > /w/live/{OLD_MARK}",
        )
        return None, ["deploy", host, "--apply", "--require-warm"]

    def checks(work: Path, state: None, ran: ks.Ran, when: str) -> list[str]:
        listing = volume_listing(volume)
        live = live_of(listing)
        old, new = OLD_MARK in live, KERNEL in live
        if ".restore-journal" in listing and when == "killed":
            return []  # a swap in flight: the next operation must finish or undo it
        found = []
        if old == new:
            found.append(
                f"live/ ({when}) is {'a mix of old and restored' if old else 'neither old nor new'}"
                f": {sorted(live)[:4]}"
            )
        if when == "next":
            if not new:
                found.append("live/ after the next restore is not the restored one")
            stray = [p for p in listing if p.startswith((".incoming-", ".previous-live"))]
            stray += [p for p in listing if p == ".restore-journal"]
            if stray:
                found.append(f"restore leftovers in the volume: {stray[:3]}")
            listed = host_containers(host)
            if len(listed) != 1 or listed[0][2] != "running":
                found.append(f"{host}: containers after the next deploy: {listed}")
        return found

    sweep("restore", work, before, checks, results)


# --- the table ---------------------------------------------------------------------------------


def table_and_section() -> tuple[str, str]:
    points = [
        json.loads(line)
        for line in (OUT / "sweep.jsonl").read_text().splitlines()
        if line.strip() and json.loads(line).get("slice") == "state"
    ]
    refs = {}
    for command in dict.fromkeys(p["command"] for p in points):
        ref = OUT / f"{command}-reference.txt"
        text = ref.read_text() if ref.is_file() else ""
        took = re.search(r"\[exit \S+, ([0-9.]+) s\]", text)
        refs[command] = (took.group(1) if took else "?", max(0, len(text.splitlines()) - 2))
    rows = [
        "| command | reference run | kill points | killed before its end | next exit 0 "
        "| violations |",
        "|---|---|---|---|---|---|",
    ]
    for command in refs:
        mine = [p for p in points if p["command"] == command]
        seconds, lines = refs[command]
        rows.append(
            f"| `{command}` | {seconds} s, {lines} lines | {len(mine)} | "
            f"{sum(p['killed'] for p in mine)} | {sum(p['next_code'] == 0 for p in mine)} | "
            f"{sum(len(p['violations']) for p in mine)} |"
        )
    rows.append(
        f"| all | | {len(points)} | {sum(p['killed'] for p in points)} | "
        f"{sum(p['next_code'] == 0 for p in points)} | "
        f"{sum(len(p['violations']) for p in points)} |"
    )
    found = [f"- {p['command']} {p['point']}: {v}" for p in points for v in p["violations"]]
    text = "\n".join(rows) + "\n\n" + ("\n".join(found) if found else "no violations") + "\n"
    return text, text


def write_table() -> int:
    text, section = table_and_section()
    (OUT / "table.md").write_text(text)
    head = (
        "## Kill it anywhere: the state slice (`bench/kill_state.py`; issue 34)\n\n"
        "The tool SIGKILLed (its own pid) at fractions of a reference run and after its Nth "
        "printed line, then the same command again; invariants: every lock (validated), "
        "manifest, record, pin, rendered file, memo and parse-cache entry whole and old or new; "
        "propose's manifest and lock both or neither; a pulled record only with its image here; "
        "every captured artifact whole in the registry; a restored volume's live/ old or new, "
        "never a mix; after the next command no temporary file or folder (the tool's TMPDIR "
        "inside the workspace), no container/volume/network labelled with the killed pid, no "
        "process of its session; the next command exits 0 or fails with one error line naming "
        "what to do. Raw: `bench/results/kill-sweep/state/`.\n\n"
    )
    findings = OUT / "findings.md"  # written by hand after a run: what was found and fixed
    tail = "\n" + findings.read_text() if findings.is_file() else ""
    (OUT / "FAULTS-section.md").write_text(head + section + tail)
    print(text)
    return 1 if "no violations" not in text else 0


def main() -> int:
    if "--table" in sys.argv:
        return write_table()
    OUT.mkdir(parents=True, exist_ok=True)
    only = set(
        os.environ.get("KILL_COMMANDS", "lock,propose,list,pull,fleet,capture,restore").split(",")
    )
    if os.environ.get("KILL_FRESH") == "1":
        for old in OUT.glob("*"):
            if old.is_file():
                old.unlink()
    results: list[ks.Point] = []
    began = time.monotonic()
    print(f"run {RUN}: {sorted(only)}, registry {REPOSITORY}", flush=True)
    works: list[Path] = []
    try:
        if only & {"lock", "propose", "list"}:
            work = workspace("lock")
            works.append(work)
            use(work)
            if "lock" in only:
                sweep_lock(work, results)
            if only & {"propose", "list"}:
                locked = ks.run(["lock", "ci-mini"], work)
                ks.save("setup-lock-ci-mini", locked)
                if locked.code != 0:
                    raise SystemExit(f"setup lock failed: {OUT}/setup-lock-ci-mini.txt")
            if "propose" in only:
                sweep_propose(work, results)
            if "list" in only:
                sweep_list(work, results)
        if "pull" in only:
            work = workspace("images")
            works.append(work)
            use(work)
            hashed, _ = setup_pushed_variant(work)
            sweep_pull(work, hashed, results)
        if only & {"fleet", "capture", "restore"}:
            image = pushed_server_image()
            if "fleet" in only:
                sweep_fleet(image, results)
            if only & {"capture", "restore"}:
                sweep_cache(image, results, only)
    finally:
        for work in works:
            shutil.rmtree(work, ignore_errors=True)
        tags = local_tags(REPOSITORY) + local_tags(ks.STACK)
        if tags:
            docker("rmi", *tags, check=False)
    print(f"run {RUN}: {time.monotonic() - began:.0f} s, {len(results)} points")
    bad = sum(len(p.violations) for p in results)
    print(f"violations {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
