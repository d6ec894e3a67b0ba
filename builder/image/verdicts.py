"""What an image passed: the static verdict, and a served verdict per GPU kind.

One type, `Verdicts`, for every place a verdict is kept: the record of a build folder
(image/records.py: `Record` is a `Verdicts`), what one `test` run gives (verify/report.py), and
the verdict document in the registry (evidence/documents.py: `VerdictDocument` is a `Verdicts`).
Several verdicts of one image become one in `merge` alone, and which of two is newer is decided
in `recency` alone.

It lives in image/ because image/records.py is the lowest step that keeps it, and verify/ and
evidence/ sit above image/. builder/manifest/ holds what a stack is meant to be (manifests and
knowledge), not what happened to an image.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from builder.knowledge.strict import Strict

#: A verdict: the checks passed or failed (None where a model field allows it: never judged).
Verdict = Literal["passed", "failed"]
#: The GPU kind of a server without a GPU (a CPU stack's smoke).
CPU = "cpu"


def gpu_kind_key(kind: str) -> str:
    """GPU kinds compare as nvidia-smi names them, case and spacing aside."""
    return " ".join(kind.lower().split())


def recency(at: str) -> str:
    """The one ordering rule of verdicts: of two, the one with the later `at` (a served
    verdict's) or `recorded_at` (a verdict document's) is the newer. Both are UTC timestamps in
    one format (image/names.py), so they order as strings.

    They are unsigned: whoever writes a document chooses them. Issue 35 replaces this key with
    an order taken from signed data; nothing else orders verdicts."""
    return at


class ServedVerdict(Strict):
    """The image served its own serve command and was judged: on what, with what, how well.

    One per GPU kind the image served on: a host of that kind may be pinned to it. From
    `test` (the tool started the server) or `smoke --url --record` (a deployed host's server).
    """

    #: The GPU's product name as nvidia-smi prints it (e.g. "NVIDIA RTX PRO 6000 Blackwell
    #: Server Edition"), or "cpu".
    gpu_kind: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    gpu_count: int = Field(ge=0)
    #: Compute capability ("12.0"); None for cpu or where it could not be read.
    capability: str | None = None
    #: Streaming multiprocessors; None: not read (nvidia-smi does not print it).
    sm_count: int | None = None
    driver: str | None = None
    #: The CUDA version of the image (its stack's); the driver's own is implied by `driver`.
    cuda: str | None = None
    model_id: str
    model_revision: str | None = None
    serve_args: list[str]
    #: Runtime compiles the server's log showed, per kind (knowledge/runtime_compiles.yaml).
    compiles: dict[str, int] = Field(default_factory=dict)
    ttft_s: float | None = None
    single_stream_tok_s: float | None = None
    batched_tok_s: float | None = None
    #: What the smoke judged: every prompt answered within its floors.
    passed: bool
    source: Literal["test", "smoke --url"]
    #: When it was judged (UTC): what `recency` orders by.
    at: str

    def on(self, kind: str) -> bool:
        return gpu_kind_key(self.gpu_kind) == gpu_kind_key(kind)


def newest_per_kind(served: Iterable[ServedVerdict]) -> list[ServedVerdict]:
    """One served verdict per GPU kind, the newest by `recency` (of two equally new, the later
    given); in the order the kinds were first given."""
    given = list(served)
    by_kind: dict[str, ServedVerdict] = {}
    for verdict in sorted(given, key=lambda v: recency(v.at)):  # stable: ties keep their order
        by_kind[gpu_kind_key(verdict.gpu_kind)] = verdict
    first = {gpu_kind_key(v.gpu_kind): i for i, v in reversed(list(enumerate(given)))}
    return sorted(by_kind.values(), key=lambda v: first[gpu_kind_key(v.gpu_kind)])


class Verdicts(Strict):
    """The static verdict, and the served verdicts by GPU kind.

    `push` needs `static` passed (a failed GPU smoke is a served failure, recorded, and does not
    block the push); `pin` needs it too, and a passing served verdict on the host's GPU kind
    (or --allow-unserved).
    """

    #: The image checks, the locked set and the JIT-cache table; None: never tested.
    static: Verdict | None = None
    #: One per GPU kind the image served on (the newest judged on that kind).
    served: list[ServedVerdict] = Field(default_factory=list)
    #: Why the `test` that gave `static` served nothing (e.g. "no NVIDIA GPU"); None when its
    #: smoke ran, or where no test said.
    unserved: str | None = None

    @field_validator("served")
    @classmethod
    def _one_per_kind(cls, served: list[ServedVerdict]) -> list[ServedVerdict]:
        return newest_per_kind(served)

    def served_on(self, kind: str) -> ServedVerdict | None:
        return next((v for v in self.served if v.on(kind)), None)

    @property
    def tests(self) -> Verdict | None:
        """One word for the lot (what `list` and older readers show): the static verdict,
        "failed" too where a served verdict failed. No gate reads it."""
        if self.static != "passed":
            return self.static
        return "passed" if all(v.passed for v in self.served) else "failed"

    def verdicts(self) -> Verdicts:
        """The verdicts alone, out of a record or a document that is also a `Verdicts`."""
        return Verdicts(static=self.static, served=list(self.served), unserved=self.unserved)


def merge(older_to_newer: Iterable[Verdicts]) -> Verdicts:
    """Several verdicts of one image as one: the static verdict (and why its test served
    nothing) of the newest that has one, and the newest served verdict of each GPU kind.

    The one merge: a record taking a test's or the registry's verdicts, and the registry's
    verdict documents read together. Callers give them oldest first, ordered by `recency`."""
    given = list(older_to_newer)
    judged = [v for v in given if v.static is not None] or [v for v in given if v.unserved]
    last = judged[-1] if judged else Verdicts()
    return Verdicts(
        static=last.static,
        unserved=last.unserved,
        served=newest_per_kind(s for v in given for s in v.served),
    )


__all__ = [
    "CPU",
    "ServedVerdict",
    "Verdict",
    "Verdicts",
    "gpu_kind_key",
    "merge",
    "newest_per_kind",
    "recency",
]
