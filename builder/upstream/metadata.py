"""A release's own requirements, read from its wheel's core metadata (METADATA).

The index's PEP 658 metadata file (`<wheel>.metadata`) is one small request. Indexes and mirrors
that do not serve it still answer HTTP range requests, so the METADATA member is read out of the
wheel's zip directory without downloading the wheel (vLLM's is 330 MB).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from typing import Any

from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from builder.upstream.index import DistFile, IndexClient, IndexUnavailable, read_limited

MAX_METADATA_BYTES = 16 * 1024 * 1024
#: Range reads are made in blocks of this size (a wheel's zip directory takes a few).
BLOCK = 256 * 1024
#: Without range support a wheel up to this size is read whole; a larger one is an error.
MAX_WHOLE_WHEEL = 32 * 1024 * 1024
MACHINES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


@dataclass(frozen=True)
class Target:
    """Where the stack installs: what wheel to read and how to evaluate markers."""

    platform: str  # linux/amd64
    python: str  # 3.12

    @property
    def machine(self) -> str:
        return MACHINES[self.platform]

    def environment(self, extra: str = "") -> dict[str, str]:
        return {
            "implementation_name": "cpython",
            "implementation_version": f"{self.python}.0",
            "os_name": "posix",
            "platform_machine": self.machine,
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": f"{self.python}.0",
            "python_version": self.python,
            "sys_platform": "linux",
            "extra": extra,
        }


def choose_wheel(files: list[DistFile], target: Target) -> DistFile | None:
    """The wheel pip would pick for the target, near enough: this machine's platform over a
    pure-Python wheel over any other; this Python's tag over abi3 over another; not yanked."""
    python_tag = "cp" + target.python.replace(".", "")

    def score(file: DistFile) -> tuple[int, int, int]:
        tags = parse_wheel_filename(file.filename)[3]
        platform = max(
            2 if t.platform.endswith("_" + target.machine) else 1 if t.platform == "any" else 0
            for t in tags
        )
        python = max(
            2 if t.interpreter == python_tag else 1 if t.abi in ("abi3", "none") else 0
            for t in tags
        )
        return (0 if file.yanked else 1, platform, python)

    wheels = [f for f in files if f.is_wheel]
    return max(wheels, key=score) if wheels else None


def read_metadata(client: IndexClient, index: str, file: DistFile) -> str:
    """The wheel's METADATA text: the PEP 658 file where the index has one, else range reads."""
    if file.metadata is not None:
        response = client.get(index, file.url + ".metadata")
        with response:
            if response.status_code == 200:
                body = read_limited(index, response, MAX_METADATA_BYTES)
                expected = file.metadata.get("sha256")
                if expected and hashlib.sha256(body).hexdigest() != expected:
                    raise IndexUnavailable(
                        f"index {index}: the metadata of {file.filename} does not match its "
                        "sha256 in the project page",
                        hint="a proxy or mirror is serving stale or broken files",
                    )
                return _text(index, file, body)
    return _text(index, file, _metadata_from_wheel(client, index, file))


