"""Step 6, registry digest -> host: pins, deploy files, drift and the host prerequisites."""
