"""The three documents an image carries into the registry, each with its own media type.

- The verdict document (`VerdictDocument`, an image/verdicts.py `Verdicts`): the static
  verdict, every served verdict (GPU kind, driver, model, serve arguments, compiles by kind,
  speeds) and the whole test report they came from, naming the image digest it judged.
- An SBOM in CycloneDX 1.6 JSON, made with CycloneDX's own library: every Python package of
  the lock with its hashes (a stack without a lock: what the image's pip lists, without
  hashes, and the SBOM says so), the base image by digest, the OS packages of the image's dpkg
  status, and the precompiled JIT modules with their sha256.
- A provenance statement: an in-toto Statement v1 with an SLSA v1 provenance predicate (the
  manifest, lock and rendered Dockerfile by sha256, the project's git commit, the engine and
  the build client).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field, model_validator

from builder.engine import imageref
from builder.image.names import source_revision
from builder.image.records import Record
from builder.image.verdicts import Verdicts
from builder.knowledge.strict import Strict

if TYPE_CHECKING:
    from cyclonedx.model import HashType
    from cyclonedx.model.component import Component

VERDICT_TYPE = "application/vnd.sm120-stacks.verdict.v1+json"
SBOM_TYPE = "application/vnd.cyclonedx+json"
PROVENANCE_TYPE = "application/vnd.in-toto+json"
#: A host's runtime caches captured after a served smoke (builder/warm/): referrers of the image
#: like the evidence, but not evidence, and gigabytes: the evidence reader only counts them.
WARM_CACHE_TYPE = "application/vnd.sm120-stacks.warm-cache.v1"
VERDICT_SCHEMA = "https://sm120-stacks.dev/verdict/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
IN_TOTO_STATEMENT = "https://in-toto.io/Statement/v1"
BUILD_TYPE = "https://sm120-stacks.dev/buildtypes/stack/v1"
#: The annotation every artifact carries: which image (manifest digest) it speaks of.
SUBJECT_ANNOTATION = "dev.sm120-stacks.subject"
KIND_ANNOTATION = "dev.sm120-stacks.kind"
#: The signer's public key (PEM) beside a signed document: what first use may trust, never a
#: trust by itself (evidence/firstuse.py).
SIGNER_KEY_ANNOTATION = "dev.sm120-stacks.signer-key"


def canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class JudgedImage(Strict):
    repository: str
    digest: str


class VerdictDocument(Verdicts):
    """The verdict document: the image's `Verdicts` (static, served by GPU kind, why unserved)
    with the image it judged and the report they came from. Written by `push` (every verdict
    of the record) and by `smoke --url --record` (one served verdict, no static); read back and
    validated by evidence/reader.py, where a document that does not validate is refused."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    #: VERDICT_SCHEMA (evidence/reader.py checks it before the rest).
    schema_: str = Field(alias="schema")
    image: JudgedImage
    stack: str
    content_hash: str
    floating_base: bool = False
    report: dict[str, Any] | None = None
    #: When it was pushed (UTC): what evidence/reader.py orders documents by (`recency`).
    recorded_at: str

    @model_validator(mode="before")
    @classmethod
    def _derived_tests(cls, data: Any) -> Any:
        """`tests` is written for readers from before `Verdicts` (`Verdicts.tests`, derived
        from static and served): not read back."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k != "tests"}
        return data

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True) | {"tests": self.tests}


def verdict_document(
    digest: str,
    repository: str,
    record: Record,
    report: dict[str, Any] | None,
    floating_base: bool,
) -> dict[str, Any]:
    """What the image passed: record's verdicts, the report they came from, the digest."""
    verdicts = Verdicts(static=record.static, served=record.served, unserved=record.unserved)
    return VerdictDocument(
        schema_=VERDICT_SCHEMA,
        image=JudgedImage(repository=repository, digest=digest),
        stack=record.stack,
        content_hash=record.content_hash,
        static=verdicts.static,
        served=verdicts.served,
        unserved=verdicts.unserved,
        floating_base=floating_base,
        report=report,
        recorded_at=_now(),
    ).to_json()


@dataclass(frozen=True)
class ImageContents:
    """What the image holds, read from it (one container of the image, no network)."""

    #: (name, version, architecture) of each installed dpkg package.
    os_packages: tuple[tuple[str, str, str], ...]
    #: The distribution's ID (debian, ubuntu) from /etc/os-release, for the packages' purls.
    distro: str
    #: (path, sha256) of each precompiled JIT module file.
    jit_files: tuple[tuple[str, str], ...]
    #: (name, version) of each Python package pip lists in the image (a stack without a lock).
    pip_packages: tuple[tuple[str, str], ...] = ()


def parse_dpkg_status(text: str) -> list[tuple[str, str, str]]:
    """Installed packages of a dpkg status file: (name, version, architecture)."""
    found = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line.startswith(" "):
                fields[key.strip()] = value.strip()
        if fields.get("Package") and "installed" in fields.get("Status", "").split():
            found.append(
                (fields["Package"], fields.get("Version", ""), fields.get("Architecture", ""))
            )
    return sorted(found)


@dataclass
class SbomInputs:
    image: str
    digest: str
    #: (name, version, [sha256 hex...]) of each locked Python package.
    locked: list[tuple[str, str, list[str]]]
    #: (reference, digest or None) of each base image.
    bases: list[tuple[str, str | None]]
    contents: ImageContents
    notes: list[str] = field(default_factory=list)


