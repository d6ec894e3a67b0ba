"""The soak judged: its three checks (no stall, the error rate, memory growth) and the summary
and per-bucket rows its files hold, from what the run measured (soak_load.SoakRun).
"""

from __future__ import annotations

from typing import Any

from builder.verify.soak_load import SoakRun, TimeBucket, percentile

CHECK_STALL = "soak: no stall"

CHECK_ERRORS = "soak: error rate"

CHECK_MEMORY = "soak: memory growth"


def soak_checks(soak: SoakRun, memory_source: str) -> list[tuple[str, bool, str]]:
    settings = soak.settings
    checks: list[tuple[str, bool, str]] = []
    if soak.stall is not None:
        at, quiet, streams = soak.stall
        checks.append(
            (
                CHECK_STALL,
                False,
                f"no token on any of {streams} open streams for {quiet:.1f} s, {at:.1f} s into "
                f"the soak, while the server was up (limit {settings.stall_s:g} s)",
            )
        )
    else:
        checks.append(
            (
                CHECK_STALL,
                True,
                f"longest time without a token on any open stream {soak.longest_quiet:.2f} s "
                f"(limit {settings.stall_s:g} s)",
            )
        )
    errors = [r for r in soak.finished if r.error is not None]
    total = len(soak.finished)
    rate = len(errors) / total if total else 0.0
    ok = total > 0 and rate <= settings.max_error_rate
    detail = f"{len(errors)} of {total} requests failed (rate {rate:.3f}, at most "
    detail += f"{settings.max_error_rate:g})"
    if errors:
        detail += f"; first: {errors[0].error}"
    if soak.stopped and soak.stopped.startswith("the server stopped"):
        detail += f"; {soak.stopped}"
    if not total:
        detail = f"no request finished in the soak's {soak.ran_s:.0f} s"
        if soak.cut_off and not soak.stopped:
            detail += (
                f" ({soak.cut_off} still open at its end, left out: an answer takes longer "
                "than the soak; give --soak more seconds)"
            )
    checks.append((CHECK_ERRORS, ok, detail))
    limit = settings.max_memory_growth_mb
    if limit is not None and soak.memory is not None:
        memory = _memory(soak)
        if memory["samples"] < 2 or soak.baseline_mb is None:
            if not soak.stopped:  # ended early, it failed for that reason; else the probe did
                checks.append((CHECK_MEMORY, False, f"no memory samples from {memory_source}"))
        else:
            grown = memory["peak_growth_mb"]
            checks.append(
                (
                    CHECK_MEMORY,
                    grown <= limit,
                    f"grew {grown:.0f} MB at most past {memory['baseline_mb']:.0f} MB after the "
                    f"warm-up (at most {limit:g} MB; {memory['final_mb']:.0f} MB at the end; "
                    f"{memory_source})",
                )
            )
    return checks


def _memory(soak: SoakRun) -> dict[str, Any]:
    values = [mb for _, mb in soak.memory_samples]
    baseline = soak.baseline_mb
    peak_growth = max((mb - baseline for mb in values), default=0.0) if baseline else 0.0
    return {
        "samples": len(values),
        "baseline_mb": _rounded(baseline),
        "peak_mb": _rounded(max(values, default=None)),
        "final_mb": _rounded(values[-1] if values else None),
        "growth_mb": _rounded(values[-1] - baseline if values and baseline is not None else None),
        "peak_growth_mb": _rounded(max(0.0, peak_growth)),
    }


def soak_summary(soak: SoakRun, memory_source: str) -> dict[str, Any]:
    done = [r for r in soak.finished if r.error is None]
    ttfts = sorted(r.first - r.opened for r in soak.finished if r.first is not None)
    gaps = sorted(soak.gaps)
    tokens = sum(bucket.tokens for bucket in soak.buckets.values())
    by_kind: dict[str, dict[str, Any]] = {}
    for prompt in soak.prompts:
        mine = [r for r in soak.finished if r.kind == prompt.kind]
        kind_ttfts = sorted(r.first - r.opened for r in mine if r.first is not None)
        by_kind[prompt.kind] = {
            "requests": len(mine),
            "errors": sum(r.error is not None for r in mine),
            "ttft_p50_s": _rounded(percentile(kind_ttfts, 50)),
        }
    errors = [r.error for r in soak.finished if r.error is not None]
    return {
        "settings": {
            "seconds": soak.settings.seconds,
            "concurrency": soak.settings.concurrency,
            "stall_s": soak.settings.stall_s,
            "max_error_rate": soak.settings.max_error_rate,
            "max_memory_growth_mb": soak.settings.max_memory_growth_mb,
        },
        "target": soak.server.base_url,
        "ran_s": _rounded(soak.ran_s),
        "stopped_early": soak.stopped,
        "cut_off_at_end": soak.cut_off,
        "requests": len(soak.finished),
        "completed": len(done),
        "errors": len(errors),
        "error_rate": _rounded(len(errors) / len(soak.finished)) if soak.finished else None,
        "first_errors": errors[:5],
        "tokens": tokens,
        "tokens_per_s": _rounded(tokens / soak.ran_s) if soak.ran_s > 0 else None,
        "ttft_s": _stats(ttfts),
        "itl_s": _stats(gaps),
        "itl_sampled_of": soak.gaps_seen,
        "longest_silence_s": _rounded(soak.longest_quiet),
        "by_kind": by_kind,
        "bucket_s": soak.width,
        "memory": {"source": memory_source, **_memory(soak)},
    }


def _stats(values: list[float]) -> dict[str, float | None]:
    return {
        "p50": _rounded(percentile(values, 50)),
        "p99": _rounded(percentile(values, 99)),
        "max": _rounded(values[-1] if values else None),
        "count": len(values),
    }


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def soak_rows(soak: SoakRun) -> list[dict[str, Any]]:
    last = int(soak.ran_s // soak.width) if soak.ran_s else 0
    rows = []
    for index in range(last + 1):
        bucket = soak.buckets.get(index, TimeBucket())
        ttfts = sorted(bucket.ttfts)
        span = min(soak.width, soak.ran_s - index * soak.width)  # the last bucket is partial
        if span <= 0.05 * soak.width:
            continue
        rows.append(
            {
                "t_s": round(index * soak.width, 3),
                "tokens_per_s": round(bucket.tokens / span, 3),
                "open_streams": bucket.open_streams,
                "completed": bucket.completed,
                "errors": bucket.errors,
                "ttft_p50_s": _rounded(percentile(ttfts, 50)),
                "memory_mb": _rounded(bucket.memory_mb, 1),
            }
        )
    return rows
