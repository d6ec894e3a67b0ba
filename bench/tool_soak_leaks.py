"""What the tool soak (bench/tool-soak.sh) left behind beyond what its records and pins name.

    python bench/tool_soak_leaks.py WORK REGISTRY RUN_ID [--loop a|b] [--round N --tsv FILE]

WORK holds the two loops' folders (a/, b/), each with build/ and hosts/, and tmp/a, tmp/b (the
loops' TMPDIR); REGISTRY is the soak's own registry; the loops' stacks are soak-{a,b}-RUN_ID,
their hosts soak-{a,b}-RUN_ID-host on the fleet's engines (unix:///run/sm120-soak/hI/docker.sock,
I = 1 for a, 2 for b). One line per kind of leak and its count; exit status 1 when any count is
not 0. Only this soak's own things are looked at: other users' containers and tags on the
shared engine are not counted.

--loop counts one loop's things only (what the other loop has in flight is not looked at):
the soak counts each loop after each of its rounds. --tsv appends one row of counts per kind
(containers, images, volumes, networks, temporary folders, build files, registry tags,
repositories and open uploads; and the open files of the loop's host engine and of the
registry, which are not leaks but must stay flat) for the round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

HASH16 = re.compile(r"[0-9a-f]{16}")
ENGINE_NETWORKS = {"bridge", "host", "none"}


@dataclass
class Folder:
    """One loop's build folder and what its records and pins name."""

    root: Path
    stack: str
    host: str
    engine: str
    hashes: set[str] = field(default_factory=set)
    pushed: dict[str, set[str]] = field(default_factory=dict)  # repository -> digests
    pinned_images: set[str] = field(default_factory=set)

    def read(self) -> None:
        for path in (self.root / "build" / self.stack / "records").glob("*.json"):
            record = json.loads(path.read_text())
            self.hashes.add(record["content_hash"][:16])
            for repository, ref in record["pushed"].items():
                self.pushed.setdefault(repository, set()).add(ref.rpartition("@")[2])
        for pin in (self.root / "hosts" / f"{self.host}.yaml",):
            for path in (pin, pin.parent / "previous" / pin.name):
                if path.is_file():
                    self.pinned_images.add(str(yaml.safe_load(path.read_text())["image"]))


def docker(engine: str | None, *args: str) -> list[str]:
    env_args = ["-H", engine] if engine else []
    done = subprocess.run(
        ["docker", *env_args, *args], capture_output=True, text=True, check=True, timeout=120
    )
    return [line for line in done.stdout.splitlines() if line.strip()]


def engine_tags(folders: list[Folder], registry: str) -> list[str]:
    """Soak tags on this machine's engine that no record names (content tag or moving tag)."""
    leaked = []
    for line in docker(None, "images", "--format", "{{.Repository}}:{{.Tag}}"):
        repository, _, tag = line.rpartition(":")
        for f in folders:
            if not tag.startswith(f.stack):
                continue
            loop = f.root.name
            if repository not in {"sm120-stacks", f"{registry}/soak-{loop}/sm120-stacks"}:
                leaked.append(line)  # a name for another registry (a failed push's, say)
                continue
            rest = tag[len(f.stack) :]
            if rest and not (rest.startswith("-") and rest[1:] in f.hashes):
                leaked.append(line)
    return leaked


def engine_containers(folders: list[Folder]) -> list[str]:
    """Containers on this machine's engine from the soak's tests (smoke and check containers)."""
    leaked = []
    for line in docker(None, "ps", "-a", "--format", "{{.Names}} {{.Image}}"):
        if any(f.stack in line for f in folders):
            leaked.append(line)
    return leaked


