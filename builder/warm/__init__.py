"""Warm caches on every host: a served host's runtime caches captured once per GPU kind as an
OCI artifact beside the image, restored into every other host's cache volume before its first
start, and each start proved to have compiled nothing (docs/warm-caches.md)."""
