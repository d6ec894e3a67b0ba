"""The serve command a stack's image runs, derived once from the manifest.

The Dockerfile's CMD, a host's pin and the smoke server all start the same argv: one definition.
"""

from __future__ import annotations

from builder.manifest.resolve import ResolvedStack
from builder.vllmcli.serveflags import SERVE_FLAGS


def serve_argv(stack: ResolvedStack) -> list[str]:
    """The serve command as an argv list (exec form: no shell ever parses it), each typed serve
    setting rendered by its row of vllmcli/serveflags.SERVE_FLAGS, serve.extra_args last."""
    serve = stack.manifest.serve
    argv = [serve.engine, "serve", serve.model.id, "--host", "0.0.0.0"]
    for flag in SERVE_FLAGS:
        if serve.engine in flag.engines:
            argv += flag.render(serve)
    return argv + list(serve.extra_args)