def host_leaks(f: Folder) -> dict[str, list[str]]:
    """On the folder's fleet host: containers but its pin's, volumes, networks beyond the
    engine's own, images beyond the pin and the previous pin (kept for a rollback)."""
    path = f.root / "hosts" / f"{f.host}.yaml"
    pin = yaml.safe_load(path.read_text()) if path.is_file() else {"container": None}
    containers = [
        c for c in docker(f.engine, "ps", "-a", "--format", "{{.Names}}") if c != pin["container"]
    ]
    named = {str(v.get("source")) for v in pin.get("volumes") or []}
    volumes = [v for v in docker(f.engine, "volume", "ls", "-q") if v not in named]
    networks = [
        n
        for n in docker(f.engine, "network", "ls", "--format", "{{.Name}}")
        if n not in ENGINE_NETWORKS
    ]
    kept = {image.rpartition("@")[2] for image in f.pinned_images}
    images = []
    for line in docker(f.engine, "images", "--digests", "--format", "{{.Digest}} {{.ID}}"):
        digest = line.split()[0]
        if digest not in kept:
            images.append(line)
    return {"containers": containers, "volumes": volumes, "networks": networks, "images": images}


def registry_leaks(folders: list[Folder], registry: str, storage: Path) -> dict[str, list[str]]:
    """Tags in the soak's registry that are neither a record's push nor its evidence
    (evidence is tagged sha256-<digest of the image>, or named by the image's referrers), and
    upload sessions left open."""
    leaked: list[str] = []
    with urllib.request.urlopen(f"http://{registry}/v2/_catalog?n=1000") as answer:
        catalog = json.load(answer).get("repositories") or []
    prefixes = tuple(f"soak-{f.root.name}/" for f in folders)
    pushed = {repository.partition("/")[2] for f in folders for repository in f.pushed}
    repositories = [r for r in catalog if r.startswith(prefixes) and r not in pushed]
    for f in folders:
        for repository, digests in f.pushed.items():
            name = repository.partition("/")[2]
            with urllib.request.urlopen(f"http://{registry}/v2/{name}/tags/list") as answer:
                tags = json.load(answer).get("tags") or []
            wanted = {f.stack} | {f"{f.stack}-{h}" for h in f.hashes}
            evidence = {d.replace(":", "-") for d in digests}
            for tag in tags:
                if tag not in wanted and not any(tag.startswith(e) for e in evidence):
                    leaked.append(f"{name}:{tag}")
    repos = storage / "docker" / "registry" / "v2" / "repositories"
    uploads = [
        str(p.relative_to(repos))
        for p in repos.rglob("_uploads/*")
        if p.is_dir() and str(p.relative_to(repos)).startswith(prefixes)
    ]
    return {"tags": leaked, "repositories": repositories, "open uploads": uploads}


def build_leaks(f: Folder) -> list[str]:
    """Files under build/STACK/ of a content hash no record names, and temporary files of a
    replaced write anywhere in the folder (build/ and hosts/)."""
    leaked = []
    stack_dir = f.root / "build" / f.stack
    per_stack = (f"{f.stack}-smoke", f"{f.stack}-url-smoke", f"{f.stack}-soak")
    for path in stack_dir.rglob("*"):
        if path.is_dir() or path.name == ".lock" or "context" in path.relative_to(stack_dir).parts:
            continue
        hashes = set(HASH16.findall(path.name))
        if (hashes and hashes <= f.hashes) or path.name.startswith(per_stack):
            continue
        leaked.append(str(path.relative_to(f.root)))
    for path in [*(f.root / "build").rglob(".*"), *(f.root / "hosts").rglob(".*")]:
        if path.is_file() and path.name != ".lock" and re.search(r"\.(json|yaml)\.", path.name):
            leaked.append(str(path.relative_to(f.root)))
    return leaked


def temporary_folders(f: Folder, work: Path) -> list[str]:
    """What the loop's commands left in their TMPDIR (WORK/tmp/LOOP): every temporary file or
    folder the tool makes is its own there, so anything left is the tool's."""
    tmp = work / "tmp" / f.root.name
    return sorted(str(p.relative_to(work)) for p in tmp.iterdir()) if tmp.is_dir() else []


def open_files(pidfile: Path) -> int | None:
    """Open file descriptors of the process in pidfile (None when it is not there)."""
    try:
        return len(os.listdir(f"/proc/{int(pidfile.read_text().strip())}/fd"))
    except (OSError, ValueError):
        return None


