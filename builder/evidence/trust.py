"""The trust policy: which public keys may vouch for what, read from HOSTS_DIR/trust.yaml.

A signature says only who signed; the policy says whose word counts for which purpose, the
way Sigstore's policy-controller and Kyverno's verifyImages name keys per image and in-toto
layouts name who may perform each step:

- `build`: the static verdict, the SBOM and the provenance (what `push` signs);
- `served`, per GPU kind: a served verdict (what `smoke --url --record` signs), so an
  operator's key for one GPU kind cannot vouch for another kind's smoke;
- `warm`, per GPU kind: warm-cache artifacts (what `cache capture` signs): they hold code the
  server loads, so a restore needs a key trusted for the host's GPU kind.

Several keys per purpose is rotation: a new key is added beside the old one, and the old one
taken out once nothing rests on it. A key taken out is revoked: evidence it signed no longer
counts. The file is read by the manifests' strict reader (file and line of every key), and its
JSON Schema is `sm120-stacks keys schema`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from builder.errors import StackError
from builder.evidence.keys import PublicKey, fingerprint, load_public_key
from builder.evidence.signing import Envelope, read_envelope, subject_digests
from builder.image.verdicts import gpu_kind_key
from builder.knowledge.loader import locate, validation_error
from builder.knowledge.strict import Strict
from builder.knowledge.yamlsafe import YamlDocument, dotted, load_yaml

POLICY_FILE = "trust.yaml"
POLICY_VERSION = 1
Purpose = Literal["build", "served", "warm"]
PURPOSES: tuple[Purpose, ...] = ("build", "served", "warm")
KeyName = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Purposes(Strict):
    """Who may vouch, per purpose: key names of `keys`."""

    build: list[str] = Field(default_factory=list, description="static verdict, SBOM, provenance")
    served: dict[str, list[str]] = Field(
        default_factory=dict, description="served verdicts, per GPU kind (nvidia-smi's name, cpu)"
    )
    warm: dict[str, list[str]] = Field(
        default_factory=dict, description="warm-cache artifacts, per GPU kind"
    )


class PolicyFile(Strict):
    """HOSTS_DIR/trust.yaml as written."""

    version: Literal[1] = Field(description="the policy format's version")
    keys: dict[str, str] = Field(
        description="key name -> public key PEM file (cosign's form), relative to this file"
    )
    purposes: Purposes


def policy_schema() -> dict[str, Any]:
    document = PolicyFile.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return document


#: What an unsigned document's refusal says: the two ways on.
UNSIGNED_HINT = (
    "two ways on: sign it (`sm120-stacks keys generate NAME`, then push --signing-key FILE; "
    "a host with no trust.yaml trusts that key on first use, or name it in HOSTS_DIR/trust.yaml),"
    " or --allow-unsigned (migration only: recorded in the pin, reported by drift)"
)


class Untrusted(StackError):
    """A document the policy does not let anyone vouch for: exit 2, nothing relied on."""


@dataclass(frozen=True)
class Vouched:
    """A document whose signature a key trusted for its purpose verified."""

    key_id: str
    key_name: str
    statement: dict[str, Any]


@dataclass(frozen=True)
class TrustPolicy:
    path: Path
    keys: dict[str, PublicKey]
    build: tuple[str, ...]
    served: dict[str, tuple[str, ...]] = field(default_factory=dict)
    warm: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def trusted(self, purpose: Purpose, gpu_kind: str | None = None) -> list[PublicKey]:
        """The keys that may vouch for purpose (served and warm: on gpu_kind)."""
        if purpose == "build":
            names: tuple[str, ...] = self.build
        else:
            per_kind = self.served if purpose == "served" else self.warm
            wanted = gpu_kind_key(gpu_kind or "")
            names = next((n for k, n in per_kind.items() if gpu_kind_key(k) == wanted), ())
        return [self.keys[name] for name in names]

    def name_of(self, key_id: str) -> str | None:
        for name, key in self.keys.items():
            if key.key_id == key_id:
                return name
        return None


def policy_path(hosts_dir: Path) -> Path:
    return hosts_dir / POLICY_FILE


def host_policy(hosts_dir: Path) -> TrustPolicy | None:
    """The hosts folder's trust policy; None where it has none (nothing is then verified)."""
    path = policy_path(hosts_dir)
    return load_policy(path) if path.exists() else None


def load_policy(path: Path) -> TrustPolicy:
    """Read and check the policy: every key file read, no key twice, no unknown name."""
    doc = load_yaml(path)
    try:
        written = PolicyFile.model_validate(doc.data)
    except ValidationError as exc:
        error = validation_error(exc, [doc])
        if exc.errors()[0]["type"] == "extra_forbidden" and (error.key or "").startswith(
            "purposes."
        ):
            error.message = f"unknown purpose (the purposes are {', '.join(PURPOSES)})"
            error.hint = None
        raise error from None
    keys = _read_keys(doc, written.keys)
    served = {
        kind: _names(doc, ("purposes", "served", kind), n, keys)
        for kind, n in written.purposes.served.items()
    }
    warm = {
        kind: _names(doc, ("purposes", "warm", kind), n, keys)
        for kind, n in written.purposes.warm.items()
    }
    build = _names(doc, ("purposes", "build"), written.purposes.build, keys)
    return TrustPolicy(path=path, keys=keys, build=build, served=served, warm=warm)


