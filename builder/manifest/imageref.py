"""The one grammar of image references (the distribution spec's, restricted to what we use).

Manifests name bases by it, substitutions rewrite it, pins hold `repo@sha256:...` and the
registry option names a host and namespace: each pattern below is built from the same parts,
so a reference one step accepts is never refused by the next.
"""

from __future__ import annotations

import re

COMPONENT = r"[a-z0-9]+(?:[._-][a-z0-9]+)*"
#: A registry host: DNS labels (upper case allowed, as Docker does) and an optional port.
DOMAIN = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?"
#: A repository name: an optional host (the first component, when a port follows) and paths.
NAME = rf"{COMPONENT}(?::[0-9]+)?(?:/{COMPONENT})*"
TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST = r"sha256:[0-9a-f]{64}"

#: name[:tag] (what a manifest names as a base).
TAGGED = rf"^{NAME}(?::{TAG})?$"
#: name[:tag][@digest] (what a substitution may name).
REFERENCE = rf"^{NAME}(?::{TAG})?(?:@{DIGEST})?$"
#: name[:tag]@digest (what a pin holds: the exact image, never a moving tag).
PINNED = rf"^{NAME}(?::{TAG})?@{DIGEST}$"
#: host[:port][/namespace] (the --registry option).
REGISTRY = rf"^(?P<host>{DOMAIN})(?:/(?P<namespace>{COMPONENT}(?:/{COMPONENT})*))?$"
DIGEST_ONLY = rf"^{DIGEST}$"

REFERENCE_RE = re.compile(REFERENCE)
REGISTRY_RE = re.compile(REGISTRY)
