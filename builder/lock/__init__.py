"""Step 2, resolved stack -> lock: base digests and every Python package at an exact version
with its hashes (uv), so a build installs exactly the set that was tested."""
