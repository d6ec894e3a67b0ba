"""A kernel cache's listing and its file names: which kernel files lie under a layout's folders
(knowledge/runtime_caches.yaml), with their sizes and digests, and what a kernel's file name
says (op family, shape, key digest). The listing itself runs as cache_listing.py, on this
machine's folder or inside a container (kernel_watch.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.manifest.runtime_caches import (
    CacheLayout,
)
from builder.render.context import VENV
from builder.verify import cache_listing


@dataclass(frozen=True)
class KernelName:
    """What a kernel's file name says: its op family, kind, shape key and key digest."""

    module: str | None
    arch: str | None
    kind: str | None
    shape: dict[str, int]
    digest: str | None

    def describe(self) -> str:
        if self.kind is None:
            return "(name not in the known grammar)"
        return " ".join([self.kind, *(f"{k}={v}" for k, v in self.shape.items())])

    def key(self) -> dict[str, Any]:
        """The shape key as the report's JSON carries it."""
        return {"kind": self.kind, **self.shape, "digest": self.digest}


def parse_module_dir(layout: CacheLayout, name: str) -> tuple[str, str] | None:
    """(op family, arch) of a module folder's name, e.g. b12x_moe_sm120a_cute_dsl."""
    match = re.match(layout.module_dir, name)
    return (match.group("module"), match.group("arch")) if match else None


def parse_kernel_name(layout: CacheLayout, module_dir: str, kernel: str) -> KernelName:
    """The shape key of kernel (a file name without .o) in module_dir, by the family's grammar."""
    parsed = parse_module_dir(layout, module_dir)
    module, arch = parsed if parsed else (None, None)
    family = layout.families.get(module or "")
    for kind, regex in (family.kinds if family else {}).items():
        match = re.match(regex, kernel)
        if match:
            groups = match.groupdict()
            digest = groups.pop("digest", None)
            shape = {k: int(v) for k, v in groups.items() if v is not None}
            return KernelName(module, arch, kind, shape, digest)
    return KernelName(module, arch, None, {}, None)


@dataclass(frozen=True)
class KernelFile:
    module_path: str
    module_dir: str
    kernel: str
    size: int
    mtime_ns: int
    #: The file's name, in the module folder or its kernel folder (kernel_dir).
    file: str = ""
    kernel_dir: str = ""

    @property
    def path(self) -> str:
        folder = f"{self.module_path}/{self.kernel_dir}" if self.kernel_dir else self.module_path
        return f"{folder}/{self.file or self.kernel + '.o'}"


@dataclass
class Listing:
    """One listing of a cache (cache_listing.py's output)."""

    root: str
    exists: bool
    modules: list[dict[str, Any]]
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Listing:
        return cls(data["root"], bool(data["exists"]), data["modules"], data.get("errors", []))

    def kernels(self, layout: CacheLayout) -> dict[str, KernelFile]:
        """Every kernel file by its path."""
        files = {}
        for module in self.modules:
            name = Path(module["path"]).name
            for item in module["kernels"]:
                match = re.match(layout.kernel_file, item["file"])
                if match is None:
                    continue
                kernel = KernelFile(
                    module["path"],
                    name,
                    match.group("kernel"),
                    int(item["size"]),
                    int(item["mtime_ns"]),
                    item["file"],
                    module.get("kernel_dir") or "",
                )
                files[kernel.path] = kernel
        return files

    def metas(self) -> dict[str, Any]:
        return {m["path"]: m.get("meta") for m in self.modules}


def list_directory(layout: CacheLayout, root: Path) -> Listing:
    """List a cache on this machine, from any folder on the way down to its module folders."""
    return Listing.from_json(cache_listing.list_cache(layout.listing_config(str(root))))


def listing_command(layout: CacheLayout, python: str = f"{VENV}/bin/python") -> list[str]:
    """argv that lists the cache of the server's own workspace, where the image's Python runs."""
    source = Path(cache_listing.__file__).read_text()
    return [python, "-c", source, json.dumps(layout.listing_config(), sort_keys=True)]
