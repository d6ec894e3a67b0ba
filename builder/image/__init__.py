"""Step 4, build context -> image -> registry: the engine, BuildKit builds with their logs,
image names, records of what was built, tested and pushed, and the registry round trip."""