def sbom(inputs: SbomInputs) -> bytes:
    """A CycloneDX 1.6 JSON document of the image (see the module's docstring)."""
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6

    bom = Bom()
    root = Component(
        name=inputs.image,
        version=inputs.digest,
        type=ComponentType.CONTAINER,
        bom_ref=f"image/{inputs.digest}",
        properties=[Property(name="sm120-stacks:note", value=n) for n in inputs.notes],
    )
    bom.metadata.component = root
    components = [
        *_python_components(inputs),
        *_base_components(inputs.bases),
        *_os_components(inputs.contents),
        *_jit_components(inputs.contents),
    ]
    seen: set[str] = set()
    for component in components:
        if str(component.bom_ref) not in seen:  # a package both locked and listed: once
            seen.add(str(component.bom_ref))
            bom.components.add(component)
    bom.register_dependency(root, list(bom.components))
    return JsonV1Dot6(bom).output_as_string(indent=None).encode()


def _sha256(hexes: list[str]) -> list[HashType]:
    from cyclonedx.model import HashAlgorithm, HashType

    return [HashType(alg=HashAlgorithm.SHA_256, content=h) for h in hexes]


def _python_components(inputs: SbomInputs) -> list[Component]:
    """The locked Python packages with their hashes, then those pip lists in the image."""
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    python = [(n, v, [h.removeprefix("sha256:") for h in hs]) for n, v, hs in inputs.locked]
    python += [(n, v, []) for n, v in inputs.contents.pip_packages]
    return [
        Component(
            name=name,
            version=version,
            type=ComponentType.LIBRARY,
            purl=PackageURL(type="pypi", name=name, version=version),
            hashes=_sha256(hexes),
            bom_ref=f"pypi/{name}@{version}",
        )
        for name, version, hexes in python
    ]


def _base_components(bases: list[tuple[str, str | None]]) -> list[Component]:
    """The base images, by digest where pinned."""
    from cyclonedx.model.component import Component, ComponentType

    components = []
    for reference, digest in bases:
        base = imageref.parse(reference)  # the lock's base references, checked by the grammar
        components.append(
            Component(
                name=base.repository,
                version=digest or base.digest or f"{base.tag or 'latest'} (not pinned by digest)",
                type=ComponentType.CONTAINER,
                bom_ref=f"base/{reference}",
            )
        )
    return components


def _os_components(contents: ImageContents) -> list[Component]:
    """The image's OS packages (dpkg's), as deb package URLs of its distro."""
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    return [
        Component(
            name=name,
            version=version,
            type=ComponentType.LIBRARY,
            purl=PackageURL(
                type="deb",
                namespace=contents.distro,
                name=name,
                version=version,
                qualifiers={"arch": arch} if arch else None,
            ),
            bom_ref=f"deb/{name}@{version}",
        )
        for name, version, arch in contents.os_packages
    ]


def _jit_components(contents: ImageContents) -> list[Component]:
    """The image's precompiled JIT modules, as files with their sha256."""
    from cyclonedx.model.component import Component, ComponentType

    return [
        Component(
            name=path, type=ComponentType.FILE, hashes=_sha256([digest]), bom_ref=f"jit/{path}"
        )
        for path, digest in contents.jit_files
    ]


def sbom_summary(document: dict[str, Any]) -> dict[str, int]:
    """How many components of each kind an SBOM lists (what `evidence` prints)."""
    counts = {"python": 0, "os": 0, "jit": 0, "base": 0}
    for component in document.get("components") or []:
        ref = str(component.get("bom-ref", ""))
        kind = ref.partition("/")[0]
        key = {"pypi": "python", "deb": "os", "jit": "jit", "base": "base"}.get(kind)
        if key is not None:
            counts[key] += 1
    return counts


def git_commit() -> str | None:
    """The project's commit the tool runs from (as the image labels name it); None outside a
    git checkout."""
    commit = source_revision()
    return commit if len(commit) == 40 else None


@dataclass
class ProvenanceInputs:
    repository: str
    digest: str
    stack: str
    content_hash: str
    files: dict[str, bytes]
    bases: list[tuple[str, str | None]]
    engine: str
    build_client: str
    commit: str | None
    started: str | None = None


def provenance(inputs: ProvenanceInputs) -> bytes:
    """An in-toto Statement v1 with an SLSA v1 provenance predicate of the image build."""
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in inputs.files.items()}
    dependencies: list[dict[str, Any]] = [
        {"uri": f"docker-image://{reference}", "digest": {"sha256": d.removeprefix("sha256:")}}
        if d
        else {"uri": f"docker-image://{reference}", "annotations": {"pinned": False}}
        for reference, d in inputs.bases
    ]
    if inputs.commit:
        dependencies.append(
            {"uri": "git+sm120-stacks", "digest": {"gitCommit": inputs.commit}, "name": "tool"}
        )
    statement = {
        "_type": IN_TOTO_STATEMENT,
        "subject": [
            {"name": inputs.repository, "digest": {"sha256": inputs.digest.removeprefix("sha256:")}}
        ],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "stack": inputs.stack,
                    "content_hash": inputs.content_hash,
                    "files": {name: {"sha256": d} for name, d in sorted(digests.items())},
                },
                "internalParameters": {
                    "engine": inputs.engine,
                    "build_client": inputs.build_client,
                },
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": "https://sm120-stacks.dev/builder"},
                "metadata": {"invocationId": inputs.content_hash, "finishedOn": _now()},
            },
        },
    }
    return canonical(statement)


__all__ = [
    "KIND_ANNOTATION",
    "PROVENANCE_TYPE",
    "SBOM_TYPE",
    "SUBJECT_ANNOTATION",
    "VERDICT_TYPE",
    "WARM_CACHE_TYPE",
    "ImageContents",
    "ProvenanceInputs",
    "SbomInputs",
    "VerdictDocument",
    "canonical",
    "git_commit",
    "parse_dpkg_status",
    "provenance",
    "sbom",
    "sbom_summary",
    "verdict_document",
]
