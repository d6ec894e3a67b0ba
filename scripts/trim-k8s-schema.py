#!/usr/bin/env python3
"""Regenerate knowledge/k8s/SCHEMA from kubernetes-validate's bundled Kubernetes JSON schemas.

    pip download --no-deps kubernetes-validate==1.37.0 -d /tmp/kv
    scripts/trim-k8s-schema.py /tmp/kv/kubernetes_validate-1.37.0-py3-none-any.whl v1.33.0

Keeps the two kinds `deploy --format k8s` renders (Deployment apps/v1, Service v1) and every
definition they reach, as the strict schemas have them (unknown fields refused), with the
descriptions dropped; references point into the one file.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

KINDS = {"Deployment": "deployment-apps-v1.json", "Service": "service-v1.json"}
PREFIX = "/api/_definitions.json#/$defs/"
OUT = Path(__file__).resolve().parent.parent / "knowledge" / "k8s" / "schema.json"


def strip(node: Any, refs: set[str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                continue
            if key == "$ref" and isinstance(value, str):
                name = value.removeprefix(PREFIX).removeprefix("#/$defs/")
                refs.add(name)
                out[key] = f"#/$defs/{name}"
                continue
            out[key] = strip(value, refs)
        return out
    if isinstance(node, list):
        return [strip(item, refs) for item in node]
    return node


def main() -> None:
    wheel, version = Path(sys.argv[1]), sys.argv[2]
    folder = f"kubernetes_validate/kubernetes-json-schema/{version}-local-strict/"
    with zipfile.ZipFile(wheel) as archive:
        definitions = json.loads(archive.read(folder + "_definitions.json"))["$defs"]
        roots = {kind: json.loads(archive.read(folder + name)) for kind, name in KINDS.items()}
    refs: set[str] = set()
    kinds = {kind: strip(schema, refs) for kind, schema in roots.items()}
    defs: dict[str, Any] = {}
    while refs - defs.keys():
        for name in sorted(refs - defs.keys()):
            defs[name] = strip(definitions[name], refs)
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "source": {
            "kubernetes": version,
            "from": f"kubernetes-validate {wheel.name.split('-')[1]} (PyPI, Apache-2.0), "
            f"{folder}: Kubernetes' OpenAPI definitions as JSON Schema, strict "
            "(additionalProperties: false)",
            "url": "https://github.com/willthames/kubernetes-validate",
            "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "trimmed": "the kinds below and the definitions they reach; descriptions dropped "
            "(scripts/trim-k8s-schema.py)",
        },
        "kinds": kinds,
        "$defs": dict(sorted(defs.items())),
    }
    OUT.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    print(f"wrote {OUT}: {len(defs)} definitions, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
