"""Image -> test report: static testinfra checks, the JIT-cache table (with the libraries the
CUDA driver would compile from PTX: verify/device_code.py), and the smoke prompt.

The static checks run in a throwaway container of the image started with `sleep infinity` (the
serve command would exit without a GPU and a model); testinfra reaches it with `docker exec`.
The report is JSON under build/STACK/ plus a table a person reads at a glance; its verdict is
recorded, so `push` can refuse untested images.
"""

from __future__ import annotations

import glob
import json
import re
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import certifi

from builder.engine.hostprobe import gather
from builder.engine.owner import owned, reap_orphans
from builder.engine.protocol import ContainerSpec, Engine
from builder.engine.throwaway import run_throwaway
from builder.errors import OperationFailed, StackError
from builder.files import write_atomic
from builder.image.build import find_image
from builder.image.names import HASH_CHARS, local_ref
from builder.image.records import load_record, save_record
from builder.lock.lockfile import Lock
from builder.manifest.resolve import ResolvedStack
from builder.render.context import RenderedContext
from builder.verify.device_code import device_code_finding
from builder.verify.expectations import expectations
from builder.verify.report import CacheRow, CheckResult, TestReport
from builder.verify.served import served_verdict

#: Runs the smoke prompt on an image (ref, report folder): its JSON report, or why it was skipped.
SmokeRunner = Callable[[str, Path], dict[str, Any] | str]


def run_static_checks(
    engine: Engine,
    stack: ResolvedStack,
    image_ref: str,
    content_hash: str,
    lock: Lock | None,
    workdir: Path,
    proxy_ca: Path | None = None,
) -> list[CheckResult]:
    expect = expectations(stack, content_hash, lock).to_json()
    image = engine.image(image_ref)
    if image is None:
        raise StackError(f"there is no image {image_ref} to check")
    from builder.verify.run_checks import CheckInputs, run_checks  # pytest: only when checking

    inputs = CheckInputs(expect, image.attrs, proxy_ca_lines(proxy_ca))
    # What a run the engine lost left behind (verify/owner.py); said on stderr, where it
    # cannot mix into `test --json`'s report on stdout.
    reap_orphans(engine, lambda line: print(line, file=sys.stderr))
    container = engine.run(
        owned(
            ContainerSpec(
                image=image_ref,
                entrypoint=("sleep",),
                command=("infinity",),
                name=f"sm120-check-{stack.name}-{uuid.uuid4().hex[:8]}",
                labels={"sm120-stacks.check": stack.name},
                network_mode="none",
            )
        )
    )
    try:
        return run_checks(inputs, f"docker://{container.id}", workdir)
    finally:
        container.remove(force=True)


def cache_table(engine: Engine, stack: ResolvedStack, image_ref: str) -> list[CacheRow]:
    """The JIT table: the verification output of the image's own tool for every module it
    precompiled (run in its own environment), then each kernel family the manifest says is not
    precompiled (`jit_cache.not_precompiled`: they compile on the serving GPU; the GPU smoke
    adds each such kernel it finds cached, hit or miss)."""
    rows = module_rows(engine, stack, image_ref) if stack.jit_modules else []
    return rows + not_precompiled_rows(stack)


def module_rows(engine: Engine, stack: ResolvedStack, image_ref: str) -> list[CacheRow]:
    tool = "/opt/sm120-stacks/tools/flashinfer_jit.py"
    # The module verification exits 1 on a miss after printing every row: its stdout, whatever
    # the exit status.
    command = ["python", tool, "verify", *stack.jit_modules]
    output = run_throwaway(engine, image_ref, command, timeout_s=600).stdout
    expected = stack.module_archs()
    rows = []
    for line in output.splitlines():
        if line.startswith("{"):
            data = json.loads(line)
            status = data["status"]
            missing = set(expected.get(data["module"], [])) - set(data.get("archs", []))
            if status == "hit" and missing:
                status = "wrong-arch"
            rows.append(
                CacheRow(
                    data["module"],
                    data.get("archs", []),
                    data.get("bytes", 0),
                    status,
                    data.get("detail", ""),
                )
            )
    return rows


#: How long the short form of a `why` may be (the JSON keeps it; the table cuts it further).
WHY_CHARS = 160


def not_precompiled_rows(stack: ResolvedStack) -> list[CacheRow]:
    """A row per `jit_cache.not_precompiled` entry: status not-precompiled, its why cut short."""
    return [
        CacheRow(entry.what, [], 0, "not-precompiled", short_why(entry.why), "not-precompiled")
        for entry in stack.manifest.jit_cache.not_precompiled
    ]


def short_why(text: str, limit: int = WHY_CHARS) -> str:
    """The first sentence of a why (a full stop before a capital: version numbers and file
    names keep theirs), cut at a word within limit."""
    text = " ".join(text.split())
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z])", text, maxsplit=1)[0]
    if len(first) <= limit:
        return first
    return first[: limit - 3].rsplit(" ", 1)[0].rstrip(",;:(") + "..."