def _text(index: str, file: DistFile, body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise IndexUnavailable(
            f"index {index}: the metadata of {file.filename} is not UTF-8 text"
        ) from None


def _metadata_from_wheel(client: IndexClient, index: str, file: DistFile) -> bytes:
    reader = io.BufferedReader(RangeReader(client, index, file), buffer_size=BLOCK)
    try:
        with zipfile.ZipFile(reader) as wheel:
            members = [
                n
                for n in wheel.namelist()
                if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            ]
            if len(members) != 1:
                raise IndexUnavailable(
                    f"index {index}: {file.filename} holds {len(members)} METADATA files, not one"
                )
            if wheel.getinfo(members[0]).file_size > MAX_METADATA_BYTES:
                raise IndexUnavailable(f"index {index}: {file.filename}'s METADATA is too large")
            return wheel.read(members[0])
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise IndexUnavailable(
            f"index {index}: {file.filename} is not a readable wheel ({exc})"
        ) from None


class RangeReader(io.RawIOBase):
    """A remote file read by HTTP range requests, block by block, each block fetched once."""

    def __init__(self, client: IndexClient, index: str, file: DistFile) -> None:
        self.client, self.index, self.file = client, index, file
        self.position = 0
        self.blocks: dict[int, bytes] = {}
        self.size = self._probe()

    def _probe(self) -> int:
        """The file's size from a range answer for its last block (where the zip directory
        is); the whole file when the server ignores ranges and the file is small."""
        response = self.client.get(self.index, self.file.url, Range=f"bytes=-{BLOCK}")
        with response:
            if response.status_code == 206:
                total = response.headers.get("Content-Range", "").rpartition("/")[2]
                body = read_limited(self.index, response, BLOCK)
                if not total.isdigit():
                    raise IndexUnavailable(
                        f"index {self.index}: no file size in the range answer for "
                        f"{self.file.filename}"
                    )
                size, start = int(total), int(total) - len(body)
                for i in range(-(-start // BLOCK), -(-size // BLOCK)):
                    self.blocks[i] = body[i * BLOCK - start : (i + 1) * BLOCK - start]
                return size
            if response.status_code == 200:
                length = response.headers.get("Content-Length", "")
                if length.isdigit() and int(length) > MAX_WHOLE_WHEEL:
                    raise IndexUnavailable(
                        f"index {self.index} serves neither PEP 658 metadata nor range "
                        f"requests for {self.file.filename} ({int(length)} bytes)",
                        hint="use an index or mirror that serves `core-metadata`",
                    )
                body = read_limited(self.index, response, MAX_WHOLE_WHEEL)
                self.blocks = {
                    i: body[o : o + BLOCK] for i, o in enumerate(range(0, len(body), BLOCK))
                }
                return len(body)
            raise IndexUnavailable(
                f"index {self.index} answered HTTP {response.status_code} for {self.file.url}",
                hint="the index serves no PEP 658 metadata for this wheel, and reading the "
                "wheel failed; try again later",
            )

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        end = min(self.position + len(buffer), self.size)
        if end <= self.position:
            return 0
        first, last = self.position // BLOCK, (end - 1) // BLOCK
        missing = [i for i in range(first, last + 1) if i not in self.blocks]
        if missing:
            self._fetch(missing[0], missing[-1])
        data = b"".join(self.blocks[i] for i in range(first, last + 1))
        start = self.position - first * BLOCK
        chunk = data[start : start + end - self.position]
        buffer[: len(chunk)] = chunk
        self.position += len(chunk)
        return len(chunk)

    def _fetch(self, first: int, last: int) -> None:
        start, stop = first * BLOCK, min((last + 1) * BLOCK, self.size) - 1
        response = self.client.get(self.index, self.file.url, Range=f"bytes={start}-{stop}")
        with response:
            if response.status_code != 206:
                raise IndexUnavailable(
                    f"index {self.index} answered HTTP {response.status_code} to a range "
                    f"request for {self.file.filename}"
                )
            body = read_limited(self.index, response, stop - start + 1)
        if len(body) != stop - start + 1:
            raise IndexUnavailable(
                f"index {self.index} sent {len(body)} bytes for a range of "
                f"{stop - start + 1} of {self.file.filename}"
            )
        for i in range(first, last + 1):
            offset = (i - first) * BLOCK
            self.blocks[i] = body[offset : offset + BLOCK]


def requirements(
    text: str, name: str, version: Version, target: Target, extras: list[str]
) -> list[Requirement]:
    """The release's Requires-Dist entries that apply on the target with these extras."""
    message = HeaderParser().parsestr(text)
    found_name, found_version = message.get("Name"), message.get("Version")
    if (
        found_name is None
        or canonicalize_name(found_name) != canonicalize_name(name)
        or found_version is None
        or Version(found_version) != version
    ):
        raise ValueError(f"the metadata names {found_name} {found_version}, not {name} {version}")
    out = []
    for line in message.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            raise ValueError(f"unreadable Requires-Dist {line!r}: {exc}") from None
        if requirement.marker is None or any(
            _holds(requirement, target, extra) for extra in ["", *extras]
        ):
            out.append(requirement)
    return out


def _holds(requirement: Requirement, target: Target, extra: str) -> bool:
    assert requirement.marker is not None
    try:
        return requirement.marker.evaluate(target.environment(extra))
    except (UndefinedComparison, UndefinedEnvironmentName):
        return False


def exact_version(requirement: Requirement) -> str | None:
    """X of `name==X` (one exact specifier, no wildcard), else None."""
    specs = list(requirement.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None
