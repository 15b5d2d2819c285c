"""The training chart: loss, eval loss, tokens/s and MFU against step, as a small SVG for a markdown artifact.

Prefect's UI strips raw `<svg>` from markdown but renders `![](data:image/svg+xml;base64,…)` in
both its UIs (docs/FIELD-NOTES.md), so the chart is an SVG file inlined as a data URI. matplotlib
draws it (Agg backend, imported when a chart is drawn, so importing this module stays cheap).

A long run logs thousands of points: each series is thinned to at most `MAX_POINTS` (every k-th
point), the raw loss is drawn faint and an exponential moving average over every point on top, so
the trend reads at any length. Text stays text in the SVG (`svg.fonttype: none`), which keeps a
chart of 500 points near 30 KB.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

MAX_POINTS = 400  # per series; throughput and MFU get half


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The JSON records of a metrics.jsonl (a half-written last line is skipped); [] when absent."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def series(records: Iterable[dict[str, Any]], field: str) -> list[tuple[float, float]]:
    """(step, value) of every record carrying a number in `field`."""
    return [
        (r["step"], r[field])
        for r in records
        if isinstance(r.get(field), (int, float)) and not isinstance(r.get(field), bool) and "step" in r
    ]


def thin(points: Sequence[tuple[float, float]], max_points: int = MAX_POINTS) -> list[tuple[float, float]]:
    """Every k-th point so that at most `max_points` remain; the last point is always kept."""
    if len(points) <= max_points:
        return list(points)
    k = math.ceil(len(points) / max_points)
    kept = list(points[::k])
    if kept[-1] != points[-1]:
        kept[-1] = points[-1]
    return kept


def ema(values: Sequence[float], span: int) -> list[float]:
    """Exponential moving average (bias-corrected, as TensorBoard's smoothing): no lag at the start."""
    alpha = 2 / (span + 1)
    out, avg, weight = [], 0.0, 0.0
    for v in values:
        avg = (1 - alpha) * avg + alpha * v
        weight = (1 - alpha) * weight + alpha
        out.append(avg / weight)
    return out


def smoothed(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """`ema` over the values with a span of 1/40 of the series, and of 10 points from 40 points on
    (a quarter below): at 1/40 alone, a 1,500-step run logged every 10 steps was smoothed over 4
    points, and its curve zigzagged as much as the raw loss."""
    n = len(points)
    values = ema([v for _, v in points], max(4, min(10, n // 4), n // 40))
    return [(s, v) for (s, _), v in zip(points, values, strict=True)]


def training_svg(records: Sequence[dict[str, Any]], title: str, resumed_at: int | None = None) -> str:
    """Two panels against step: loss (raw faint, smoothed, eval points) above, tokens/s and MFU below."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    loss, evals = series(records, "loss"), series(records, "eval_loss")
    tps, mfu = series(records, "tokens_per_s"), series(records, "mfu")
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "moai", "font.size": 9}):
        fig = Figure(figsize=(8, 4.6))
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.4])
        if loss:
            xs, ys = zip(*thin(loss), strict=True)
            top.plot(xs, ys, color="tab:blue", alpha=0.25, linewidth=0.8, label="loss")
            xs, ys = zip(*thin(smoothed(loss)), strict=True)
            top.plot(xs, ys, color="tab:blue", linewidth=1.8, label="loss (smoothed)")
        if evals:
            xs, ys = zip(*thin(evals), strict=True)
            marker = "o" if len(evals) <= 60 else None  # markers only while they stay apart
            top.plot(xs, ys, color="tab:orange", marker=marker, markersize=3.5, linewidth=1.2, label="eval loss")
        if resumed_at:
            for ax in (top, bottom):
                ax.axvline(resumed_at, color="grey", linestyle=":", linewidth=1)
            top.annotate(f"resumed at {resumed_at:,}", (resumed_at, 1), xycoords=("data", "axes fraction"),
                         xytext=(3, -10), textcoords="offset points", color="grey", fontsize=8)  # fmt: skip
        top.set_ylabel("loss")
        top.set_title(title, fontsize=9, loc="left")
        top.grid(alpha=0.3)
        if loss or evals:
            top.legend(loc="upper right", fontsize=8, frameon=False)
        else:
            top.text(0.5, 0.5, "no loss logged yet", ha="center", va="center", transform=top.transAxes)
        if tps:
            xs, ys = zip(*thin(smoothed(tps), MAX_POINTS // 2), strict=True)
            bottom.plot(xs, ys, color="tab:green", linewidth=1.2)
        bottom.set_ylabel("tokens/s", color="tab:green")
        bottom.set_xlabel("step")
        bottom.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
        bottom.grid(alpha=0.3)
        if mfu:
            right = bottom.twinx()
            xs, ys = zip(*thin(smoothed(mfu), MAX_POINTS // 2), strict=True)
            right.plot(xs, [100 * y for y in ys], color="tab:purple", linewidth=1.0)
            right.set_ylabel("MFU %", color="tab:purple")
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return compact(buf.getvalue())


def compact(svg: str) -> str:
    """Path coordinates to 0.1 px and no indentation: about a third smaller, no visible change
    (tick labels are <text>, outside d="...", and keep every digit)."""
    tenth = lambda m: re.sub(r"(-?\d+\.\d)\d+", r"\1", m.group(0))  # noqa: E731
    svg = re.sub(r'\bd="[^"]*"', tenth, svg)
    return re.sub(r"\n\s*", "\n", svg)


def svg_image_markdown(svg: str, alt: str) -> str:
    """Markdown that shows `svg` as an image: a base64 data URI (what Prefect's UIs render)."""
    return f"![{alt}](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})"
