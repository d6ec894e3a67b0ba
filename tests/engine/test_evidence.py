"""Evidence travels with the image: verdicts, SBOM and provenance in the real local registry
(Debian's docker-registry 2.8, which has no referrers API: the referrers tag scheme), read back
and checked by a build folder that has no records of the image. The images are variants of the
tiny stack (stacks/ci-tiny.yaml): the subject is the evidence, not what the image holds."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.evidence import documents
from builder.evidence.oci import ArtifactStore, Descriptor
from builder.evidence.reader import read_evidence
from builder.image.names import content_tag
from builder.image.records import CPU, ServedVerdict, load_record, save_record
from builder.image.registry import Registry
from tests.engine.conftest import clone_workspace, unique

pytestmark = pytest.mark.engine
EV_CPU = unique("ev-cpu")
EV_OTHER = unique("ev-other")
EV_TAMPER = unique("ev-tamper")
EV_GPU = unique("ev-gpu")
EV_URL = unique("ev-url")
EV_OLD = unique("ev-old")
EV_BAD = unique("ev-bad")
#: Where scripts/host-setup.sh keeps the local registry's blobs.
REGISTRY_DATA = Path("/var/lib/sm120-stacks/registry")


def _served(kind: str = CPU, passed: bool = True) -> ServedVerdict:
    return ServedVerdict(
        gpu_kind=kind,
        gpu_count=0 if kind == CPU else 1,
        model_id="/models/tiny",
        serve_args=["transformers", "serve", "/models/tiny"],
        compiles={"flashinfer": 0},
        ttft_s=0.2,
        passed=passed,
        source="test",
        at="2026-12-01T00:00:00Z",
    )


@pytest.fixture
def second_folder(workspace: Path, tmp_path: Path) -> Iterator[Path]:
    """A second clone's workspace: the same stacks, its own (empty) build folder."""
    yield clone_workspace(workspace, tmp_path / "clone")


def _pushed_with_evidence(
    name: str,
    variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    served: list[ServedVerdict],
    body: str = "env:\n  EVIDENCE_TEST: '1'",
    signing_key: Path | None = None,
) -> str:
    """The variant built, recorded as `test` would, pushed with its evidence (signed with
    signing_key where given): its digest."""
    variant(name, body)
    cli_process("build", name)
    from builder.manifest.resolve import resolve
    from builder.render.context import render

    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    record = load_record(workspace / "build", name, content_hash)
    record.static, record.served = "passed", served
    save_record(workspace / "build", record)
    signing = ("--signing-key", str(signing_key)) if signing_key else ()
    pushed = cli_process("push", name, "--registry", registry.host, *signing)
    assert "evidence: verdict" in pushed.stderr and "evidence: sbom" in pushed.stderr
    return pushed.stdout.strip().splitlines()[0].rpartition("@")[2]


def _share(name: str, workspace: Path, folder: Path) -> None:
    """The variant's manifest in the second clone too (it is committed there, say)."""
    shutil.copy(workspace / "stacks" / f"{name}.yaml", folder / "stacks" / f"{name}.yaml")


#: The commands that rely on registry evidence. This module's pushes are unsigned (its subject
#: is what evidence says, and how a bad document is refused), so they run with
#: --allow-unsigned: with no trust.yaml unsigned evidence is refused (issue 43,
#: tests/engine/test_safe_default.py), and allowed, every document is still read and checked.
RELYING = ("pin", "pull", "--pull-or-build")


def _run_in(folder: Path, cli_process: Callable[..., Any], *args: str, check: bool = True) -> Any:
    if any(word in args for word in RELYING):
        args = (*args, "--allow-unsigned")
    return cli_process(
        "--stacks-dir",
        str(folder / "stacks"),
        "--build-dir",
        str(folder / "build"),
        *args,
        check=check,
    )


def _pip_listed(api: Any, workspace: Path, name: str) -> list[dict[str, str]]:
    """What pip lists in the stack's current image, read from a container of it."""
    from builder.image.names import local_ref
    from builder.manifest.resolve import resolve
    from builder.render.context import render

    ref = local_ref(name, render(resolve(name, workspace / "stacks")).content_hash())
    argv = ["python3", "-m", "pip", "list", "--format=json"]
    listed = json.loads(api.containers.run(ref, argv, entrypoint=[], remove=True))
    assert {"name": "six", "version": "1.17.0"} in listed, listed
    return list(listed)


