"""Which releases count as newer than a pin, and how big a move between two versions is."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

Kind = Literal["major", "minor", "patch"]
KINDS: tuple[Kind, ...] = ("major", "minor", "patch")


def classify(old: str | Version, new: str | Version) -> Kind:
    """The size of a move, by the first release component that differs (either direction):
    0.22.1 -> 0.33.0 is minor, 2.11.0 -> 3.0 major; post, pre and local changes are patch."""
    a, b = _version(old).release, _version(new).release
    width = max(len(a), len(b), 3)
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    if a[0] != b[0]:
        return "major"
    if a[1] != b[1]:
        return "minor"
    return "patch"


def is_prerelease(version: str | Version) -> bool:
    parsed = _version(version)
    return parsed.is_prerelease or parsed.is_devrelease


def newer(pinned: str, versions: Iterable[Version]) -> list[Version]:
    """Versions above the pin, ascending: by public version (an index's 2.11.0+cu130 is not
    newer than a pin of 2.11.0), pre-releases only when the pin is one."""
    pin = Version(Version(pinned).public)
    allow_pre = is_prerelease(pin)
    by_public: dict[Version, Version] = {}
    for version in versions:
        public = Version(version.public)
        if public <= pin or (is_prerelease(public) and not allow_pre):
            continue
        if public not in by_public or version > by_public[public]:
            by_public[public] = version
    return [by_public[v] for v in sorted(by_public)]


def newest_matching(specifier: SpecifierSet, versions: Iterable[Version]) -> Version | None:
    """The newest version a requirement allows; pre-releases only where it names one."""
    allowed = list(specifier.filter(sorted(versions)))
    return max(allowed) if allowed else None


def _version(value: str | Version) -> Version:
    if isinstance(value, Version):
        return value
    try:
        return Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not a version") from None
