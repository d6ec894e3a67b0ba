"""List the module folders of a runtime kernel cache: the standard library only, so the same file
runs here on a directory of this machine and, as `python -c`, inside a container of an image.

It knows no layout: the one argument is a JSON object (builder/verify/kernel_listing.py builds it
from knowledge/runtime_caches.yaml) with the root (or the variables naming it: ones that name it
itself, else one with its default and the path below it), the name of the folder that holds
module folders, regexes for a module folder's name and a kernel file's name, and the folder of a
module that holds its kernel files where the layout has one (entries/). It prints one JSON
object: each module folder found with its meta file's content, and each kernel file with its
size and mtime in nanoseconds.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any


def list_cache(config: dict[str, Any]) -> dict[str, Any]:
    root = config.get("root") or ""
    for name in config.get("root_direct") or []:  # variables that name the root itself
        root = root or os.environ.get(name, "")
    if not root:
        base = os.environ.get(config.get("root_env") or "", "") or config.get("root_default", "~")
        root = os.path.join(os.path.expanduser(base), config.get("root_below", ""))
    root = os.path.abspath(root)
    module_re = re.compile(config["module_dir"])
    kernel_re = re.compile(config["kernel_file"])
    listing: dict[str, Any] = {"root": root, "exists": os.path.isdir(root), "modules": []}
    errors: list[str] = []
    if not listing["exists"]:
        listing["errors"] = errors
        return listing
    for ops in _ops_dirs(root, config["ops_dir"], int(config.get("max_depth", 8)), errors):
        try:
            names = sorted(os.listdir(ops))
        except OSError as exc:
            errors.append(f"{ops}: {exc}")
            continue
        for name in names:
            path = os.path.join(ops, name)
            if module_re.match(name) and os.path.isdir(path) and not os.path.islink(path):
                kernel_dir = config.get("kernel_dir") or ""
                module = _module(path, config["meta_file"], kernel_dir, kernel_re, errors)
                listing["modules"].append(module)
    listing["errors"] = errors
    return listing


def _ops_dirs(root: str, ops_name: str, max_depth: int, errors: list[str]) -> list[str]:
    """Every folder named ops_name at most max_depth below root (root itself included); the
    walk does not go into them, nor follow links."""
    found = []
    if os.path.basename(root) == ops_name:
        return [root]
    for folder, dirs, _ in os.walk(root, onerror=lambda exc: errors.append(str(exc))):
        depth = folder[len(root) :].count(os.sep)
        if ops_name in dirs:
            found.append(os.path.join(folder, ops_name))
        dirs[:] = [] if depth >= max_depth else sorted(d for d in dirs if d != ops_name)
    return sorted(found)


def _module(
    path: str, meta_name: str, kernel_dir: str, kernel_re: re.Pattern[str], errors: list[str]
) -> Any:
    """A module folder: its meta file, and each kernel file in it (or in its kernel_dir)."""
    module: dict[str, Any] = {"path": path, "meta": None, "meta_mtime_ns": None, "kernels": []}
    module["kernel_dir"] = kernel_dir
    meta_path = os.path.join(path, meta_name)
    try:
        with open(meta_path) as meta:
            module["meta"] = json.load(meta)
        module["meta_mtime_ns"] = os.stat(meta_path).st_mtime_ns
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        module["meta"] = {"unreadable": str(exc)[:200]}
    try:
        entries = sorted(os.scandir(os.path.join(path, kernel_dir)), key=lambda e: e.name)
    except FileNotFoundError:
        return module  # no kernel folder yet: a module with nothing in it
    except OSError as exc:
        errors.append(f"{path}: {exc}")
        return module
    for entry in entries:
        if kernel_re.match(entry.name) and entry.is_file(follow_symlinks=False):
            stat = entry.stat(follow_symlinks=False)
            module["kernels"].append(
                {"file": entry.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
            )
    return module


if __name__ == "__main__":
    print(json.dumps(list_cache(json.loads(sys.argv[1])), sort_keys=True))