def test_push_from_one_folder_pin_from_another_with_no_records(
    api: Any,
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    second_folder: Path,
    tmp_path: Path,
) -> None:
    digest = _pushed_with_evidence(
        EV_CPU, tiny_variant, cli_process, workspace, registry, [_served()]
    )
    _share(EV_CPU, workspace, second_folder)
    assert not (second_folder / "build" / EV_CPU).exists()
    hosts = tmp_path / "hosts"
    pinned = _run_in(
        second_folder,
        cli_process,
        "pin",
        unique("hostx"),
        EV_CPU,
        "--registry",
        registry.host,
        "--gpus",
        "none",
        "--hosts-dir",
        str(hosts),
    )
    assert f"@{digest}" in pinned.stdout and "static: passed" in pinned.stdout
    assert "served on cpu" in pinned.stdout and "referrers tag" in pinned.stdout
    pin = (hosts / f"{unique('hostx')}.yaml").read_text()
    assert digest in pin and "served_on: cpu" in pin
    shown = _run_in(
        second_folder, cli_process, "evidence", EV_CPU, "--registry", registry.host, "--json"
    )
    evidence = json.loads(shown.stdout)
    assert evidence["static"] == "passed" and evidence["found_by"] == "referrers tag"
    # Every Python distribution the image holds (ci-mini's "more than 10" was its torch and
    # transformers; the tiny stack holds pip, setuptools and six: the SBOM must list exactly
    # what pip lists in the image), and the OS's dpkg packages.
    assert evidence["sbom"]["python"] == len(_pip_listed(api, workspace, EV_CPU)) >= 3
    assert evidence["sbom"]["os"] > 50
    assert evidence["sbom"]["base"] >= 1  # build and runtime base, once where they are one
    predicate = evidence["provenance"]["predicate"]["buildDefinition"]
    assert f"stacks/{EV_CPU}.yaml" in predicate["externalParameters"]["files"]
    # The registry has no referrers API; the fallback tag lists all three artifacts.
    store = ArtifactStore(registry)
    assert not store.has_referrers_api
    kinds = {a.annotation(documents.KIND_ANNOTATION) for a in store.referrers(digest)[0]}
    assert kinds == {"verdict", "sbom", "provenance"}
    # build --pull-or-build in the second folder reads the evidence as pull does, and records
    # its verdicts there; so does pull.
    from builder.manifest.resolve import resolve
    from builder.render.context import render

    content_hash = render(resolve(EV_CPU, second_folder / "stacks")).content_hash()
    kept = second_folder / "build"
    for args in (("build", EV_CPU, "--pull-or-build"), ("pull", EV_CPU)):
        pulled = _run_in(second_folder, cli_process, *args, "--registry", registry.host)
        assert "static: passed" in pulled.stdout and "served on cpu" in pulled.stdout
        assert "building" not in pulled.stdout
        record = load_record(kept, EV_CPU, content_hash)
        assert record.static == "passed" and [v.gpu_kind for v in record.served] == [CPU]
        assert record.pushed == {registry.repository: f"{registry.repository}@{digest}"}


def test_a_report_naming_another_digest_is_refused(
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
) -> None:
    digest = _pushed_with_evidence(
        EV_OTHER,
        tiny_variant,
        cli_process,
        workspace,
        registry,
        [_served()],
        body="env:\n  EVIDENCE_TEST: '2'",
    )
    store = ArtifactStore(registry)
    subject = store.image(digest)
    forged = {
        "schema": documents.VERDICT_SCHEMA,
        "image": {"repository": registry.repository, "digest": "sha256:" + "ab" * 32},
        "static": "passed",
    }
    store.attach(
        subject,
        documents.VERDICT_TYPE,
        documents.VERDICT_TYPE,
        documents.canonical(forged),
        {documents.SUBJECT_ANNOTATION: digest},
    )
    with pytest.raises(Exception, match="is a report for sha256:abab"):
        read_evidence(registry, EV_OTHER, reference=digest)


