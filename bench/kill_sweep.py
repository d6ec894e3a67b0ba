"""The kill sweep's first slice (issue 34; `make bench-kill`; bench/FAULTS.md "Kill it anywhere").

For `build` of a ci-mini variant, `push`, `pin` and `deploy --apply` of it, the tool is run
once whole (the reference: its time and the lines it prints), then SIGKILLed (its own pid only,
as the OOM killer or a dropped runner does; the children it started are left to fend for
themselves) at points spread over that run: by time (fractions of the reference) and right after
the Nth line it printed (its step boundaries). After each kill the next command a user would run
(the same command again) runs, and the invariants are checked:

  half-written   every record, report, lock, pin and rendered file under the workspace parses
  unfinished     the killed content is not tagged, recorded as built, tested or pushed by the
                 killed run (build: no content tag; push: the record names no push unless the
                 registry serves that manifest)
  leftovers      after the next command: no temporary file of a replaced write, no container,
                 volume or network labelled with the killed pid, no process of the killed run
  next           the next command exits 0, or fails with one `error:`/`failed:` line

Writes bench/results/kill-sweep/: sweep.jsonl (one line per kill point), table.md, and each
command's output as COMMAND-POINT-{killed,next}.txt. Exit 1 on any violation. Uses the shared
registry on 127.0.0.1:5000 (plain HTTP: SM120_STACKS_INSECURE_REGISTRIES=127.0.0.0/8), a
repository of this run; removes its tags, containers and workspace at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CLI = str(ROOT / ".venv/bin/sm120-stacks")
OUT = Path(os.environ.get("OUT", ROOT / "bench/results/kill-sweep"))
RUN = os.environ.get("RUN_ID") or os.urandom(3).hex()
REGISTRY = os.environ.get("KILL_REGISTRY", "127.0.0.1:5000")
STACK = f"kill-{RUN}"
HOST = f"kill-{RUN}-host"
#: Fractions of the reference run's time at which a kill lands, and line counts after which.
FRACTIONS = tuple(
    float(f) for f in os.environ.get("KILL_FRACTIONS", "0.05,0.25,0.5,0.75,0.95").split(",")
)
LINE_POINTS = int(os.environ.get("KILL_LINE_POINTS", "4"))
TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9_]{6,}$|\.tmp$|^tmp")
ENV = {**os.environ, "SM120_STACKS_INSECURE_REGISTRIES": "127.0.0.0/8"}


@dataclass
class Ran:
    code: int | None
    seconds: float
    lines: list[str]
    pid: int
    killed: bool = False


@dataclass
class Point:
    command: str
    point: str
    killed: bool
    killed_after_s: float
    next_code: int | None
    violations: list[str] = field(default_factory=list)


def run(
    args: list[str],
    work: Path,
    kill_at: float | None = None,
    kill_after_line: int | None = None,
    timeout: float = 600,
) -> Ran:
    """Run the tool in WORK; SIGKILL it at KILL_AT seconds or after KILL_AFTER_LINE lines."""
    began = time.monotonic()
    proc = subprocess.Popen(
        [CLI, *args],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=ENV,
        text=True,
        start_new_session=True,
    )
    ran = Ran(None, 0.0, [], proc.pid)

    def kill() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            ran.killed = True

    timer = threading.Timer(kill_at, kill) if kill_at is not None else None
    if timer:
        timer.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        ran.lines.append(line)
        if kill_after_line is not None and len(ran.lines) >= kill_after_line:
            kill()
            break
    try:
        ran.code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill()
        ran.code = proc.wait()
    if timer:
        timer.cancel()
    ran.seconds = time.monotonic() - began
    return ran


def save(name: str, ran: Ran) -> None:
    (OUT / f"{name}.txt").write_text(
        "".join(ran.lines) + f"\n[exit {ran.code}, {ran.seconds:.1f} s]\n"
    )


def half_written(work: Path) -> list[str]:
    """Every record, report, lock, pin and rendered file that does not parse."""
    bad = []
    for path in [*work.glob("build/**/*"), *work.glob("hosts/**/*"), *work.glob("stacks/*")]:
        if path.is_symlink() or not path.is_file() or TEMP_NAME.search(path.name):
            continue
        if "wheels" in path.parts or "context" in path.parts:
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix in (".yaml", ".yml", ".lock"):
                yaml.safe_load(path.read_text())
        except (ValueError, yaml.YAMLError, UnicodeDecodeError) as exc:
            bad.append(f"half-written {path.relative_to(work)}: {str(exc)[:80]}")
    return bad


def temp_files(work: Path) -> list[str]:
    found = []
    for path in [*work.glob("build/**/*"), *work.glob("hosts/**/*")]:
        if "wheels" in path.parts or path.is_symlink():
            continue
        if TEMP_NAME.search(path.name):
            found.append(str(path.relative_to(work)))
    return found


def engine_leftovers(pid: int) -> list[str]:
    """Containers, volumes, networks labelled with the killed pid (label sm120-stacks.owner)."""
    found = []
    for kind in ("ps -a", "volume ls", "network ls"):
        listed = subprocess.run(
            [
                "docker",
                *kind.split(),
                "--format",
                "{{.Name}}{{.Labels}}" if kind != "ps -a" else "{{.Names}} {{.Labels}}",
            ],
            capture_output=True,
            text=True,
        ).stdout
        for line in listed.splitlines():
            if re.search(rf"sm120-stacks\.owner=[^,]*:{pid}(,|$|\s)", line):
                found.append(f"{kind.split()[0]} {line.split()[0]} of the killed run")
    return found


def live_processes(pid: int, work: Path) -> list[str]:
    """Processes of the killed run still alive: its session (start_new_session) or its folder."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[3]) == pid and int(proc.name) != pid:  # field 6: session id
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
                found.append(f"process {proc.name} of the killed run alive: {cmd}")
        except (OSError, IndexError, ValueError):
            continue
    return found


