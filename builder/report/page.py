"""The report page: one HTML file per tested image, everything inlined (the charts as PNG
data: URIs, the style in the page), so it opens from a CI artifact or a mail without a network.

The template (templates/report/page.html.j2) is rendered with autoescape on: every string on
the page comes from a server's answers, a log or a registry, and is text, never markup.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from builder import REPO_ROOT
from builder.errors import ToolMissing
from builder.files import write_atomic
from builder.image.names import HASH_CHARS
from builder.report.gather import Tested
from builder.verify import soak_files

TEMPLATES = REPO_ROOT / "templates" / "report"


@dataclass(frozen=True)
class Written:
    path: Path
    content_hash: str
    verdict: str


def write_page(tested: Tested, out_dir: Path) -> Written:
    """Render tested's page into out_dir/STACK-HASH.html (replaced whole)."""
    record = tested.record
    path = out_dir / f"{record.stack}-{record.content_hash[:HASH_CHARS]}.html"
    html = render_page(tested)
    write_atomic(path, html)
    verdict = "passed" if tested.report.get("passed") else "failed"
    return Written(path, record.content_hash, verdict)


def render_page(tested: Tested) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["size"] = _size
    return env.get_template("page.html.j2").render(
        t=tested,
        report=tested.report,
        smoke=tested.smoke,
        soak=tested.soak,
        compiles=tested.compiles(),
        soak_chart=soak_chart(tested),
    )


def soak_chart(tested: Tested) -> str | None:
    """The soak's chart as a data: URI, drawn from its CSV by the soak's own chart code; None
    without a soak (or its CSV). ToolMissing (exit 2) without the plotting library."""
    soak, rows = tested.soak, tested.soak_rows
    if soak is None or not rows:
        return None
    if not soak_files.can_plot():
        raise ToolMissing(
            "the soak's chart needs matplotlib, which is not installed",
            hint=soak_files.PLOT_HINT,
        )
    memory = [(float(r["t_s"]), float(r["memory_mb"])) for r in rows if r.get("memory_mb")]
    baseline = (soak.get("memory") or {}).get("baseline_mb")
    bound = (soak.get("settings") or {}).get("max_memory_growth_mb")
    chart = soak_files.Chart(
        stack=tested.record.stack,
        streams=int((soak.get("settings") or {}).get("concurrency") or 0),
        ran_s=float(soak.get("ran_s") or 0.0),
        stopped=soak.get("stopped_early"),
        passed=bool(soak.get("passed")),
        memory=memory,
        memory_bound_mb=baseline + bound if baseline is not None and bound is not None else None,
    )
    png = soak_files.png(chart, [dict(row) for row in rows])
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _num(value: Any, digits: int = 2, unit: str = "") -> str:
    """A measured number, or "unknown" where none was measured (never a zero)."""
    if value is None or value == "":
        return "unknown"
    text = f"{float(value):.{digits}f}"
    return f"{text} {unit}" if unit else text


def _size(count: Any) -> str:
    if not isinstance(count, int | float) or count <= 0:
        return "-"
    return f"{count / 1e6:.1f} MB"
