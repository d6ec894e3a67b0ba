"""What the safe default costs `pin` (issue 43): reading an image's evidence from the local
registry (127.0.0.1:5000, plain HTTP) under the trust decision, against reading it with nothing
verified (what `pin` did with no trust.yaml before).

The image is the local Debian + Python base pushed under a fresh namespace, with a verdict
document of the size of a real test report (0.7 MB), an SBOM and a provenance attached as
`push` attaches them: once unsigned, once signed by a build key (its public key beside each).

- before: the signed evidence read with no trust.yaml by the tree before this change
  (BEFORE_TREE, default /work/main, in a process of its own): nothing verified, the old
  default's work;
- unverified: the unsigned evidence read with no policy;
- policy: the signed evidence read under a written trust.yaml (every later pin);
- first use: the signed evidence with no trust.yaml: the keys learned (a second pass over the
  referrers, manifests and blobs), the evidence read under them, trust.yaml written;
- policy_index, first_use_index: the same with the signed evidence index `push` publishes
  (version 1, builder/evidence/index.py): its envelope read and verified, every listed
  document checked present, the version held against HOSTS_DIR/evidence-versions.json
  (issue 43 item 6). What `pin` reads for an image pushed by this tool today.

Each figure is the median of ROUNDS wall-clock reads on this machine, registry included; the
cases of this tree are taken in turn within each round (the before tree's run in a process of
its own, first).
Usage: SM120_STACKS_INSECURE_REGISTRIES=127.0.0.1:5000 python bench/tofu_bench.py OUT_FOLDER [NAME]
(NAME: the raw file's name, default tofu.json). BEFORE_TREE: a tree from before issue 43, e.g.
`git archive d784b3d^ builder | tar -x -C /tmp/before`.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder.evidence import documents
from builder.evidence.decision import relied_evidence
from builder.evidence.index import publish_next
from builder.evidence.keys import generate_key_pair, load_signing_key, public_pem
from builder.evidence.oci import ArtifactStore, Descriptor
from builder.evidence.reader import read_evidence
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE, seal
from builder.image.records import Record
from builder.image.registry import Registry

ROUNDS = 25
HOST = "127.0.0.1:5000"
BASE = "local/debian-python:bookworm"
TYPES = {
    "verdict": documents.VERDICT_TYPE,
    "sbom": documents.SBOM_TYPE,
    "provenance": documents.PROVENANCE_TYPE,
}


def _push_base(namespace: str) -> str:
    ref = f"{HOST}/{namespace}/sm120-stacks"
    subprocess.run(["docker", "tag", BASE, f"{ref}:1"], check=True)
    out = subprocess.run(
        ["docker", "push", f"{ref}:1"], check=True, capture_output=True, text=True
    ).stdout
    subprocess.run(["docker", "rmi", f"{ref}:1"], check=True, capture_output=True)
    digest = next(w for w in out.split() if w.startswith("sha256:"))
    return digest


def _attach(registry: Registry, digest: str, key_file: Path | None, indexed: bool = False) -> None:
    """The three documents, signed by key_file where given; with indexed, the signed index
    of them (version 1) as `push --signing-key` publishes it."""
    store = ArtifactStore(registry)
    attached: list[tuple[Descriptor, str]] = []
    report = {"checks": [{"name": f"check-{i}", "detail": "x" * 700} for i in range(1000)]}
    record = Record(stack="bench", content_hash="b" * 64, static="passed", served=[])
    verdict = documents.verdict_document(digest, registry.repository, record, report, False)
    provenance = documents.provenance(
        documents.ProvenanceInputs(
            registry.repository,
            digest,
            "bench",
            "b" * 64,
            {"Dockerfile": b"FROM x"},
            [],
            "unix:///var/run/docker.sock",
            "buildx",
            None,
        )
    )
    sbom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "components": [{"bom-ref": "b/x"}]}
    made = {
        "verdict": documents.canonical(verdict),
        "sbom": documents.canonical(sbom),
        "provenance": provenance,
    }
    for kind, payload in made.items():
        annotations = {documents.SUBJECT_ANNOTATION: digest, documents.KIND_ANNOTATION: kind}
        layer, body = TYPES[kind], payload
        if key_file is not None:
            key = load_signing_key(key_file)
            layer, body = ENVELOPE_MEDIA_TYPE, seal(kind, payload, registry.repository, digest, key)
            annotations[documents.SIGNER_KEY_ANNOTATION] = public_pem(key.key.public_key()).decode()
        attached.append(
            (store.attach(store.image(digest), TYPES[kind], layer, body, annotations), kind)
        )
    if indexed and key_file is not None:
        publish_next(store, store.image(digest), attached, load_signing_key(key_file), [])


def _interleaved(cases: dict[str, Callable[[], Any]]) -> dict[str, dict[str, Any]]:
    """Wall and this process's CPU time (the client's own work: parsing, hashing, verifying;
    the registry's and the other processes' time left out) per read, the cases taken in turn
    within each round (the order rotated), so a shared machine's load falls on all alike."""
    for run in cases.values():
        run()  # warm: connections, imports
    names = list(cases)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(ROUNDS):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start, start_cpu = time.perf_counter(), time.process_time()
            cases[name]()
            wall[name].append((time.perf_counter() - start) * 1000)
            cpu[name].append((time.process_time() - start_cpu) * 1000)
    return {name: _both(wall[name], cpu[name]) for name in names}