def next_failure(ran: Ran) -> list[str]:
    if ran.code == 0:
        return []
    said = [line for line in ran.lines if line.startswith(("error:", "failed:"))]
    if len(said) == 1:
        return []  # fails with its message: judged per command below
    return [
        f"next command exit {ran.code} without one error line: "
        f"{''.join(ran.lines[-3:]).strip()[:200]}"
    ]


def points(reference: Ran) -> list[tuple[str, float | None, int | None]]:
    spread = [(f"t{f:.2f}", reference.seconds * f, None) for f in FRACTIONS]
    count = len(reference.lines)
    lines = sorted({max(1, round(count * (i + 1) / (LINE_POINTS + 1))) for i in range(LINE_POINTS)})
    return spread + [(f"line{n}of{count}", None, n) for n in lines if n < count]


def tags_of(content: str) -> list[str]:
    listed = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True
    ).stdout.split()
    return [t for t in listed if content in t]


def manifest_served(repository: str, tag: str) -> bool:
    request = urllib.request.Request(
        f"http://{REGISTRY}/v2/{repository}/manifests/{tag}",
        method="HEAD",
        headers={
            "Accept": "application/vnd.docker.distribution.manifest.v2+json,"
            "application/vnd.oci.image.index.v1+json"
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10):
            return True
    except OSError:
        return False


def content_hash(work: Path) -> str:
    from builder.manifest.resolve import resolve
    from builder.render.context import render

    return render(resolve(STACK, work / "stacks")).content_hash()


def record_of(work: Path, hashed: str) -> dict[str, object]:
    from builder.image.records import record_path

    path = record_path(work / "build", STACK, hashed)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def mark_tested(work: Path, hashed: str) -> None:
    """What a passing `test` records, as tests/engine/test_hosts.py's `deployed` does: the sweep
    kills push, pin and deploy, not the smoke (its own slice)."""
    from builder.image.records import ServedVerdict, load_record, save_record

    record = load_record(work / "build", STACK, hashed)
    record.tests = "passed"
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


def sweep(command: str, work: Path, before_each, checks, results: list[Point]) -> None:
    """The reference run, then one killed run per point, each followed by the next command.
    BEFORE_EACH(point) sets the point up and returns (state, args); CHECKS(work, state, ran,
    'killed'|'next') returns the command's own violations."""
    _, args = before_each("ref")
    reference = run(args, work)
    save(f"{command}-reference", reference)
    if reference.code != 0:
        raise SystemExit(
            f"{command}: the reference run failed (exit {reference.code}): "
            f"{OUT}/{command}-reference.txt"
        )
    print(
        f"{command}: reference {reference.seconds:.1f} s, {len(reference.lines)} lines", flush=True
    )
    for name, at, after_line in points(reference):
        state, args = before_each(name)
        killed = run(args, work, kill_at=at, kill_after_line=after_line)
        save(f"{command}-{name}-killed", killed)
        violations = half_written(work) + checks(work, state, killed, "killed")
        following = run(args, work)
        save(f"{command}-{name}-next", following)
        violations += next_failure(following) + half_written(work)
        violations += [f"temporary file left: {t}" for t in temp_files(work)]
        violations += engine_leftovers(killed.pid) + live_processes(killed.pid, work)
        violations += checks(work, state, following, "next")
        point = Point(
            command, name, killed.killed, round(killed.seconds, 1), following.code, violations
        )
        results.append(point)
        with (OUT / "sweep.jsonl").open("a") as out:
            out.write(json.dumps(asdict(point)) + "\n")
        print(
            f"  {name:16} killed={killed.killed!s:5} at {killed.seconds:5.1f} s"
            f"  next exit {following.code}"
            f"  violations {len(violations)} {violations[:2]}",
            flush=True,
        )
        for temp in temp_files(work):  # counted once: the next point starts clean
            (work / temp).unlink(missing_ok=True)


def workspace() -> Path:
    work = Path(tempfile.mkdtemp(prefix="sm120-kill-sweep."))
    (work / "stacks").mkdir()
    (work / "build").mkdir()
    shutil.copy(ROOT / "stacks/ci-mini.yaml", work / "stacks")
    (work / "build/wheels").symlink_to(ROOT / "build/wheels")
    (work / "patches").symlink_to(ROOT / "patches")
    return work


def variant(work: Path, value: str) -> str:
    (work / "stacks" / f"{STACK}.yaml").write_text(
        f'extends: ci-mini\nenv: {{KILL_SWEEP: "{value}"}}\n'
    )
    return content_hash(work)


def sweep_build(work: Path, results: list[Point]) -> None:
    def before(name: str) -> tuple[str, list[str]]:
        return variant(work, f"build-{name}"), ["build", STACK]

    def checks(work: Path, hashed: str, ran: Ran, when: str) -> list[str]:
        tags = tags_of(hashed[:16])
        if when == "next":
            return [] if tags else ["the next build tagged nothing"]
        if ran.killed and tags:
            return [f"tagged by the killed build: {tags}"]
        if ran.killed and record_of(work, hashed).get("image"):
            return ["recorded as built by the killed build"]
        return []

    sweep("build", work, before, checks, results)


def sweep_push(work: Path, hashed: str, results: list[Point]) -> None:
    """Each point pushes to a repository of its own, so each sends its manifests and evidence
    for real (the layers are mounted from the earlier repositories)."""
    count = [0]

    def before(name: str) -> tuple[str, list[str]]:
        count[0] += 1
        target = f"{REGISTRY}/sm120-kill-sweep-{RUN}-{count[0]}"
        return target, ["push", STACK, "--registry", target]

    def checks(work: Path, target: str, ran: Ran, when: str) -> list[str]:
        pushed = record_of(work, hashed).get("pushed") or {}
        assert isinstance(pushed, dict)
        found = []
        for repo, ref in pushed.items():
            digest = str(ref).rsplit("@", 1)[-1]
            if repo.startswith(REGISTRY) and not manifest_served(repo.split("/", 1)[1], digest):
                found.append(f"record names a push the registry does not serve: {ref}")
        if when == "next" and not any(repo.startswith(target + "/") for repo in pushed):
            found.append("the next push recorded nothing")
        return found

    sweep("push", work, before, checks, results)


def pin_args(target: str, models: Path, port: int, value: str) -> list[str]:
    return [
        "pin",
        HOST,
        STACK,
        "--gpus",
        "none",
        "--registry",
        target,
        "--port",
        f"127.0.0.1:{port}:8000",
        "--volume",
        f"{models}:/models/tiny:ro",
        "--env",
        f"KILL_POINT={value}",
    ]


def sweep_pin(work: Path, target: str, models: Path, port: int, results: list[Point]) -> None:
    def before(name: str) -> tuple[str, list[str]]:
        return name, pin_args(target, models, port, name)

    def checks(work: Path, name: str, ran: Ran, when: str) -> list[str]:
        pin = work / "hosts" / f"{HOST}.yaml"
        if when == "next" and f"KILL_POINT: {name}" not in pin.read_text():
            return ["the next pin did not write the pin"]
        return []

    sweep("pin", work, before, checks, results)


def sweep_deploy(work: Path, target: str, models: Path, port: int, results: list[Point]) -> None:
    """Each point pins a changed env first, so each deploy replaces the container for real."""

    def before(name: str) -> tuple[str, list[str]]:
        pinned = run(pin_args(target, models, port, f"deploy-{name}"), work)
        if pinned.code != 0:
            raise SystemExit(f"deploy: the pin before {name} failed: {''.join(pinned.lines)}")
        return name, ["deploy", HOST, "--apply"]

    def checks(work: Path, name: str, ran: Ran, when: str) -> list[str]:
        if when != "next":
            return []
        listed = subprocess.run(
            [
                "docker",
                "ps",
                "-a",
                "--filter",
                f"label=sm120-stacks.host={HOST}",
                "--format",
                "{{.Names}} {{.State}}",
            ],
            capture_output=True,
            text=True,
        ).stdout
        found = (
            []
            if len(listed.splitlines()) == 1
            else [f"containers of the host after the next deploy: {listed!r}"]
        )
        env = subprocess.run(
            ["docker", "inspect", f"sm120-stacks-{HOST}", "--format", "{{json .Config.Env}}"],
            capture_output=True,
            text=True,
        ).stdout
        if f"KILL_POINT=deploy-{name}" not in env:
            found.append("the container does not run the pin after the next deploy")
        return found

    sweep("deploy", work, before, checks, results)


def table(results: list[Point]) -> str:
    rows = [
        "| command | kill points | killed before its end | next command exit 0 | violations |",
        "|---|---|---|---|---|",
    ]
    for command in dict.fromkeys(p.command for p in results):
        mine = [p for p in results if p.command == command]
        rows.append(
            f"| {command} | {len(mine)} | {sum(p.killed for p in mine)} | "
            f"{sum(p.next_code == 0 for p in mine)} | {sum(len(p.violations) for p in mine)} |"
        )
    rows.append(
        f"| all | {len(results)} | {sum(p.killed for p in results)} | "
        f"{sum(p.next_code == 0 for p in results)} | {sum(len(p.violations) for p in results)} |"
    )
    found = [f"- {p.command} {p.point}: {v}" for p in results for v in p.violations]
    return "\n".join(rows) + "\n\n" + ("\n".join(found) if found else "no violations") + "\n"


def cleanup(work: Path, host: str = HOST, repository: str = f"sm120-kill-sweep-{RUN}") -> None:
    """The host's containers, the tags of the stack and of the run's repositories, the folder."""
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=sm120-stacks.host={host}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    if listed:
        subprocess.run(["docker", "rm", "-f", *listed], capture_output=True)
    tags = [
        t
        for t in subprocess.run(
            ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        if STACK in t or repository in t
    ]
    if tags:
        subprocess.run(["docker", "rmi", *tags], capture_output=True)
    shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*"):  # this slice's files only: other slices keep their subfolders
        if old.is_file() or old.is_symlink():
            old.unlink()
    only = set(os.environ.get("KILL_COMMANDS", "build,push,pin,deploy").split(","))
    work, results = workspace(), []
    began = time.monotonic()
    print(f"run {RUN}: workspace {work}, registry {REGISTRY}", flush=True)
    try:
        if "build" in only:
            sweep_build(work, results)
        hashed = variant(work, "pushed")
        built = run(["build", STACK], work)
        save("setup-build", built)
        if built.code != 0:
            raise SystemExit(f"setup build failed: {OUT}/setup-build.txt")
        mark_tested(work, hashed)
        if "push" in only:
            sweep_push(work, hashed, results)
        target = f"{REGISTRY}/sm120-kill-sweep-{RUN}-pinned"
        pushed = run(["push", STACK, "--registry", target], work)
        save("setup-push", pushed)
        if pushed.code != 0:
            raise SystemExit(f"setup push failed: {OUT}/setup-push.txt")
        models = ROOT / "build/tiny-model"  # `make build/tiny-model`: answers ci-mini's smoke
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if "pin" in only:
            sweep_pin(work, target, models, port, results)
        if "deploy" in only:
            sweep_deploy(work, target, models, port, results)
    finally:
        cleanup(work)
    text = table(results)
    (OUT / "table.md").write_text(f"run {RUN}, {time.monotonic() - began:.0f} s\n\n" + text)
    print(text)
    return 1 if any(p.violations for p in results) else 0


if __name__ == "__main__":
    sys.exit(main())
