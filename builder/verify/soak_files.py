"""The soak's files: the CSV a plot reads (one row per time bucket), the PNG chart, and the
line a person reads. Plain writers of what verify/soak.py measured.

The chart is drawn by matplotlib, the tool's optional `report` extra (`pip install
'sm120-stacks[report]'`; `make venv` installs it): a machine without it still soaks and
writes the CSV and JSON, and says that the chart was not drawn. `sm120-stacks report` draws the
same chart from the CSV (builder.report).
"""

from __future__ import annotations

import csv
import importlib.util
import io
from dataclasses import dataclass
from typing import Any

#: What to run where the plotting library is missing.
PLOT_HINT = "pip install 'sm120-stacks[report]' (matplotlib), as `make venv` does"

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


def can_plot() -> bool:
    """Whether the plotting library is installed (the `report` extra)."""
    return importlib.util.find_spec("matplotlib") is not None


def png(chart: Chart, rows: list[dict[str, Any]]) -> bytes:
    """Tokens/s, time to first token and the server's memory over the soak, one panel each
    over a shared time axis; the memory panel draws its bound. Needs can_plot()."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display wanted

    def points(key: str) -> tuple[list[float], list[float]]:
        kept = [(float(row["t_s"]), row[key]) for row in rows if row.get(key) not in (None, "")]
        return [t for t, _ in kept], [float(v) for _, v in kept]

    figure = Figure(figsize=(9, 7.5), dpi=100, layout="constrained")
    tokens, ttft, memory = figure.subplots(3, 1, sharex=True)
    tokens.plot(*points("tokens_per_s"), color="tab:blue", label="all streams")
    tokens.set_ylabel("tokens/s")
    ttft.plot(
        *points("ttft_p50_s"), color="tab:orange", marker=".", label="p50 of requests started"
    )
    ttft.set_ylabel("time to first token (s)")
    times, values = [t for t, _ in chart.memory], [mb for _, mb in chart.memory]
    memory.plot(times, values, color="tab:green", label="server memory")
    if chart.memory_bound_mb is not None:
        memory.axhline(chart.memory_bound_mb, color="tab:red", linestyle="--", label="bound")
    memory.set_ylabel("memory (MB)")
    memory.set_xlabel("seconds into the soak")
    for axes in (tokens, ttft, memory):
        axes.grid(alpha=0.3)
        axes.legend(loc="upper right", fontsize="small")
        axes.set_ylim(bottom=0)
    verdict = "passed" if chart.passed else "FAILED"
    figure.suptitle(
        f"soak {chart.stack}: {verdict}, {chart.streams} streams, {chart.ran_s:.0f} s"
        + (f" ({chart.stopped})" if chart.stopped else "")
    )
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


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
        + f"\n  soak files: {summary['files']['json']} "
        + ("(.csv, .png)" if "png" in summary["files"] else f"(.csv; no chart: {PLOT_HINT})")
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


__all__ = ["CSV_COLUMNS", "PLOT_HINT", "Chart", "can_plot", "csv_text", "png", "summary_line"]