def test_a_malformed_verdict_document_is_refused_naming_it(
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    second_folder: Path,
) -> None:
    """A document of the verdict schema, naming the image, whose served verdict lacks its
    fields (a hand-made or foreign document): `pull` and `build --pull-or-build` refuse the
    evidence, exit 2, naming the document, and pull nothing."""
    digest = _pushed_with_evidence(
        EV_BAD,
        tiny_variant,
        cli_process,
        workspace,
        registry,
        [],
        body="env:\n  EVIDENCE_TEST: '4'",
    )
    _share(EV_BAD, workspace, second_folder)
    store = ArtifactStore(registry)
    malformed = {
        "schema": documents.VERDICT_SCHEMA,
        "image": {"repository": registry.repository, "digest": digest},
        "stack": EV_BAD,
        "content_hash": "0" * 64,
        "served": [{"gpu_kind": "NVIDIA H200", "passed": "very"}],
        "recorded_at": "2026-12-02T00:00:00Z",
    }
    attached = store.attach(
        store.image(digest),
        documents.VERDICT_TYPE,
        documents.VERDICT_TYPE,
        documents.canonical(malformed),
        {documents.SUBJECT_ANNOTATION: digest},
    )
    for args in (("pull", EV_BAD), ("build", EV_BAD, "--pull-or-build")):
        result = _run_in(
            second_folder, cli_process, *args, "--registry", registry.host, check=False
        )
        assert result.returncode == 2, result.stdout + result.stderr
        said = " ".join(result.stderr.split())
        assert f"verdict {attached.digest} does not validate: served.0." in said
        assert "Traceback" not in result.stderr and "building" not in result.stdout
        assert not list((second_folder / "build").glob(f"{EV_BAD}/records/*.json"))


def test_a_tampered_sbom_is_refused(
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    second_folder: Path,
) -> None:
    if not REGISTRY_DATA.is_dir():
        pytest.skip(f"the registry's storage is not at {REGISTRY_DATA}")
    digest = _pushed_with_evidence(
        EV_TAMPER,
        tiny_variant,
        cli_process,
        workspace,
        registry,
        [_served()],
        body="env:\n  EVIDENCE_TEST: '3'",
    )
    _share(EV_TAMPER, workspace, second_folder)
    store = ArtifactStore(registry)
    (sbom,) = [
        a for a in store.referrers(digest)[0] if a.annotation(documents.KIND_ANNOTATION) == "sbom"
    ]
    layer = Descriptor.of(store.manifest(sbom)["layers"][0])
    hexdigest = layer.digest.removeprefix("sha256:")
    (blob,) = REGISTRY_DATA.glob(
        f"docker/registry/v2/blobs/sha256/{hexdigest[:2]}/{hexdigest}/data"
    )
    original = blob.read_bytes()
    try:
        blob.write_bytes(original.replace(b'"name"', b'"nAme"', 1))
        result = _run_in(
            second_folder,
            cli_process,
            "pin",
            unique("hostt"),
            EV_TAMPER,
            "--registry",
            registry.host,
            "--gpus",
            "none",
            check=False,
        )
        assert result.returncode == 2, result.stdout + result.stderr
        assert "is not intact" in result.stderr and "Traceback" not in result.stderr
        assert not (second_folder / "hosts" / f"{unique('hostt')}.yaml").exists()
    finally:
        blob.write_bytes(original)


def test_an_image_pushed_without_evidence_is_refused_with_the_remedy(
    cli_process: Callable[..., Any],
    registry: Registry,
    second_folder: Path,
    api: Any,
    local_base: str,
) -> None:
    """As an image pushed before this change: in the registry under its content tag, with no
    artifact referring to it."""
    from builder.manifest.resolve import resolve
    from builder.render.context import render

    (second_folder / "stacks" / f"{EV_OLD}.yaml").write_text(
        "extends: ci-tiny\nenv:\n  EVIDENCE_TEST: 'old'\n"
    )
    content_hash = render(resolve(EV_OLD, second_folder / "stacks")).content_hash()
    target = registry.ref(content_tag(EV_OLD, content_hash))
    api.images.get(local_base).tag(target)
    for line in api.images.push(target, stream=True, decode=True):
        assert "error" not in line, line
    result = _run_in(
        second_folder,
        cli_process,
        "pin",
        unique("hosto"),
        EV_OLD,
        "--registry",
        registry.host,
        "--gpus",
        "none",
        check=False,
    )
    assert result.returncode == 2
    assert "holds no verdict" in result.stderr and f"push {EV_OLD}" in result.stderr
    assert "a push whose evidence failed" in result.stderr, "the case the tool itself makes"
    assert f"--registry {registry.host}` again" in result.stderr, "the user's own option"
    assert not (second_folder / "hosts" / f"{unique('hosto')}.yaml").exists()


