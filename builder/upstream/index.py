"""A package index client for the PEP 691 JSON simple API, with the build's CA bundle.

Every answer is checked before use: an index that is down, answers HTML or any other garbage is
an IndexUnavailable naming the index, never a half-read release list.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import requests
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builder.errors import StackError

ACCEPT = "application/vnd.pypi.simple.v1+json"
TIMEOUT_S = 30
#: A project page larger than this is not an index answer (torch's is about 2 MB).
MAX_PAGE_BYTES = 64 * 1024 * 1024


class IndexUnavailable(StackError):
    """An index that did not answer, or answered something that is not the JSON simple API."""


class _Loose(BaseModel):
    """PEP 691: clients ignore keys they do not know."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class _Meta(_Loose):
    api_version: str = Field(alias="api-version")


class _File(_Loose):
    filename: str
    url: str
    hashes: dict[str, str]
    requires_python: str | None = Field(default=None, alias="requires-python")
    yanked: bool | str = False
    #: PEP 714 spelling, then PEP 658's: True or the metadata file's hashes.
    core_metadata: bool | dict[str, str] | None = Field(default=None, alias="core-metadata")
    dist_info_metadata: bool | dict[str, str] | None = Field(
        default=None, alias="data-dist-info-metadata"
    )


class _Page(_Loose):
    meta: _Meta
    name: str
    files: list[_File]


@dataclass(frozen=True)
class DistFile:
    """One file of a release on an index."""

    filename: str
    url: str
    version: Version
    hashes: dict[str, str]
    yanked: bool
    is_wheel: bool
    #: The PEP 658 metadata file beside it: None when the index serves none, else its hashes
    #: (empty when the index gives none).
    metadata: dict[str, str] | None = None


@dataclass(frozen=True)
class Project:
    """A project's files on one index."""

    index: str
    name: str
    files: tuple[DistFile, ...] = field(default_factory=tuple)

    def releases(self) -> dict[Version, list[DistFile]]:
        """Version -> files, yanked ones included (a release is yanked when all its are)."""
        out: dict[Version, list[DistFile]] = {}
        for file in self.files:
            out.setdefault(file.version, []).append(file)
        return out

    def available(self) -> list[Version]:
        """Versions with at least one file that is not yanked, ascending."""
        return sorted({f.version for f in self.files if not f.yanked})


def project_url(index: str, name: str) -> str:
    return f"{index.rstrip('/')}/{canonicalize_name(name)}/"


class IndexClient:
    """Project pages from package indexes, fetched once per command (threads share the cache)."""

    def __init__(self, ca_bundle: Path | None = None, timeout: float = TIMEOUT_S) -> None:
        self.verify: bool | str = str(ca_bundle) if ca_bundle is not None else True
        self.timeout = timeout
        self._local = threading.local()
        self._pages: dict[tuple[str, str], Project | None] = {}
        self._lock = threading.Lock()

    @property
    def session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers["User-Agent"] = "sm120-stacks (upstream)"
            self._local.session = session
        return session

    def get(self, index: str, url: str, **headers: str) -> requests.Response:
        """GET url on behalf of index; no answer at all is an IndexUnavailable naming it."""
        try:
            return self.session.get(
                url, headers=headers, timeout=self.timeout, verify=self.verify, stream=True
            )
        except requests.exceptions.SSLError as exc:
            raise IndexUnavailable(
                f"index {index} is not reachable: TLS verification failed ({_short(exc)})",
                hint="behind a TLS-intercepting proxy give its CA: --ca-bundle FILE or "
                "SM120_STACKS_CA_BUNDLE",
            ) from None
        except requests.exceptions.RequestException as exc:
            raise IndexUnavailable(
                f"index {index} is not reachable: {_short(exc)}",
                hint="check the index URL in the stack's python section and the network",
            ) from None

    def project(self, index: str, name: str) -> Project | None:
        """The project's page on index (None when the index does not have it)."""
        key = (index, canonicalize_name(name))
        with self._lock:
            if key in self._pages:
                return self._pages[key]
        found = self._fetch(index, name)
        with self._lock:
            self._pages[key] = found
        return found

    def projects(self, indexes: list[str], name: str) -> list[Project]:
        """The project on each index that has it (pip merges them the same way)."""
        return [p for p in (self.project(index, name) for index in indexes) if p is not None]

    def _fetch(self, index: str, name: str) -> Project | None:
        url = project_url(index, name)
        response = self.get(index, url, Accept=ACCEPT)
        with response:
            if response.status_code == 404:
                return None
            if response.status_code != 200:
                raise IndexUnavailable(
                    f"index {index} answered HTTP {response.status_code} for {url}",
                    hint="the index may be down; try again later",
                )
            kind = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if kind != ACCEPT:
                raise IndexUnavailable(
                    f"index {index} does not answer the JSON simple API (PEP 691) for {url}: "
                    f"Content-Type {kind or 'missing'!r}",
                    hint="use an index that serves application/vnd.pypi.simple.v1+json "
                    "(PyPI and most mirrors do)",
                )
            body = read_limited(index, response, MAX_PAGE_BYTES)
        try:
            page = _Page.model_validate_json(body)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(p) for p in problem["loc"]) or "the document"
            raise IndexUnavailable(
                f"index {index} answered garbage for {url}: {where}: {problem['msg']}",
                hint="the index or a proxy in between is broken; try again later",
            ) from None
        if not page.meta.api_version.startswith("1."):
            raise IndexUnavailable(
                f"index {index} speaks simple API version {page.meta.api_version}, "
                "this tool reads 1.x",
            )
        return Project(index=index, name=page.name, files=_files(url, name, page.files))


def _files(page_url: str, name: str, files: list[_File]) -> tuple[DistFile, ...]:
    out = []
    wanted = canonicalize_name(name)
    for raw in files:
        parsed = _parse_filename(raw.filename)
        if parsed is None or parsed[0] != wanted:
            continue  # eggs, .exe installers, other projects' files: nothing to read
        metadata = raw.core_metadata if raw.core_metadata is not None else raw.dist_info_metadata
        out.append(
            DistFile(
                filename=raw.filename,
                url=urljoin(page_url, raw.url),
                version=parsed[1],
                hashes=dict(raw.hashes),
                yanked=raw.yanked is True or isinstance(raw.yanked, str),
                is_wheel=raw.filename.endswith(".whl"),
                metadata=(
                    None if not metadata else (metadata if isinstance(metadata, dict) else {})
                ),
            )
        )
    return tuple(out)


def _parse_filename(filename: str) -> tuple[str, Version] | None:
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        elif filename.endswith((".tar.gz", ".zip")):
            name, version = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return str(name), version


def read_limited(index: str, response: requests.Response, limit: int) -> bytes:
    """The body, refusing one larger than limit (a misdirected download, not a page)."""
    chunks = []
    size = 0
    try:
        for chunk in response.iter_content(1 << 16):
            size += len(chunk)
            if size > limit:
                raise IndexUnavailable(
                    f"index {index} sent more than {limit} bytes for {response.url}"
                )
            chunks.append(chunk)
    except requests.exceptions.RequestException as exc:
        raise IndexUnavailable(f"index {index} broke off its answer: {_short(exc)}") from None
    return b"".join(chunks)


def _short(exc: Any) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."
