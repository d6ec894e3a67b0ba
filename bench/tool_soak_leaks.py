"""What the tool soak (bench/tool-soak.sh) left behind beyond what its records and pins name.

    python bench/tool_soak_leaks.py WORK REGISTRY RUN_ID

WORK holds the two loops' folders (a/, b/), each with build/ and hosts/; REGISTRY is the soak's
own registry; the loops' stacks are soak-{a,b}-RUN_ID, their hosts soak-{a,b}-RUN_ID-host on
the fleet's engines (unix:///run/sm120-soak/hI/docker.sock, I = 1 for a, 2 for b). One line per
kind of leak and its count; exit status 1 when any count is not 0. Only this soak's own things
are looked at: other users' containers and tags on the shared engine are not counted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
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
    repositories = {"sm120-stacks"} | {f"{registry}/soak-{loop}/sm120-stacks" for loop in "ab"}
    for line in docker(None, "images", "--format", "{{.Repository}}:{{.Tag}}"):
        repository, _, tag = line.rpartition(":")
        for f in folders:
            if not tag.startswith(f.stack):
                continue
            if repository not in repositories:
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
    uploads = [str(p.relative_to(storage)) for p in storage.rglob("_uploads/*") if p.is_dir()]
    return {"tags": leaked, "open uploads": uploads}


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


def main(work: Path, registry: str, run_id: str) -> int:
    folders = []
    for index, loop in enumerate(("a", "b"), start=1):
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
    for kind, found in registry_leaks(folders, registry, work / "registry").items():
        counts[f"registry {kind}"] = found
    for kind, found in counts.items():
        print(f"{kind}: {len(found)}" + "".join(f"\n  {item}" for item in found[:20]))
    total = sum(len(found) for found in counts.values())
    print(f"leaks in all: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
