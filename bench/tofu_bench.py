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
  referrers, manifests and blobs), the evidence read under them, trust.yaml written.

Each figure is the median of ROUNDS wall-clock reads on this machine, registry included.
Usage: SM120_STACKS_INSECURE_REGISTRIES=127.0.0.1:5000 python bench/tofu_bench.py OUT_FOLDER
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
from builder.evidence.keys import generate_key_pair, load_signing_key, public_pem
from builder.evidence.oci import ArtifactStore
from builder.evidence.reader import read_evidence
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE, seal
from builder.image.records import Record
from builder.image.registry import Registry

ROUNDS = 15
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


def _attach(registry: Registry, digest: str, key_file: Path | None) -> None:
    store = ArtifactStore(registry)
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
        store.attach(store.image(digest), TYPES[kind], layer, body, annotations)


def _median_ms(run: Callable[[], Any]) -> dict[str, Any]:
    """Wall and this process's CPU time (the client's own work: parsing, hashing, verifying;
    the registry's and the other processes' time left out) per read."""
    run()  # warm: connections, imports
    wall, cpu = [], []
    for _ in range(ROUNDS):
        start, start_cpu = time.perf_counter(), time.process_time()
        run()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return _both(wall, cpu)


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


def main(out: Path) -> None:
    tag = os.urandom(3).hex()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        generate_key_pair(root, "build")
        plain = Registry.parse(f"{HOST}/bench-tofu-plain-{tag}")
        signed = Registry.parse(f"{HOST}/bench-tofu-signed-{tag}")
        plain_digest, signed_digest = (
            _push_base(plain.namespace or ""),
            _push_base(signed.namespace or ""),
        )
        _attach(plain, plain_digest, None)
        _attach(signed, signed_digest, root / "build.key")
        written = root / "hosts-written"
        relied_evidence(written, signed, "bench", reference=signed_digest)
        rounds = iter(range(10_000))

        results = {
            "before": _before_ms(signed, signed_digest),
            "unverified": _median_ms(lambda: read_evidence(plain, "bench", reference=plain_digest)),
            "policy": _median_ms(
                lambda: relied_evidence(written, signed, "bench", reference=signed_digest)
            ),
            "first_use": _median_ms(
                lambda: relied_evidence(
                    root / f"hosts-{next(rounds)}", signed, "bench", reference=signed_digest
                )
            ),
        }
    before = results["before"]
    document = {
        "what": "ms per read of one image's evidence from the local registry: wall, and the "
        "reading process's CPU (the verification's own work)",
        "rounds": ROUNDS,
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        "results": results,
        "added_over_before_ms": {
            name: {
                "wall": round(results[name]["wall_median_ms"] - before["wall_median_ms"], 2),
                "cpu": round(results[name]["cpu_median_ms"] - before["cpu_median_ms"], 2),
            }
            for name in ("policy", "first_use")
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "tofu.json").write_text(json.dumps(document, indent=2) + "\n")
    medians = {
        name: {k: v for k, v in r.items() if k.endswith("median_ms")} for name, r in results.items()
    }
    print(json.dumps({"medians": medians, "added": document["added_over_before_ms"]}, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
