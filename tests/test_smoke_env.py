"""The smoke's server environment comes from knowledge/runtime_compiles.yaml, not a copy."""

from __future__ import annotations

from builder.knowledge.runtime_compiles import compile_kinds
from builder.verify.compiles import smoke_environment


def test_smoke_environment_is_every_kind_the_smoke_turns_on() -> None:
    env = smoke_environment()
    kinds = compile_kinds()
    for entry in kinds.values():
        for name, value in entry.visible_with.items():
            assert (env.get(name) == value) is entry.smoke_sets, name
    # FlashInfer's ninja lines print only when verbose, and its debug flag must stay off or
    # every precompiled module misses (its compile flags change).
    assert env["FLASHINFER_JIT_VERBOSE"] == "1" and env["FLASHINFER_JIT_DEBUG"] == "0"
    # CuTe-DSL's console log would print a line per call: the smoke leaves it off.
    assert "CUTE_DSL_LOG_TO_CONSOLE" not in env
