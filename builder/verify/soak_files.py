"""The soak's files: the CSV a plot reads (one row per time bucket), the PNG chart, and the
line a person reads. Plain writers of what verify/soak.py measured."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any

from builder.verify import plot

CSV_COLUMNS = (
    "t_s",
    "tokens_per_s",
    "open_streams",
    "completed",
    "errors",
    "ttft_p50_s",
    "memory_mb",
)


def csv_text(rows: list[dict[str, Any]]) -> str:
    """One row per time bucket, the columns a plot reads."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return out.getvalue()


@dataclass(frozen=True)
class Chart:
    """What the chart says besides the rows: the run's shape and verdict, the memory curve."""

    stack: str
    streams: int
    ran_s: float
    stopped: str | None
    passed: bool
    memory: list[tuple[float, float]]
    memory_bound_mb: float | None


def png(chart: Chart, rows: list[dict[str, Any]]) -> bytes:
    """Tokens/s, time to first token and the server's memory over the soak."""

    def points(key: str) -> list[tuple[float, float | None]]:
        return [(row["t_s"], row[key]) for row in rows]

    panels = [
        plot.Panel("tokens/s", "all streams", [plot.Series("tokens/s", points("tokens_per_s"))]),
        plot.Panel(
            "time to first token",
            "s",
            [plot.Series("p50 of requests started", points("ttft_p50_s"), plot.ORANGE)],
        ),
        plot.Panel(
            "server memory",
            "MB",
            [plot.Series("memory", [(t, mb) for t, mb in chart.memory], plot.GREEN)],
            limit=chart.memory_bound_mb,
            limit_label="bound",
        ),
    ]
    verdict = "passed" if chart.passed else "FAILED"
    title = f"soak {chart.stack} - {verdict} - {chart.streams} streams, {chart.ran_s:.0f} s" + (
        f" - {chart.stopped}" if chart.stopped else ""
    )
    return plot.chart(title, panels, "seconds into the soak")


def summary_line(summary: dict[str, Any]) -> str:
    """The soak's verdict and figures in a line a person reads, and where its files are."""
    ttft, itl, memory = summary["ttft_s"], summary["itl_s"], summary["memory"]
    grown = memory.get("peak_growth_mb")
    rate = summary["tokens_per_s"]
    return (
        f"soak: {'passed' if summary['passed'] else 'FAILED'} after {summary['ran_s']:.1f} s: "
        f"{summary['requests']} requests, {summary['errors']} failed; "
        f"ttft p50 {_ms(ttft['p50'])} p99 {_ms(ttft['p99'])}; "
        f"itl p50 {_ms(itl['p50'])} p99 {_ms(itl['p99'])}; "
        f"{'-' if rate is None else format(rate, '.1f')} tok/s; "
        f"memory {'+' + format(grown, '.0f') + ' MB' if memory['samples'] else 'not measured'}"
        + (f"; {summary['stopped_early']}" if summary["stopped_early"] else "")
        + f"\n  soak files: {summary['files']['json']} (.csv, .png)"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


__all__ = ["CSV_COLUMNS", "Chart", "csv_text", "png", "summary_line"]
