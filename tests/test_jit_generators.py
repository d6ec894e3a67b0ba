"""Every FlashInfer module a stack precompiles has its generator in the FlashInfer it pins.

FlashInfer renames its JIT generators between releases (0.6.5 has no 120f FP4 quantizer), and
the build finds out only when it reaches that module: after an hour of fused_moe_120 on 2 cores,
the first time. This reads flashinfer/jit/*.py out of the pinned wheel (pure Python, ~8 MB).
"""

from __future__ import annotations

import re
import zipfile

import pytest

from builder.render.context import flashinfer_version
from builder.spec.resolve import jit_modules_known, resolve, stack_names
from tests.conftest import STACKS
from tests.support.wheels import pinned_wheel

JIT_STACKS = [n for n in stack_names(STACKS) if resolve(n, STACKS).jit_modules]


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