def _read_keys(doc: YamlDocument, files: dict[str, str]) -> dict[str, PublicKey]:
    keys: dict[str, PublicKey] = {}
    seen: dict[str, str] = {}
    for name, relative in files.items():
        key_path = ("keys", name)
        _, line = locate(key_path, [doc])
        try:
            key = load_public_key(doc.path.parent / relative)
        except StackError as exc:
            raise StackError(
                f"{relative}: {exc.message}",
                file=doc.path,
                key=dotted(key_path),
                line=line,
                hint=exc.hint,
            ) from None
        if key.key_id in seen:
            raise StackError(
                f"the same key as {seen[key.key_id]!r} (key id {key.key_id[:16]})",
                file=doc.path,
                key=dotted(key_path),
                line=line,
                hint="name each key once and list that name under every purpose it serves",
            )
        seen[key.key_id] = name
        keys[name] = key
    return keys


def _names(
    doc: YamlDocument, key_path: tuple[str, ...], names: list[str], keys: dict[str, PublicKey]
) -> tuple[str, ...]:
    for index, name in enumerate(names):
        at: tuple[str | int, ...] = (*key_path, index)
        _, line = locate(at, [doc])
        if name not in keys:
            raise StackError(
                f"no key named {name!r} in keys",
                file=doc.path,
                key=dotted(at),
                line=line,
                hint=f"the keys are: {', '.join(sorted(keys)) or 'none'}",
            )
        if name in names[:index]:
            raise StackError(f"key {name!r} listed twice", file=doc.path, key=dotted(at), line=line)
    return tuple(names)


def vouch(
    raw: bytes,
    *,
    document: str,
    predicate_type: str,
    digest: str,
    policy: TrustPolicy,
    purpose: Purpose,
    gpu_kind: str | None = None,
) -> Vouched:
    """The statement of envelope raw, once a key trusted for purpose (on gpu_kind) signed it,
    its predicate is predicate_type and its subject is the image digest; Untrusted naming the
    document, the key id and the reason otherwise. document: what to call it in a refusal."""
    envelope = read_envelope(raw, document)
    return vouch_envelope(
        envelope,
        envelope.statement(document),
        document=document,
        predicate_type=predicate_type,
        digest=digest,
        policy=policy,
        purpose=purpose,
        gpu_kind=gpu_kind,
    )


def vouch_envelope(
    envelope: Envelope,
    statement: dict[str, Any],
    *,
    document: str,
    predicate_type: str,
    digest: str,
    policy: TrustPolicy,
    purpose: Purpose,
    gpu_kind: str | None = None,
) -> Vouched:
    """vouch, for an envelope already parsed (statement: its payload's, parsed once): a
    document that claims several purposes is decoded once, not once a purpose."""
    where = purpose if gpu_kind is None else f"{purpose} on {gpu_kind}"
    if not envelope.signatures:
        raise _refused(document, None, "unsigned", policy)
    key = envelope.signed_by(policy.trusted(purpose, gpu_kind))
    if key is None:
        other = envelope.signed_by(list(policy.keys.values()))
        if other is not None:
            raise _refused(document, other.key_id, f"key not trusted for {where}", policy)
        named = envelope.signatures[0].key_id or None
        if named is not None and policy.name_of(named) is not None:
            raise _refused(document, named, "signature does not match the payload", policy)
        raise _refused(document, named, "unknown key (not in the trust policy)", policy)
    if statement.get("predicateType") != predicate_type:
        reason = f"predicate type {statement.get('predicateType')!r}, not {predicate_type}"
        raise _refused(document, key.key_id, reason, policy)
    if digest not in subject_digests(statement):
        raise _refused(document, key.key_id, f"subject is another image, not {digest}", policy)
    name = policy.name_of(key.key_id) or key.key_id
    return Vouched(key_id=key.key_id, key_name=name, statement=statement)


def _refused(document: str, key_id: str | None, reason: str, policy: TrustPolicy) -> Untrusted:
    key = "no key" if key_id is None else f"key {key_id[:16]}"
    name = policy.name_of(key_id) if key_id else None
    if name:
        key += f" ({name})"
    hint = (
        "only evidence signed by a key the trust policy names for this purpose counts; "
        "--allow-unsigned (recorded in the pin, reported by drift) is for migration only"
    )
    if key_id is None:
        hint = UNSIGNED_HINT
    elif name is None:
        key += f", fingerprint {fingerprint(key_id)}"
        hint = (
            f"{policy.path.name} does not name this key: if its owner rotated it on purpose "
            "(check the fingerprint with them, not with the registry), add its .pub under "
            "`keys:` and the purposes it signs for, beside or instead of the old one "
            "(`sm120-stacks keys check`); otherwise someone else signed this evidence: do not "
            "use the image"
        )
    return Untrusted(f"{document}: {reason} [{key}]", file=policy.path, hint=hint)
