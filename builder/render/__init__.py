"""Step 3, resolved stack (+ lock) -> build context: the Dockerfile from templates/ and every
file it copies, with the content hash that names the image."""
