"""What a release's Python and metadata say, read from its wheel against the stack's release:
pins the stack's indexes lack or that move, VLLM_* names added, removed or newly raising, the
knowledge's FILE:LINE citations that moved or went, and the unquantized-MoE fallback list.

Every finding carries FILE:LINE in the wheel it was read from.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.upstream.index import IndexClient
from builder.upstream.metadata import Target, exact_version

ENV_NAME = re.compile(r"[\"'](VLLM_[A-Z0-9_]+)[\"']")
#: A `raise` this many lines below a name's mention counts as raising on that name.
RAISE_WITHIN = 8
CITATION = re.compile(r"^(?P<path>[\w./-]+\.py):(?P<first>\d+)(?:-(?P<last>\d+))?(?P<rest>.*)$")
FALLBACK = re.compile(r"if runner_backend not in (\[[^\]]*\])")
#: A folder that lost this many .py files (and half of its own) is reported.
GUTTED_FILES = 4
FALLBACK_FILE = "vllm/model_executor/layers/fused_moe/oracle/unquantized.py"


@dataclass(frozen=True)
class Finding:
    kind: str  # requirement | switch | citation | backend
    subject: str
    text: str
    where: str  # FILE:LINE in the wheel
    #: For a pin the indexes lack: the nearest newer release, to try as a stand-in.
    stand_in: str = ""


class WheelSource:
    """The text files of one wheel, read on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.archive = zipfile.ZipFile(path)
        self.names = set(self.archive.namelist())

    def lines(self, name: str) -> list[str] | None:
        if name not in self.names:
            return None
        return self.archive.read(name).decode("utf-8", "replace").splitlines()

    def metadata(self) -> tuple[str, list[str]]:
        found = [n for n in self.names if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        if not found:
            raise ValueError(f"{self.path.name}: no .dist-info/METADATA")
        return found[0], self.lines(found[0]) or []

    def python_files(self) -> list[str]:
        return sorted(n for n in self.names if n.endswith(".py"))


def _requires(source: WheelSource, target: Target) -> dict[str, tuple[Requirement, str]]:
    """name -> (requirement, METADATA:LINE) for the entries that hold on the target."""
    name, lines = source.metadata()
    out: dict[str, tuple[Requirement, str]] = {}
    for number, line in enumerate(lines, 1):
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            requirement = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(
            target.environment("")
        ):
            continue
        out[canonicalize_name(requirement.name)] = (requirement, f"{name}:{number}")
    return out


def requirement_findings(
    new: WheelSource,
    old: WheelSource | None,
    target: Target,
    client: IndexClient,
    indexes: list[str],
) -> list[Finding]:
    """Each exact pin the indexes lack (with the nearest versions), and each pin that moved."""
    findings: list[Finding] = []
    now = _requires(new, target)
    before = _requires(old, target) if old else {}
    for key, (requirement, where) in sorted(now.items()):
        pinned = exact_version(requirement)
        if pinned is not None:
            available = sorted(
                {v for p in client.projects(indexes, requirement.name) for v in p.available()}
            )
            if Version(pinned) not in available:
                lower = [v for v in available if v < Version(pinned)][-1:]
                higher = [v for v in available if v > Version(pinned)][:1]
                near = ", ".join(str(v) for v in [*lower, *higher]) or "none at all"
                text = (
                    f"{requirement.name}=={pinned} is not on {', '.join(indexes)} "
                    f"(nearest: {near})"
                )
                stand_in = str(higher[0]) if higher else ""
                findings.append(Finding("requirement", requirement.name, text, where, stand_in))
        old_requirement = before.get(key)
        if old is not None and old_requirement is None:
            text = f"new requirement {requirement}"
            findings.append(Finding("requirement", requirement.name, text, where))
        elif old_requirement and str(old_requirement[0].specifier) != str(requirement.specifier):
            text = f"moves: {old_requirement[0].specifier} -> {requirement.specifier}"
            findings.append(Finding("requirement", requirement.name, text, where))
    for key, (requirement, where) in sorted(before.items()):
        if key not in now:
            findings.append(Finding("requirement", requirement.name, "dropped", where))
    return findings


def env_names(source: WheelSource) -> dict[str, str]:
    """Every VLLM_* string literal in the wheel's Python: name -> its first FILE:LINE (the rule
    knowledge/vllm_env_names.yaml was made by)."""
    out: dict[str, str] = {}
    for name in source.python_files():
        for number, line in enumerate(source.lines(name) or [], 1):
            for found in ENV_NAME.finditer(line):
                out.setdefault(found.group(1), f"{name}:{number}")
    return out


def raising_names(source: WheelSource) -> dict[str, tuple[str, str]]:
    """Names a start refuses, name -> (FILE:LINE, what it says): the keys of envs.py's
    removed_environment_variables, and names compared in a line with a `raise` within
    RAISE_WITHIN lines below it."""
    out: dict[str, tuple[str, str]] = {}
    envs = source.lines("vllm/envs.py") or []
    inside = False
    for number, line in enumerate(envs, 1):
        if line.startswith("removed_environment_variables"):
            inside = True
        elif inside and line.startswith("}"):
            inside = False
        elif inside and (found := re.match(r"\s+[\"'](VLLM_[A-Z0-9_]+)[\"']\s*:", line)):
            quoted = _quoted(envs[number - 1 : number + 3])
            said = " ".join(part for part in quoted if part != found.group(1))
            out[found.group(1)] = (f"vllm/envs.py:{number}", said)
    for name in source.python_files():
        lines = source.lines(name) or []
        for number, line in enumerate(lines, 1):
            found = re.search(r"==\s*[\"'](VLLM_[A-Z0-9_]+)[\"']", line)
            if not found:
                continue
            below = lines[number : number + RAISE_WITHIN]
            raised = [i for i, text in enumerate(below, number + 1) if "raise " in text]
            if raised:
                said = " ".join(_quoted(lines[raised[0] - 1 : raised[0] + 3]))
                end = _statement_end(lines, raised[0])
                out.setdefault(found.group(1), (f"{name}:{number}-{end}", said))
    return out


def _statement_end(lines: list[str], first: int) -> int:
    """The last line (1-based) of the statement starting on line `first`: where its
    parentheses close (within 20 lines)."""
    depth = 0
    for number in range(first, min(len(lines), first + 20) + 1):
        depth += lines[number - 1].count("(") - lines[number - 1].count(")")
        if depth <= 0:
            return number
    return first


def _quoted(lines: list[str]) -> list[str]:
    """The string literals of these lines that read as words (a raise's message)."""
    return [
        part.strip()
        for line in lines
        for part in re.findall(r"[\"']([A-Za-z`][^\"']{11,})[\"']", line)
    ]


def switch_findings(
    new: WheelSource, old: WheelSource | None, stack_env: dict[str, str], covered: set[str]
) -> tuple[list[Finding], list[str]]:
    """VLLM_* names added, removed and newly raising, against the old wheel, the stack's env
    and the names knowledge/vllm_env_names.yaml holds for the old release; and the new
    release's full list (the candidate vllm_env_names entry)."""
    findings: list[Finding] = []
    now = env_names(new)
    before = env_names(old) if old else {}
    raising_now = raising_names(new)
    raising_before = raising_names(old) if old else {}
    for name in sorted(set(before) - set(now)):
        said = " (the stack's env sets it)" if name in stack_env else ""
        findings.append(Finding("switch", name, f"removed{said}", before[name]))
    for name in sorted(set(now) - set(before)) if old else []:
        findings.append(Finding("switch", name, "added", now[name]))
    for name, (where, message) in sorted(raising_now.items()):
        if name in raising_before:
            continue
        said = "; the stack's env sets it: the start fails" if name in stack_env else ""
        text = f"newly raises at start{said}: {message[:200]}"
        findings.append(Finding("switch", name, text, where))
    for name in sorted(set(stack_env) - set(now)):
        if name.startswith("VLLM_"):
            text = "the stack's env sets it, the release does not read it"
            findings.append(Finding("switch", name, text, "-"))
    if covered and old:
        for name in sorted(set(before) - covered):
            text = "in the stack's release but not in knowledge/vllm_env_names.yaml"
            findings.append(Finding("switch", name, text, before[name]))
    return findings, sorted(now)


def citation_findings(
    new: WheelSource, old: WheelSource, citations: dict[str, list[str]]
) -> tuple[list[Finding], dict[str, list[str]]]:
    """Each knowledge citation (`path:first-last (what)`) of the old release looked up in the
    new: the same lines where they were, moved (their new lines), or gone; and the citations
    re-anchored for a candidate entry of the new release (gone ones left out)."""
    findings: list[Finding] = []
    anchored: dict[str, list[str]] = {}
    for owner, cited in citations.items():
        for citation in cited:
            found = CITATION.match(citation)
            old_lines = old.lines(found.group("path")) if found else None
            if not found or old_lines is None:
                continue
            path, first = found.group("path"), int(found.group("first"))
            last = int(found.group("last") or first)
            block = [line.strip() for line in old_lines[first - 1 : last]]
            new_lines = [line.strip() for line in new.lines(path) or []]
            at = _find(new_lines, block, first - 1)
            if at is None:
                text = f"{owner}: the cited lines are gone or changed"
                findings.append(Finding("citation", citation, text, f"{path}:{first}-{last}"))
                continue
            span = f"{at + 1}-{at + len(block)}" if len(block) > 1 else f"{at + 1}"
            anchored.setdefault(owner, []).append(f"{path}:{span}{found.group('rest')}")
            if at != first - 1:
                text = f"{owner}: moved to {path}:{span}"
                findings.append(Finding("citation", citation, text, f"{path}:{span}"))
    return findings, anchored


def _find(lines: list[str], block: list[str], hint: int) -> int | None:
    """Where block starts in lines, the start nearest hint first."""
    if not block:
        return None
    starts = [i for i, line in enumerate(lines) if line == block[0]]
    for start in sorted(starts, key=lambda i: abs(i - hint)):
        if lines[start : start + len(block)] == block:
            return start
    return None


def removed_packages(new: WheelSource, old: WheelSource | None) -> list[Finding]:
    """Python packages the new release removed or gutted: a folder that lost at least
    GUTTED_FILES of its .py files and at least half of them, named once at its top-most such
    folder (vllm/v1/spec_decode/ in 0.34.0: Model Runner V1's proposers)."""
    if old is None:
        return []
    kept = set(new.python_files())
    lost: dict[str, list[str]] = {}
    total: dict[str, int] = {}
    for name in old.python_files():
        parts = name.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth])
            total[folder] = total.get(folder, 0) + 1
            if name not in kept:
                lost.setdefault(folder, []).append(name)
    gutted = {
        f for f, names in lost.items() if len(names) >= GUTTED_FILES and 2 * len(names) >= total[f]
    }
    findings = []
    for folder in sorted(gutted):
        if any(folder.startswith(other + "/") for other in gutted):
            continue
        names = lost[folder]
        text = f"removed {len(names)} of its {total[folder]} Python files (first: {names[0]})"
        findings.append(Finding("module", folder + "/", text, f"{names[0]}:1 (old release)"))
    return findings


def backend_findings(new: WheelSource, old: WheelSource | None) -> list[Finding]:
    """The backends an unquantized MoE layer (an unquantized MTP draft) lets fall back to auto;
    any other named --moe-backend raises for it."""
    findings: list[Finding] = []
    for label, source in (("new", new), ("old", old)):
        lines = source.lines(FALLBACK_FILE) if source else None
        for number, line in enumerate(lines or [], 1):
            if found := FALLBACK.search(line):
                text = (
                    f"{label}: an unquantized MoE layer (an unquantized MTP draft) falls back to "
                    f"auto for {found.group(1)}; every other named backend raises"
                )
                findings.append(
                    Finding("backend", "moe fallback", text, f"{FALLBACK_FILE}:{number}")
                )
    return findings


def version_of(source: WheelSource) -> str:
    name, lines = source.metadata()
    return HeaderParser().parsestr("\n".join(lines)).get("Version", "?")
