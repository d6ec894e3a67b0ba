"""The knowledge floor, below the manifest: strict YAML, the one pydantic base, the constrained
strings every file schema shares, and the schema and loader of each file of knowledge/ that
the manifest reads (arch table, CUDA facts, JIT modules and presets, model shapes, attention
routes, the runtime cache volume and its integrity rules). A new knowledge file's schema goes
here; higher floors read it, none of it reads a manifest."""
