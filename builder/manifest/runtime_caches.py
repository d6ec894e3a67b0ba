"""Where a package keeps the kernels it compiles on the GPU, and how it names them, read from
knowledge/runtime_caches.yaml: the schema of that file and the layouts a stack's pins select.

Field knowledge, read like the other knowledge files (manifest/): the smoke's watch of a cache
(verify/kernel_listing.py, kernel_cache.py, kernel_watch.py) is what uses it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import Annotated, Any

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from pydantic import AfterValidator, Field

from builder.knowledge.jitmodules import Specifier
from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict
from builder.knowledge.yamlsafe import YamlDocument
from builder.manifest.resolve import ResolvedStack

KNOWLEDGE_FILE = "runtime_caches.yaml"


#: A shape group's pattern: ASCII or Unicode decimal digits, at least one (int() reads them).
_DIGITS = re.compile(r"(?:\[0-9\]|\\d)(?:\+|\{[1-9][0-9]*(?:,[0-9]*)?\})?")
_NAMED_GROUP = re.compile(r"\(\?P<([A-Za-z_][A-Za-z0-9_]*)>")


def _compiled(value: str) -> re.Pattern[str]:
    try:
        return re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None


def _regex(value: str) -> str:
    _compiled(value)
    return value


def _with_groups(*required: str) -> Callable[[str], str]:
    """A regex that compiles and has the named groups the code reads from its match."""

    def check(value: str) -> str:
        missing = [name for name in required if name not in _compiled(value).groupindex]
        if missing:
            needed = ", ".join(f"(?P<{name}>...)" for name in required)
            raise ValueError(f"the regex has no group {missing[0]!r}: it needs {needed}")
        return value

    return check


def group_patterns(pattern: str) -> dict[str, str]:
    """The text of each named group of a regex that compiles: (?P<k>[0-9]+) -> {"k": "[0-9]+"}."""
    bodies: dict[str, str] = {}
    opened: list[tuple[str | None, int]] = []
    index, in_class = 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            index += 1
            index += pattern.startswith("^", index)
            index += pattern.startswith("]", index)  # a ] first in a class is literal
            continue
        elif char == "(":
            named = _NAMED_GROUP.match(pattern, index)
            if named is not None:
                opened.append((named.group(1), named.end()))
                index = named.end()
                continue
            opened.append((None, index + 1))
        elif char == ")":
            name, begin = opened.pop()
            if name is not None:
                bodies[name] = pattern[begin:index]
        index += 1
    return bodies


def _shape_regex(value: str) -> str:
    """A kernel kind's regex: every named group but `digest` is a shape value, read as an int."""
    _compiled(value)
    for name, body in group_patterns(value).items():
        if name != "digest" and not _DIGITS.fullmatch(body):
            raise ValueError(
                f"group {name!r} ({body}) must match digits only, as [0-9]+: the shape key's "
                "values are integers (only `digest` may hold other characters)"
            )
    return value


Regex = Annotated[str, AfterValidator(_regex)]
ModuleDirRegex = Annotated[str, AfterValidator(_with_groups("module", "arch"))]
KernelFileRegex = Annotated[str, AfterValidator(_with_groups("kernel"))]
ShapeRegex = Annotated[str, AfterValidator(_shape_regex)]


class _Workspace(Strict):
    env: str
    default: str
    below: str = ""
    #: Variables that name the cache's root itself, tried in order before `env`.
    direct: list[str] = Field(default_factory=list)


class _OpsDir(Strict):
    name: str
    regex: Regex


class _MetaFile(Strict):
    name: str
    keys: list[str] = Field(default_factory=list)


class KernelFamily(Strict):
    title: str
    #: kernel kind -> regex on the kernel's name; named groups: the shape key (digits) and
    #: `digest`.
    kinds: dict[str, ShapeRegex] = Field(min_length=1)
    fields: dict[str, str] = Field(default_factory=dict)
    notes: str = ""
    evidence: list[str] = Field(default_factory=list)


class CacheLayout(Strict):
    title: str
    package: str
    versions: Specifier
    workspace: _Workspace
    path: str
    ops_dir: _OpsDir
    #: Groups `module` and `arch`.
    module_dir: ModuleDirRegex
    #: The folder of a module folder that holds its kernel files ("" : the module folder).
    kernel_dir: str = ""
    #: Group `kernel`.
    kernel_file: KernelFileRegex
    #: What one kernel file is, for a layout without `families` to parse its names.
    kernel_title: str = ""
    meta_file: _MetaFile
    #: The runtime-compile kind (knowledge/runtime_compiles.yaml) whose log lines are this
    #: cache's compiles: a watch holds them against its listing.
    log_kind: str
    #: How the log names one kernel file ({module_dir}/{kernel}); None where its lines name
    #: something else (the autotuner names ops): only counted then, never matched.
    log_name: str | None = None
    #: The word for what a miss did: compiled, tuned.
    verb: str = "compiled"
    notes: str = ""
    evidence: list[str] = Field(default_factory=list)
    families: dict[str, KernelFamily] = Field(default_factory=dict)

    def applies_to(self, version: str) -> bool:
        return SpecifierSet(self.versions).contains(version, prereleases=True)

    def listing_config(self, root: str | None = None) -> dict[str, Any]:
        """The argument of cache_listing.py: a root given, or the server's own workspace."""
        return {
            "root": root or "",
            "root_direct": self.workspace.direct,
            "root_env": self.workspace.env,
            "root_default": self.workspace.default,
            "root_below": self.workspace.below,
            "ops_dir": self.ops_dir.name,
            "module_dir": self.module_dir,
            "kernel_dir": self.kernel_dir,
            "kernel_file": self.kernel_file,
            "meta_file": self.meta_file.name,
        }


class _CachesFile(Strict):
    caches: dict[str, CacheLayout]


@cache
def cache_layouts() -> dict[str, CacheLayout]:
    """knowledge/runtime_caches.yaml, checked (read once per process)."""
    return layouts_of(read_knowledge(KNOWLEDGE_FILE))


def layouts_of(doc: YamlDocument) -> dict[str, CacheLayout]:
    """The layouts a runtime_caches document holds, checked when read: each regex compiles and
    has the groups the code reads (module_dir: module, arch; kernel_file: kernel; a kind's shape
    groups match digits), so a bad entry is a StackError with file, key and line, not a
    traceback in the middle of a smoke."""
    return parse_document(doc, _CachesFile).caches


def pinned_version(stack: ResolvedStack, package: str) -> str | None:
    python = stack.manifest.python
    pins = {**python.packages, **python.overrides}
    versions = {canonicalize_name(name): pin.version for name, pin in pins.items()}
    return versions.get(canonicalize_name(package))


def layouts_for(stack: ResolvedStack) -> list[tuple[str, CacheLayout, str | None]]:
    """(id, layout, the stack's version of its package or None) of every layout whose package
    the stack pins."""
    out: list[tuple[str, CacheLayout, str | None]] = []
    for name, layout in cache_layouts().items():
        version = pinned_version(stack, layout.package)
        if version is not None:
            out.append((name, layout, version))
    return out