BEFORE = """
import statistics, sys, time
from builder.evidence.reader import read_evidence
from builder.image.registry import Registry
registry, digest, rounds = Registry.parse(sys.argv[1]), sys.argv[2], int(sys.argv[3])
read_evidence(registry, "bench", reference=digest)
times, cpu = [], []
for _ in range(rounds):
    start, start_cpu = time.perf_counter(), time.process_time()
    read_evidence(registry, "bench", reference=digest)
    times.append((time.perf_counter() - start) * 1000)
    cpu.append((time.process_time() - start_cpu) * 1000)
print(" ".join(f"{t:.3f}" for t in times))
print(" ".join(f"{t:.3f}" for t in cpu))
"""


def _before_ms(registry: Registry, digest: str) -> tuple[float, list[float]]:
    """The tree before this change reading the signed evidence with no policy."""
    tree = os.environ.get("BEFORE_TREE", "/work/main")
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            BEFORE,
            f"{registry.host}/{registry.namespace}",
            digest,
            str(ROUNDS),
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
    ).stdout
    wall, cpu = out.strip().splitlines()
    return _both([float(t) for t in wall.split()], [float(t) for t in cpu.split()])


def _both(wall: list[float], cpu: list[float]) -> dict[str, Any]:
    return {
        "wall_median_ms": round(statistics.median(wall), 2),
        "cpu_median_ms": round(statistics.median(cpu), 2),
        "wall_ms": [round(t, 2) for t in wall],
        "cpu_ms": [round(t, 2) for t in cpu],
    }


def main(out: Path, name: str = "tofu.json") -> None:
    load_at_start = list(os.getloadavg())
    tag = os.urandom(3).hex()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        generate_key_pair(root, "build")
        plain = Registry.parse(f"{HOST}/bench-tofu-plain-{tag}")
        signed = Registry.parse(f"{HOST}/bench-tofu-signed-{tag}")
        indexed = Registry.parse(f"{HOST}/bench-tofu-indexed-{tag}")
        plain_digest, signed_digest, indexed_digest = (
            _push_base(plain.namespace or ""),
            _push_base(signed.namespace or ""),
            _push_base(indexed.namespace or ""),
        )
        _attach(plain, plain_digest, None)
        _attach(signed, signed_digest, root / "build.key")
        _attach(indexed, indexed_digest, root / "build.key", indexed=True)
        written = root / "hosts-written"
        relied_evidence(written, signed, "bench", reference=signed_digest)
        written_index = root / "hosts-written-index"
        first = relied_evidence(written_index, indexed, "bench", reference=indexed_digest)
        assert first.evidence.index_version == 1, "the index was not read"
        assert (written_index / "evidence-versions.json").is_file()
        rounds = iter(range(10_000))

        results = {
            "before": _before_ms(signed, signed_digest),
            **_interleaved(
                {
                    "unverified": lambda: read_evidence(plain, "bench", reference=plain_digest),
                    "policy": lambda: relied_evidence(
                        written, signed, "bench", reference=signed_digest
                    ),
                    "first_use": lambda: relied_evidence(
                        root / f"hosts-{next(rounds)}", signed, "bench", reference=signed_digest
                    ),
                    "policy_index": lambda: relied_evidence(
                        written_index, indexed, "bench", reference=indexed_digest
                    ),
                    "first_use_index": lambda: relied_evidence(
                        root / f"hosts-{next(rounds)}",
                        indexed,
                        "bench",
                        reference=indexed_digest,
                    ),
                }
            ),
        }
    before, unverified = results["before"], results["unverified"]
    checked = ("policy", "first_use", "policy_index", "first_use_index")
    document = {
        "what": "ms per read of one image's evidence from the local registry: wall, and the "
        "reading process's CPU (the verification's own work)",
        "rounds": ROUNDS,
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_1_5_15_at_start": load_at_start,
            "load_average_1_5_15_at_end": list(os.getloadavg()),
        },
        "before_tree": os.environ.get("BEFORE_TREE", "/work/main"),
        "results": results,
        "added_over_before_ms": {
            name: {
                "wall": round(results[name]["wall_median_ms"] - before["wall_median_ms"], 2),
                "cpu": round(results[name]["cpu_median_ms"] - before["cpu_median_ms"], 2),
            }
            for name in checked
        },
        "index_added_over_policy_ms": {
            "wall": round(
                results["policy_index"]["wall_median_ms"] - results["policy"]["wall_median_ms"], 2
            ),
            "cpu": round(
                results["policy_index"]["cpu_median_ms"] - results["policy"]["cpu_median_ms"], 2
            ),
        },
        "added_over_unverified_ms": {
            name: {
                "wall": round(results[name]["wall_median_ms"] - unverified["wall_median_ms"], 2),
                "cpu": round(results[name]["cpu_median_ms"] - unverified["cpu_median_ms"], 2),
            }
            for name in checked
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(document, indent=2) + "\n")
    medians = {
        name: {k: v for k, v in r.items() if k.endswith("median_ms")} for name, r in results.items()
    }
    keys = ("added_over_before_ms", "added_over_unverified_ms", "index_added_over_policy_ms")
    added = {k: document[k] for k in keys}
    print(json.dumps({"medians": medians, **added}, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