def test_a_gpu_stack_with_a_static_verdict_only_needs_allow_unserved(
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    second_folder: Path,
    tmp_path: Path,
) -> None:
    gpu = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    body = "env:\n  EVIDENCE_TEST: 'gpu'\nsmoke:\n  needs_gpu: true"
    digest = _pushed_with_evidence(
        EV_GPU, tiny_variant, cli_process, workspace, registry, [], body=body
    )
    _share(EV_GPU, workspace, second_folder)
    hosts = tmp_path / "hosts"
    args = (
        "pin",
        unique("hostg"),
        EV_GPU,
        "--registry",
        registry.host,
        "--gpu-kind",
        gpu,
        "--hosts-dir",
        str(hosts),
    )
    refused = _run_in(second_folder, cli_process, *args, check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "no passing served verdict on" in refused.stderr and gpu in refused.stderr
    assert not (hosts / f"{unique('hostg')}.yaml").exists()
    allowed = _run_in(second_folder, cli_process, *args, "--allow-unserved")
    assert "--allow-unserved" in allowed.stderr
    pin = (hosts / f"{unique('hostg')}.yaml").read_text()
    assert digest in pin and "allow_unserved: true" in pin
    listed = _run_in(
        second_folder,
        cli_process,
        "verify",
        unique("hostg"),
        "--hosts-dir",
        str(hosts),
        check=False,
    )
    assert "unserved" in listed.stdout


def test_a_deployed_hosts_smoke_records_a_served_verdict_for_its_gpu_kind(
    tiny_variant: Callable[[str, str], str],
    cli_process: Callable[..., Any],
    workspace: Path,
    registry: Registry,
    second_folder: Path,
    tmp_path: Path,
) -> None:
    """`smoke --url --record` against a server of the image (here a stand-in answering the
    stack's prompts): its verdict joins the image's evidence, and a host of that GPU kind can
    then be pinned from a folder with no records. The stand-in is no container of this engine,
    so the smoke names the digest the server runs (--image, issue 43: a verdict is recorded
    for what the server runs, never for whatever the content tag names now)."""
    from tests.support.fake_chat import Behaviour, fake_chat_server, url_of

    gpu = "NVIDIA H200"
    body = "env:\n  EVIDENCE_TEST: 'url'\nsmoke:\n  needs_gpu: true"
    digest = _pushed_with_evidence(EV_URL, tiny_variant, cli_process, workspace, registry, [], body)
    _share(EV_URL, workspace, second_folder)
    with fake_chat_server(Behaviour(answers=True)) as server:
        smoked = cli_process(
            "smoke",
            EV_URL,
            "--url",
            url_of(server),
            "--record",
            "--registry",
            registry.host,
            "--gpu-kind",
            gpu,
            "--image",
            f"{registry.repository}@{digest}",
        )
    assert f"recorded: served on {gpu} (passed)" in smoked.stderr
    hosts = tmp_path / "hosts"
    pinned = _run_in(
        second_folder,
        cli_process,
        "pin",
        unique("hosth"),
        EV_URL,
        "--registry",
        registry.host,
        "--gpu-kind",
        gpu.lower(),
        "--hosts-dir",
        str(hosts),
    )
    assert f"served on {gpu} x1" in pinned.stdout and "(smoke --url" in pinned.stdout
    pin = (hosts / f"{unique('hosth')}.yaml").read_text()
    assert digest in pin and f"served_on: {gpu}" in pin and "allow_unserved: false" in pin
    other = _run_in(
        second_folder,
        cli_process,
        "pin",
        unique("hostb"),
        EV_URL,
        "--registry",
        registry.host,
        "--gpu-kind",
        "NVIDIA GeForce RTX 5090",
        "--hosts-dir",
        str(hosts),
        check=False,
    )
    assert other.returncode == 2 and "served on: NVIDIA H200 (passed)" in other.stderr
