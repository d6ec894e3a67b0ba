"""Step 1, manifest -> resolved stack: strict YAML, the manifest schema, `extends`, arch flags
derived from knowledge/, base substitutions and the compatibility rules `check` applies."""