#: The TSV's columns after time, loop and round: leak kinds (summed from the detailed ones),
#: then the open-file counts (not leaks).
KINDS = (
    "containers",
    "images",
    "volumes",
    "networks",
    "temporary folders",
    "build files",
    "registry tags",
    "registry repositories",
    "open uploads",
)


def kind_of(name: str) -> str:
    for kind, words in (
        ("containers", ("containers",)),
        ("images", ("tags", "images")),
        ("volumes", ("volumes",)),
        ("networks", ("networks",)),
        ("temporary folders", ("temporary folders",)),
        ("build files", ("build files",)),
        ("registry repositories", ("registry repositories",)),
        ("open uploads", ("open uploads",)),
    ):
        if name.startswith("registry tags"):
            return "registry tags"
        if any(name.endswith(w) for w in words):
            return kind
    raise ValueError(name)


def main(
    work: Path,
    registry: str,
    run_id: str,
    loops: tuple[str, ...] = ("a", "b"),
    round_: str | None = None,
    tsv: Path | None = None,
) -> int:
    folders = []
    for index, loop in enumerate(("a", "b"), start=1):
        if loop not in loops:
            continue
        stack = f"soak-{loop}-{run_id}"
        engine = f"unix:///run/sm120-soak/h{index}/docker.sock"
        folder = Folder(work / loop, stack, f"{stack}-host", engine)
        folder.read()
        folders.append(folder)
        print(
            f"loop {loop}: {len(folder.hashes)} content hashes recorded, pushed to "
            f"{sorted(folder.pushed)}, {len(folder.pinned_images)} images in its pins"
        )
    counts: dict[str, list[str]] = {
        "engine tags": engine_tags(folders, registry),
        "engine containers": engine_containers(folders),
    }
    for f in folders:
        for kind, found in host_leaks(f).items():
            counts[f"{f.host} {kind}"] = found
        counts[f"{f.root.name}/build files"] = build_leaks(f)
        counts[f"{f.root.name} temporary folders"] = temporary_folders(f, work)
    for kind, found in registry_leaks(folders, registry, work / "registry").items():
        counts[f"registry {kind}"] = found
    for kind, found in counts.items():
        print(f"{kind}: {len(found)}" + "".join(f"\n  {item}" for item in found[:20]))
    total = sum(len(found) for found in counts.values())
    engines = {
        f.root.name: open_files(Path(f.engine.removeprefix("unix://")).with_name("docker.pid"))
        for f in folders
    }
    served = open_files(work / "registry.pid")
    print(f"open files (not leaks): host engines {engines}, registry {served}")
    print(f"leaks in all: {total}")
    if tsv is not None:
        by_kind = dict.fromkeys(KINDS, 0)
        for name, found in counts.items():
            by_kind[kind_of(name)] += len(found)
        row = [
            datetime.now(UTC).strftime("%H:%M:%S"),
            ",".join(loops),
            round_ or "-",
            *(str(by_kind[k]) for k in KINDS),
            str(total),
            ",".join(str(engines[loop]) for loop in loops),
            str(served),
        ]
        with tsv.open("a") as out:
            out.write("\t".join(row) + "\n")
    return 1 if total else 0


def tsv_header() -> str:
    names = ["time_utc", "loop", "round", *KINDS, "leaks", "open files: host engine"]
    return "\t".join([*names, "open files: registry"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("registry")
    parser.add_argument("run_id")
    parser.add_argument("--loop", choices=("a", "b"))
    parser.add_argument("--round")
    parser.add_argument("--tsv", type=Path)
    parser.add_argument("--header", action="store_true", help="print the TSV header, nothing else")
    args = parser.parse_args()
    if args.header:
        print(tsv_header())
        sys.exit(0)
    loops = (args.loop,) if args.loop else ("a", "b")
    sys.exit(main(args.work, args.registry, args.run_id, loops, args.round, args.tsv))
