"""Step 5, image -> test report: testinfra checks in a container, the JIT-cache table, and the
smoke prompt against a server with its garbage and runtime-compile judges."""
