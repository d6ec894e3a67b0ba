"""What moves when a stack takes new releases: the pins asked for, what those releases require
of the stack's other pins (read from their metadata, followed until nothing more moves), and
the pins released in lockstep with a moved one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.errors import StackError
from builder.manifest.resolve import ResolvedStack
from builder.upstream.index import DistFile, IndexClient
from builder.upstream.metadata import (
    Target,
    choose_wheel,
    exact_version,
    read_metadata,
    requirements,
)
from builder.upstream.releases import Kind, classify, newest_matching

Section = Literal["packages", "overrides"]


@dataclass(frozen=True)
class Move:
    package: str
    old: str | None  # None: a new pin
    new: str | None  # None: the pin is dropped
    why: str
    section: Section = "packages"
    explicit: bool = False

    @property
    def kind(self) -> Kind | Literal["new", "dropped"]:
        if self.old is None:
            return "new"
        if self.new is None:
            return "dropped"
        return classify(self.old, self.new)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "kind": self.kind}


@dataclass(frozen=True)
class _Pinned:
    name: str
    version: str
    extras: tuple[str, ...]
    section: Section


class _Planner:
    def __init__(self, base: ResolvedStack, client: IndexClient) -> None:
        py = base.manifest.python
        self.base, self.client = base, client
        self.indexes = [py.index_url, *py.extra_index_urls]
        self.target = Target(base.manifest.platform, py.version)
        self.pinned: dict[str, _Pinned] = {}
        sections: tuple[tuple[Section, dict[str, Any]], ...] = (
            ("packages", py.packages),
            ("overrides", py.overrides),
        )
        for section, table in sections:
            for name, pin in table.items():
                self.pinned[canonicalize_name(name)] = _Pinned(
                    name, pin.version, tuple(pin.extras), section
                )
        self.moves: dict[str, Move] = {}
        self.queue: list[str] = []
        self.warnings: list[str] = []

    def ask(self, sets: dict[str, str], drops: list[str]) -> None:
        for name in drops:
            have = self.pinned.get(canonicalize_name(name))
            if have is None:
                raise StackError(f"--drop {name}: {self.base.name} does not pin it", key="--drop")
            self.moves[canonicalize_name(name)] = Move(
                have.name, have.version, None, "--drop", have.section, explicit=True
            )
        for name, version in sets.items():
            key = canonicalize_name(name)
            if key in self.moves:
                raise StackError(f"{name} is both set and dropped", key="--set")
            have = self.pinned.get(key)
            self.release_files(name, version, "--set")
            if have is not None and Version(have.version) == Version(version):
                continue  # already pinned there: nothing moves, nothing to read
            self.add(
                key,
                Move(
                    package=have.name if have else name,
                    old=have.version if have else None,
                    new=version,
                    why="--set" if have else "--set (a new pin)",
                    section=have.section if have else "packages",
                    explicit=True,
                ),
            )

    def add(self, key: str, move: Move) -> None:
        self.moves[key] = move
        if move.new is not None:
            self.queue.append(key)

    def follow(self) -> None:
        """Requirements of every moved release, then lockstep pins, until nothing moves."""
        while self.queue:
            while self.queue:
                self._requirements_of(self.moves[self.queue.pop(0)])
            self._lockstep()

    def _requirements_of(self, source: Move) -> None:
        assert source.new is not None
        have = self.pinned.get(canonicalize_name(source.package))
        extras = list(have.extras) if have is not None else []
        for requirement in self._requires(source, extras):
            key = canonicalize_name(requirement.name)
            have = self.pinned.get(key)
            moved = self.moves.get(key)
            if (have is None and moved is None) or (moved is not None and moved.new is None):
                continue  # not (or no longer) pinned: the resolution (lock) chooses
            current = moved.new if moved is not None else have.version if have else ""
            if requirement.specifier.contains(str(current), prereleases=True):
                continue
            requester = f"{source.package} {source.new} requires {requirement.name}"
            wanted = f"{requester}{requirement.specifier}"
            if moved is not None:
                raise StackError(
                    f"the set cannot resolve: {wanted}, but {moved.package} is "
                    f"{moved.new} ({moved.why})",
                    key="--set",
                    hint=f"--set {moved.package} to a version both allow, or leave out the "
                    "--set that conflicts",
                )
            assert have is not None
            if have.section == "overrides":
                self.warnings.append(
                    f"python.overrides keeps {have.name} {have.version} although {wanted}: "
                    f"--set {have.name}=VERSION if the override is no longer wanted"
                )
                continue
            exact = exact_version(requirement)
            if exact is not None:
                new, why = exact, f"{requester}=={exact}"
            else:
                found = newest_matching(requirement.specifier, self.versions(requirement.name))
                if found is None:
                    raise StackError(
                        f"the set cannot resolve: {wanted}, and no release on "
                        f"{', '.join(self.indexes)} satisfies it",
                        key="--set",
                    )
                new, why = str(found), f"{wanted} (the newest that does)"
            self.release_files(requirement.name, new, why)
            self.add(key, Move(have.name, have.version, new, why, have.section))

    def _lockstep(self) -> None:
        """A pin of the same family at a moved package's old version (flashinfer-cubin beside
        flashinfer-python, nvidia-nvvm beside nvidia-cuda-nvcc) was released with it: it moves
        to the same version, or is dropped where the index has no such release (a stale
        flashinfer-cubin breaks `import flashinfer`)."""
        for move in list(self.moves.values()):
            if move.old is None or move.new is None:
                continue
            for key, have in self.pinned.items():
                if (
                    key in self.moves
                    or _family(have.name) != _family(move.package)
                    or Version(have.version) != Version(move.old)
                ):
                    continue
                if Version(move.new) in self.versions(have.name):
                    why = f"released with {move.package} (pinned at its version)"
                    self.add(key, Move(have.name, have.version, move.new, why, have.section))
                else:
                    why = (
                        f"pinned at {move.package}'s version, and the index has no "
                        f"{have.name} {move.new}"
                    )
                    self.add(key, Move(have.name, have.version, None, why, have.section))
                    self.warnings.append(
                        f"{have.name} is dropped: {why}; --set it to a release of its own "
                        "if the stack needs it"
                    )

    def versions(self, name: str) -> set[Version]:
        return {v for p in self.client.projects(self.indexes, name) for v in p.available()}

    def release_files(self, name: str, version: str, why: str) -> tuple[str, list[DistFile]]:
        """(index, files) of an existing release that is not yanked; else an error naming it."""
        projects = self.client.projects(self.indexes, name)
        where = ", ".join(self.indexes)
        if not projects:
            raise StackError(f"{name} is on none of the stack's indexes ({where})", key=why)
        wanted = Version(version)
        for project in projects:
            files = project.releases().get(wanted)
            if files and any(not f.yanked for f in files):
                return project.index, [f for f in files if not f.yanked]
            if files:
                raise StackError(
                    f"{name} {version} is yanked on {project.index}",
                    key=why,
                    hint="choose another release",
                )
        newest = max((v for p in projects for v in p.available()), default=None)
        raise StackError(
            f"{name} {version} does not exist on {where}"
            + (f" (newest: {newest})" if newest else ""),
            key=why,
        )

    def _requires(self, move: Move, extras: list[str]) -> list[Requirement]:
        assert move.new is not None
        index, files = self.release_files(move.package, move.new, move.why)
        wheel = choose_wheel(files, self.target)
        if wheel is None:
            raise StackError(
                f"{move.package} {move.new} has no wheel on {index} to read its requirements "
                "from",
                key=move.why,
            )
        text = read_metadata(self.client, index, wheel)
        try:
            return requirements(text, move.package, Version(move.new), self.target, extras)
        except ValueError as exc:
            raise StackError(f"{index}: the metadata of {wheel.filename}: {exc}") from None


def _family(name: str) -> str:
    return canonicalize_name(name).split("-")[0]


def plan_moves(
    base: ResolvedStack, sets: dict[str, str], drops: list[str], client: IndexClient
) -> tuple[list[Move], list[str]]:
    """(moves in the order found, warnings for the reviewer)."""
    planner = _Planner(base, client)
    planner.ask(sets, drops)
    planner.follow()
    moves = planner.moves
    patched = [
        f"{patch.file} patches {patch.package}, which moves {m.old} -> {m.new or 'dropped'}: "
        "check that it still applies and is still needed"
        for patch in base.manifest.patches
        if (m := moves.get(canonicalize_name(patch.package))) is not None
    ]
    return list(moves.values()), planner.warnings + patched