def kernel_rows(cache: dict[str, Any] | None) -> list[CacheRow]:
    """The smoke's cached kernels (its report's `kernel_cache`: every cache it watched, or one
    in reports older than that) as JIT-table rows."""
    if not cache:
        return []
    caches = cache.get("caches", [cache])
    return [
        CacheRow(
            row["name"],
            [row["arch"]] if row.get("arch") else [],
            row["bytes"],
            row["status"],
            row["detail"],
            "cached-kernel",
            row.get("shape") or {},
        )
        for one in caches
        for row in one.get("kernels", [])
    ]


def add_smoke(report: TestReport, outcome: dict[str, Any] | str) -> None:
    """The smoke's outcome into the report: why it was skipped, or its JSON report and, in the
    JIT table, each cached kernel it found hit or miss (none of them a failure)."""
    if isinstance(outcome, str):
        report.smoke_skipped = outcome
    else:
        report.smoke = outcome
        report.jit_cache += kernel_rows(outcome.get("kernel_cache"))


#: Public certificate sets a host bundle is made from: Mozilla's, as certifi ships it and as
#: Debian/Ubuntu keep it (the distribution's copy is often older or newer than certifi's, and
#: other packages in the image ship older copies still, e.g. grpc's roots.pem). Site additions
#: (/usr/local/share/ca-certificates) are what is left: the proxy CA.
PUBLIC_CA_GLOBS = ("/usr/share/ca-certificates/mozilla/*.crt",)


def public_ca_text(globs: tuple[str, ...] = PUBLIC_CA_GLOBS) -> str:
    texts = [Path(certifi.where()).read_text(errors="replace")]
    for pattern in globs:
        texts += [Path(f).read_text(errors="replace") for f in sorted(glob.glob(pattern))]
    return "\n".join(texts)


def proxy_ca_lines(bundle: Path | None, public: str | None = None) -> list[str]:
    """One distinctive base64 line of each private certificate in the proxy CA bundle: those
    in no public set, which the image's own CA stores ship legitimately. Finding one of them in
    the image means the build secret leaked."""
    if bundle is None or not bundle.is_file():
        return []
    public = public_ca_text() if public is None else public
    lines = []
    for block in bundle.read_text(errors="replace").split("-----BEGIN CERTIFICATE-----")[1:]:
        body = [x for x in block.split("-----END CERTIFICATE-----")[0].split() if len(x) == 64]
        if len(body) > 4 and body[len(body) // 2] not in public:
            lines.append(body[len(body) // 2])
    return lines


def validate(
    engine: Engine,
    stack: ResolvedStack,
    rendered: RenderedContext,
    build_dir: Path,
    proxy_ca: Path | None = None,
    smoke: SmokeRunner | None = None,
) -> TestReport:
    """Static checks and cache table now; `smoke` (a callable) adds the smoke prompt result."""
    content_hash = rendered.content_hash()
    image_ref = local_ref(stack.name, content_hash)
    image = find_image(engine, image_ref, content_hash)
    if image is None:
        raise StackError(
            f"no image of {stack.name} at its current content hash ({image_ref})",
            hint=f"build it first: sm120-stacks build {stack.name} (make stack STACK={stack.name})",
        )
    report = TestReport(stack.name, content_hash, image_ref)
    stack_dir = build_dir / stack.name / "reports"
    stack_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sm120-checks-") as scratch:
        report.checks = run_static_checks(
            engine, stack, image_ref, content_hash, rendered.lock, Path(scratch), proxy_ca
        )
    report.jit_cache = cache_table(engine, stack, image_ref)
    report.device_code, driver_jit = device_code_finding(engine, stack, image_ref)
    report.jit_cache += driver_jit
    if smoke is not None:
        add_smoke(report, smoke(image_ref, stack_dir))
    path = stack_dir / f"{stack.name}-{content_hash[:HASH_CHARS]}.json"
    report.path = str(path)
    write_atomic(path, json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    _same_image_still(engine, image_ref, content_hash, image.id)
    record = load_record(build_dir, stack.name, content_hash)
    record.attach_image(image.id)
    record.tests = "passed" if report.passed else "failed"
    record.static = "passed" if report.static_passed else "failed"
    if report.smoke is not None:
        facts = None if not stack.manifest.smoke.needs_gpu else gather(engine, None)
        record.add_served(served_verdict(stack, report.smoke, facts, "test"))
    record.report = str(path)
    record.smoke = (
        f"skipped: {report.smoke_skipped}"
        if report.smoke is None
        else ("passed" if report.smoke.get("passed") else "failed")
    )
    save_record(build_dir, record)
    return report


def _same_image_still(engine: Engine, image_ref: str, content_hash: str, tested: str) -> None:
    """The tag names the image the checks ran on: another build folder on this engine (or a
    prune) may have rebuilt or removed it meanwhile, and a verdict must not be recorded for an
    image it was not given on."""
    now = find_image(engine, image_ref, content_hash)
    if now is None or now.id != tested:
        became = "is gone" if now is None else f"now names {now.id[:19]}"
        raise OperationFailed(
            f"{image_ref} {became}, not the image {tested[:19]} that was tested (rebuilt or "
            "removed during the test, by another build folder or a prune); nothing was "
            "recorded: test it again"
        )
