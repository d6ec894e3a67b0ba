"""What verifying signed evidence costs (issue 35, item 6), side by side in one run.

- pin: reading the trust policy and vouching for the three build documents (a verdict of the
  size of a real test report, an SBOM, a provenance statement), against the same documents'
  JSON parse alone (what pin does without signatures).
- warm: vouching for the warm-cache statement of a 60 MB capture (its whole signed file list)
  against archive.check of the same 60 MB tar, the per-file sha256 pass every restore already
  makes (a restore also fetches and unpacks the tar, so the share of a whole restore is
  smaller than the share printed here).
- capture: the tar's sha256, the extra pass signing adds to `cache capture`.

No engine or registry: the figures are the verification's own CPU time on this machine.
Usage: python bench/trust_bench.py OUT_FOLDER  (writes trust.json, prints a summary)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder.evidence import signing
from builder.evidence.keys import generate_key_pair, load_signing_key
from builder.evidence.trust import load_policy, vouch
from builder.warm import archive, signed
from builder.warm.key import WarmKey

DIGEST = "sha256:" + "ab" * 32
ROUNDS = 15
CACHE_BYTES = 60_000_000
CACHE_FILES = 300


def _median_ms(action: Callable[[], object], rounds: int = ROUNDS) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 2)


def _documents(key_path: Path) -> dict[str, tuple[str, bytes, bytes]]:
    """Three build documents, their predicates of realistic sizes (a test report ~0.5 MB):
    (predicate type, envelope, the plain document)."""
    report = {"checks": [{"name": f"check-{i}", "detail": "x" * 400} for i in range(1200)]}
    sbom = {"components": [{"name": f"pkg-{i}", "hashes": ["0" * 64] * 3} for i in range(400)]}
    provenance = {"buildDefinition": {"resolvedDependencies": [{"digest": {"sha256": "0" * 64}}]}}
    key = load_signing_key(key_path)
    made = {}
    for name, kind, predicate in (
        ("verdict", signing.VERDICT_PREDICATE, report),
        ("sbom", signing.SBOM_PREDICATE, sbom),
        ("provenance", signing.PROVENANCE_PREDICATE, provenance),
    ):
        statement = signing.statement("bench/sm120-stacks", DIGEST, kind, predicate)
        made[name] = (kind, signing.sign(statement, key), json.dumps(predicate).encode())
    return made


def _cache(folder: Path, key_path: Path) -> tuple[Path, list[archive.CapturedFile], bytes]:
    tar_path = folder / "cache.tar"
    files = []
    size = CACHE_BYTES // CACHE_FILES
    with tarfile.open(tar_path, "w") as tar:
        for i in range(CACHE_FILES):
            data = os.urandom(size)
            name = f"triton/grp{i % 20}/kernel-{i}.cubin"
            info = tarfile.TarInfo(name)
            info.size, info.mode = size, 0o644
            tar.addfile(info, io.BytesIO(data))
            sha = hashlib.sha256(data).hexdigest()
            files.append(archive.CapturedFile(name, size, sha, 0o644, 0, "triton"))
    key = WarmKey.model_validate(_warm_key())
    envelope = signed.envelope(key, files, tar_path, "bench", load_signing_key(key_path))
    return tar_path, files, envelope


def _warm_key() -> dict[str, Any]:
    return {
        "image": DIGEST,
        "gpus": [],
        "sm_count": None,
        "capability": None,
        "driver": None,
        "model": "/models/m",
        "model_revision": "none",
        "serve_hash": "sha256:" + "0" * 64,
        "serve_covers": [],
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "mount": "/var/cache/sm120-stacks",
    }


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        generate_key_pair(folder / "keys", "build")
        policy_file = folder / "trust.yaml"
        policy_file.write_text(
            "version: 1\nkeys:\n  build: keys/build.pub\npurposes:\n  build: [build]\n"
            "  warm:\n    cpu: [build]\n"
        )
        documents = _documents(folder / "keys" / "build.key")

        def pin_with_signatures() -> None:
            policy = load_policy(policy_file)
            for name, (kind, raw, _) in documents.items():
                vouch(
                    raw,
                    document=name,
                    predicate_type=kind,
                    digest=DIGEST,
                    policy=policy,
                    purpose="build",
                )

        def pin_without() -> None:
            for _, _, plain in documents.values():
                json.loads(plain)

        tar_path, files, envelope = _cache(folder, folder / "keys" / "build.key")
        policy = load_policy(policy_file)

        def warm_vouch() -> None:
            vouch(
                envelope,
                document="warm",
                predicate_type=signing.WARM_CACHE_PREDICATE,
                digest=DIGEST,
                policy=policy,
                purpose="warm",
                gpu_kind="cpu",
            )

        result = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "rounds": ROUNDS,
            "document_bytes": {n: len(raw) for n, (_, raw, _) in documents.items()},
            "pin_vouch_ms": _median_ms(pin_with_signatures),
            "pin_parse_only_ms": _median_ms(pin_without),
            "warm_envelope_bytes": len(envelope),
            "warm_vouch_ms": _median_ms(warm_vouch),
            "warm_archive_check_ms": _median_ms(lambda: archive.check(tar_path, files), 5),
            "capture_tar_digest_ms": _median_ms(lambda: signed.tar_digest(tar_path), 5),
            "cache_bytes": tar_path.stat().st_size,
            "cache_files": CACHE_FILES,
        }
    result["warm_share_of_check_pct"] = round(
        100 * result["warm_vouch_ms"] / result["warm_archive_check_ms"], 2
    )
    (out / "trust.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("bench/results/trust")))
