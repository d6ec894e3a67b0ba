"""Every FlashInfer module a stack precompiles has its generator in the FlashInfer it pins, and a
module a family spells (knowledge/flashinfer_modules.yaml) is named as that FlashInfer names it.

FlashInfer renames its JIT generators between releases (0.6.5 has no 120f FP4 quantizer), and
the build finds out only when it reaches that module: after an hour of fused_moe_120 on 2 cores,
the first time. A derived attention module whose name differs from FlashInfer's by one character
is worse: it builds, and vLLM compiles its own at serve time. This reads flashinfer/jit/*.py out
of the pinned wheel (pure Python, ~8 MB) and, for family modules, runs FlashInfer's own naming
function from it (CPU torch only: the function maps dtypes to strings).
"""

from __future__ import annotations

import ast
import re
import zipfile
from typing import Any

import pytest

from builder.manifest.resolve import jit_modules_known, resolve, stack_names
from builder.render.context import flashinfer_version
from tests.conftest import STACKS
from tests.support.wheels import pinned_wheel

#: Asks the real package index (PyPI): skipped loudly where it does not answer.
pytestmark = pytest.mark.network

JIT_STACKS = [n for n in stack_names(STACKS) if resolve(n, STACKS).jit_modules]
FAMILY_STACKS = [
    n
    for n in JIT_STACKS
    if any(jit_modules_known().parse(m) for m in resolve(n, STACKS).jit_modules)
]


@pytest.mark.parametrize("name", JIT_STACKS)
def test_each_module_generator_exists_in_the_pinned_flashinfer(name: str) -> None:
    stack = resolve(name, STACKS)
    wheel = pinned_wheel("flashinfer-python", flashinfer_version(stack))
    known = jit_modules_known()
    with zipfile.ZipFile(wheel) as archive:
        for module in stack.jit_modules:
            path, function = known[module].generator.split(":")
            stem = path.replace(".", "/")
            # A module file, or a package whose __init__ re-exports from its own files.
            files = [n for n in archive.namelist() if n == f"{stem}.py" or n.startswith(f"{stem}/")]
            defined = any(
                re.search(rf"^def {function}\(", archive.read(f).decode(), re.MULTILINE)
                for f in files
                if f.endswith(".py")
            )
            assert defined, (
                f"{name}: {module}'s generator {known[module].generator} is not in "
                f"flashinfer-python {flashinfer_version(stack)}"
            )


@pytest.mark.parametrize("name", FAMILY_STACKS)
def test_family_module_names_are_the_pinned_flashinfers_own_spelling(name: str) -> None:
    torch = pytest.importorskip("torch")
    stack = resolve(name, STACKS)
    known = jit_modules_known()
    with zipfile.ZipFile(pinned_wheel("flashinfer-python", flashinfer_version(stack))) as archive:
        for module in stack.jit_modules:
            found = known.parse(module)
            if found is None:
                continue
            family = known.families[found.family]
            assert family.uri is not None, f"family {found.family} names no uri function"
            uri = _flashinfer_function(archive, family.uri, torch)
            args = [_torch_value(arg, torch) for arg in found.module.args]
            spelled = uri(*args) + family.uri_suffix
            assert spelled == module, f"{name}: FlashInfer spells {args} otherwise"


def _torch_value(arg: Any, torch: Any) -> Any:
    return getattr(torch, arg[len("torch.") :]) if str(arg).startswith("torch.") else arg


def _flashinfer_function(archive: zipfile.ZipFile, where: str, torch: Any) -> Any:
    """FlashInfer's naming function, executed from the wheel's source with what it reads from
    flashinfer/jit/utils.py (the dtype spelling tables) and nothing else: importing flashinfer
    itself needs a GPU and its native dependencies."""
    path, function = where.split(":")
    namespace: dict[str, Any] = {"torch": torch}
    utils = ast.parse(archive.read("flashinfer/jit/utils.py").decode())
    wanted = ("filename_safe_dtype_map", "dtype_map_kv")
    for node in utils.body:
        source = ast.unparse(node)
        if (isinstance(node, ast.Assign | ast.If) and any(w in source for w in wanted)) or (
            isinstance(node, ast.FunctionDef) and node.name.startswith(wanted)
        ):
            exec(compile(ast.Module([node], []), "flashinfer/jit/utils.py", "exec"), namespace)
    module = ast.parse(archive.read(path.replace(".", "/") + ".py").decode())
    (node,) = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == function]
    exec(compile(ast.Module([node], []), path, "exec"), namespace)
    return namespace[function]
