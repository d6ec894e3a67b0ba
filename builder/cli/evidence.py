"""`evidence`: what the registry holds for an image, every piece checked; shared printing."""

from __future__ import annotations

import json

import click

from builder.cli.app import Settings, cli, pass_settings, registry_option, user_errors
from builder.engine import imageref
from builder.errors import StackError
from builder.evidence.keys import fingerprint
from builder.evidence.reader import Evidence, read_evidence
from builder.image.registry import Registry


def print_verdicts(evidence: Evidence) -> None:
    """The verdicts a pull or pin relies on, as the registry's evidence gives them."""
    click.echo(f"evidence of {evidence.ref} ({evidence.found_by}):")
    verdicts = evidence.verdicts
    click.echo(f"  static: {verdicts.static or 'not run'}  (tests: {verdicts.tests or 'not run'})")
    if not verdicts.served:
        why = f": {verdicts.unserved}" if verdicts.unserved else ""
        click.echo(f"  served: never (no smoke ran the image's serve command{why})")
    for verdict in verdicts.served:
        speeds = (
            f"ttft {verdict.ttft_s} s, {verdict.single_stream_tok_s} tok/s single, "
            f"{verdict.batched_tok_s} tok/s batched"
        )
        compiles = ", ".join(f"{k} {n}" for k, n in sorted(verdict.compiles.items()) if n)
        click.echo(
            f"  served on {verdict.gpu_kind} x{verdict.gpu_count}"
            f"{' (compute ' + verdict.capability + ')' if verdict.capability else ''}, "
            f"driver {verdict.driver or 'unknown'}: {'passed' if verdict.passed else 'FAILED'}"
            f" ({verdict.source}, {verdict.at}); {speeds}; compiles: {compiles or 'none'}"
        )
    if evidence.floating_base:
        click.echo("  warning: built on a base image not pinned by digest (--allow-floating-base)")


def image_reference(image: str) -> str:
    """The tag or digest an IMAGE argument names: `sha256:…`, or by the one grammar
    (engine/imageref.py) `REPO@sha256:…`, `REPO:TAG@sha256:…` (the digest) or `REPO:TAG`;
    REPO may carry a registry port (`127.0.0.1:5000/sm120-stacks:TAG`). Bad input is a
    StackError naming the argument."""
    if imageref.DIGEST_RE.match(image):
        return image
    if image.startswith("sha256:"):
        raise StackError(f"{image} is not a sha256 digest (64 lower-case hex)", key="IMAGE")
    try:
        reference = imageref.parse(image).reference
    except ValueError as exc:
        raise StackError(str(exc), key="IMAGE") from None
    if reference is None:
        raise StackError(
            f"{image} names a repository but no tag or digest",
            key="IMAGE",
            hint="give REPO:TAG, REPO@sha256:DIGEST, a bare sha256: digest or a stack name",
        )
    return reference


@cli.command("evidence")
@click.argument("image")
@registry_option("The registry the image is in")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
@pass_settings
@user_errors
def evidence_cmd(settings: Settings, image: str, registry: str | None, as_json: bool) -> None:
    """What the registry holds for IMAGE (a stack: its current content; or a tag or sha256
    digest of the stacks' repository): verdicts, the GPU kinds it served on, an SBOM summary,
    the provenance, and (with a trust policy in the hosts folder) who signed them. Exit status
    2 when any of it cannot be relied on."""
    from builder.evidence.trust import host_policy

    source = Registry.parse(registry)
    trust = host_policy(settings.hosts_dir)
    if image.startswith("sha256:") or ":" in image or "@" in image:
        reference = image_reference(image)
        evidence = read_evidence(source, image, reference=reference, trust=trust)
    else:
        content_hash = settings.render(settings.resolve(image)).content_hash()
        evidence = read_evidence(source, image, content_hash, trust=trust)
    if as_json:
        click.echo(json.dumps(evidence.to_json(), indent=2, sort_keys=True))
        return
    print_verdicts(evidence)
    if evidence.sbom is not None:
        parts = ", ".join(f"{n} {k}" for k, n in evidence.sbom.items())
        click.echo(f"  sbom: {parts} components")
    if evidence.provenance is not None:
        definition = evidence.provenance["predicate"]["buildDefinition"]
        commit = next(
            (
                d["digest"]["gitCommit"]
                for d in definition.get("resolvedDependencies", [])
                if "gitCommit" in d.get("digest", {})
            ),
            "unknown",
        )
        click.echo(
            f"  provenance: stack {definition['externalParameters']['stack']}, tool commit "
            f"{commit}, engine {definition['internalParameters']['engine']}"
        )
    if trust is None:
        keys = ", ".join(f"{k[:16]} ({fingerprint(k)})" for k in evidence.signed_by) or "none"
        click.echo(
            f"  signed by: {keys}: each signature checked against the key published beside "
            "it; no trust.yaml in the hosts folder says whose word counts (pin trusts the "
            "build key on first use)"
        )
    else:
        names = [f"{trust.name_of(k) or 'key'} ({k[:16]})" for k in evidence.signed_by]
        click.echo(f"  signed by: {', '.join(names)} (trusted by {trust.path})")
