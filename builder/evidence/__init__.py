"""Evidence beside each image in the registry: what the image passed, what it holds, how it
was made, bound to its digest.

An image's verdicts used to live in one machine's build/ folder, so an image pulled elsewhere
could not be pinned without testing it again, and nothing in the registry said what "tested"
had meant. Here each piece of evidence is an OCI artifact whose `subject` is the image's
manifest (the way `docker buildx` attaches SBOM and provenance attestations, and cosign and
ORAS attach theirs): the verdict document (`documents.verdict_document`), a CycloneDX SBOM and
an in-toto SLSA provenance statement. `oci` stores and lists them (the OCI 1.1 referrers API
where the registry has one, the distribution spec's `sha256-<hex>` tag scheme where it does
not); `reader` fetches them back and refuses what does not name the image or is not intact.
"""
