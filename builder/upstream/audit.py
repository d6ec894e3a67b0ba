"""`audit RELEASE --against STACK`: what a release breaks for a stack's GPUs, read from the
release's wheel and the stack's release's wheel (no GPU, no image build).

Findings: device code per library and kernel family (cuobjdump), requirements the stack's
indexes lack or that move, VLLM_* switches added/removed/newly raising, the knowledge's
citations (serve_switches.yaml) that moved, and the unquantized-MoE fallback list. Each finding
carries FILE:LINE in a wheel; the candidate knowledge entries come out as YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.errors import StackError
from builder.knowledge.loader import KNOWLEDGE_DIR
from builder.manifest.device_code import gpu_targets
from builder.manifest.resolve import ResolvedStack
from builder.upstream import source_audit as src
from builder.upstream.cuobjdump import find_cuobjdump
from builder.upstream.device_audit import DeviceFinding, LibraryRow, device_findings, scan_wheel
from builder.upstream.index import IndexClient
from builder.upstream.metadata import Target
from builder.upstream.stand_in import unresolved
from builder.upstream.wheelcache import release_wheel


@dataclass
class Audit:
    release: str  # vllm==0.34.0
    stack: str
    against: str  # the stack's release, vllm==0.33.0
    reader: str
    libraries: list[LibraryRow] = field(default_factory=list)
    device: list[DeviceFinding] = field(default_factory=list)
    findings: list[src.Finding] = field(default_factory=list)
    env_names: list[str] = field(default_factory=list)
    anchored: dict[str, list[str]] = field(default_factory=dict)

    def candidate(self) -> dict[str, Any]:
        """Knowledge entries for the release's minor series, as YAML the user pastes."""
        name, version = self.release.split("==")
        major, minor = (*Version(version).release, 0)[:2]
        lost = [f for f in self.device if f.lost > 0]
        return {
            "vllm_env_names.yaml": {
                "vllm": f">={major}.{minor},<{major}.{minor + 1}",
                "read": f"{name} {version} (sm120-stacks audit)",
                "names": self.env_names,
            },
            "device_code.yaml known:": {
                f.library: f"{name} {version}: {f.text} (against {self.against}; {f.where})"
                for f in lost
            },
            "serve_switches.yaml read_at": self.anchored,
            "findings": [f"{f.subject}: {f.text} ({f.where})" for f in self.findings],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "stack": self.stack,
            "against": self.against,
            "reader": self.reader,
            "libraries": [vars(row) for row in self.libraries],
            "device": [vars(f) for f in self.device],
            "findings": [vars(f) for f in self.findings],
            "candidate": self.candidate(),
        }


def parse_release(text: str) -> tuple[str, str]:
    name, sep, version = text.partition("==")
    if not sep or not name or not version:
        raise StackError(f"{text}: name a release as NAME==VERSION (vllm==0.34.0)", key="RELEASE")
    return name, version


def _pinned(stack: ResolvedStack, name: str) -> str | None:
    for package, pin in stack.manifest.python.packages.items():
        if canonicalize_name(package) == canonicalize_name(name):
            return str(pin.version)
    return None


def _knowledge_entry(file: str, version: str) -> dict[str, Any] | None:
    data = yaml.safe_load((KNOWLEDGE_DIR / file).read_text())
    for entry in data.get("versions", []):
        if Version(version) in SpecifierSet(entry["vllm"]):
            return dict(entry)
    return None


def _citations(entry: dict[str, Any] | None) -> dict[str, list[str]]:
    if not entry:
        return {}
    out = {entry["gate"]["id"]: list(entry["gate"].get("read_at", []))} if "gate" in entry else {}
    for switch in entry.get("switches", []):
        out[switch["id"]] = list(switch.get("read_at", []))
    return out


def _stand_in(new: src.WheelSource, missing: src.Finding, wheel: src.WheelSource) -> src.Finding:
    """The nearest newer release as a stand-in for a missing pin: the release's imports of it
    that resolve there (names, not signatures)."""
    count, lacking = unresolved(new, wheel, missing.subject)
    said = f"{missing.subject} {missing.stand_in} as a stand-in: "
    if not lacking:
        text = said + f"all {count} imports resolve (names only; signatures and behaviour unread)"
        return src.Finding("requirement", missing.subject, text, missing.where)
    first = lacking[0]
    text = said + f"{len(lacking)} of {count} imports do not resolve ({first.module} {first.name})"
    return src.Finding("requirement", missing.subject, text, first.where)


def audit(
    release: str,
    stack: ResolvedStack,
    client: IndexClient,
    build_dir: Path,
    *,
    device_code: bool = True,
) -> Audit:
    """Download (once) both wheels and read them; nothing is written outside build_dir."""
    name, version = parse_release(release)
    py = stack.manifest.python
    indexes = [py.index_url, *py.extra_index_urls]
    target = Target(stack.manifest.platform, py.version)
    cache = build_dir / "wheels"
    new_wheel = release_wheel(client, indexes, name, version, target, cache)
    pinned = _pinned(stack, name)
    old_wheel = (
        release_wheel(client, indexes, name, pinned, target, cache)
        if pinned and pinned != version
        else None
    )
    result = Audit(release, stack.name, f"{name}=={pinned}" if pinned else "-", "-")
    try:
        new, old = src.WheelSource(new_wheel.path), None
        old = src.WheelSource(old_wheel.path) if old_wheel else None
        stack_env = {k: str(v) for k, v in (stack.manifest.env or {}).items()}
        covered = _knowledge_entry("vllm_env_names.yaml", pinned) if pinned else None
        result.findings += src.requirement_findings(new, old, target, client, indexes)
        for missing in [f for f in result.findings if f.stand_in]:
            wheel = release_wheel(client, indexes, missing.subject, missing.stand_in, target, cache)
            result.findings.append(_stand_in(new, missing, src.WheelSource(wheel.path)))
        switches, result.env_names = src.switch_findings(
            new, old, stack_env, set(covered["names"]) if covered else set()
        )
        result.findings += switches
        if old is not None and pinned:
            cited = _citations(_knowledge_entry("serve_switches.yaml", pinned))
            moved, result.anchored = src.citation_findings(new, old, cited)
            result.findings += moved
        result.findings += src.removed_packages(new, old)
        result.findings += src.backend_findings(new, old)
    except (ValueError, KeyError, OSError) as exc:
        raise StackError(f"{new_wheel.path.name}: unreadable: {exc}", key="RELEASE") from None
    if device_code:
        tool = find_cuobjdump(build_dir / "tools")
        result.reader = f"cuobjdump ({tool})"
        scratch = build_dir / "audit"
        new_code = scan_wheel(tool, new_wheel.path, scratch)
        old_code = scan_wheel(tool, old_wheel.path, scratch) if old_wheel else None
        result.libraries, result.device = device_findings(
            new_wheel.path.name, new_code, old_code, gpu_targets(stack)
        )
    return result
