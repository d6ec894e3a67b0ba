"""Print what a stack's image runs, as JSON: the serve argv, the runtime environment (the
Dockerfile's ENV lines), and where the image keeps its FlashInfer modules.

bench/h200_serve.py starts `vllm serve` on the GPU machine from this, so the H200 runs the
stack's own command and settings (the GPU machine has no Docker engine to run the image).

    python bench/serve_spec.py vllm-0.22-sm90 > .gpu/c/serve-spec.json
"""

from __future__ import annotations

import json
import sys

from builder.manifest.resolve import resolve
from builder.render.context import template_context
from builder.verify.compiles import smoke_environment


def main(name: str) -> int:
    stack = resolve(name, __import__("builder").REPO_ROOT / "stacks")
    ctx = template_context(stack)
    env = {**ctx.jit_env, "MAX_JOBS": str(ctx.max_jobs_default), **ctx.env}
    spec = {
        "stack": stack.name,
        "argv": ctx.serve_argv,
        "env": env,
        "smoke_env": smoke_environment(),
        "jit_modules": ctx.jit_modules,
        "jit_dir": ctx.jit_dir,
        "port": ctx.port,
    }
    print(json.dumps(spec, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
