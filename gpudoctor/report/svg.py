"""Inline SVG charts for the HTML report, written as text (no plotting dependency).

Each function takes values that are already in the report and returns one
``<svg class="plot">`` element: stacked bars, overlaid bars, lines, vertical and
horizontal bars. The only arithmetic here is layout: scales, tick positions and
coordinates. Every label and tooltip is escaped by ``_fmt.markup`` (controls shown as escapes).

Why hand-written SVG rather than matplotlib: the report must open offline as one
file, render the same in every browser, and be byte-for-byte reproducible for
snapshot tests; matplotlib is a large new dependency (and font cache) whose SVG
output embeds glyph paths and generated ids, and these five chart shapes need
about three hundred lines.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpudoctor.report._fmt import markup

WIDTH = 760
LEFT, RIGHT, TOP, BOTTOM = 72, 16, 30, 30
AXIS = "#555"
GRID = "#e3e3e3"


def esc(text: object) -> str:
    """Labels and tooltips come from traces (kernel names): ``_fmt.markup``, as every HTML text."""
    return markup(text)


def _n(x: float) -> str:
    """A coordinate with at most one decimal, without trailing zeros."""
    s = f"{x:.1f}"
    return s[:-2] if s.endswith(".0") else s


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 … ≥ top in round steps (1, 2, 2.5 or 5 × 10^k)."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 1.0]
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


@dataclass(frozen=True)
class Series:
    label: str
    color: str
    values: Sequence[float | None]


def _open(chart_id: str, title: str, height: int, desc: str = "") -> list[str]:
    out = [
        f'<svg class="plot" id="{esc(chart_id)}" viewBox="0 0 {WIDTH} {height}" width="100%" '
        f'role="img" aria-labelledby="{esc(chart_id)}-t" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{esc(chart_id)}-t">{esc(title)}</title>',
    ]
    if desc:
        out.append(f"<desc>{esc(desc)}</desc>")
    out.append(f'<text class="ct" x="{LEFT}" y="18">{esc(title)}</text>')
    return out


def _y_axis(ticks: list[float], y: Callable[[float], float], fmt: Callable[[float], str], label: str) -> list[str]:
    out = []
    for t in ticks:
        yy = _n(y(t))
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{yy}" y2="{yy}" stroke="{GRID}"/>')
        out.append(f'<text class="tk" x="{LEFT - 6}" y="{yy}" text-anchor="end" dominant-baseline="middle">{esc(fmt(t))}</text>')
    if label:  # for screen readers; the tick labels carry the unit on screen
        out.append(f"<desc>axis unit: {esc(label)}</desc>")
    return out


LEGEND_ROW = 18


def _legend_rows(items: Sequence[tuple[str, str]]) -> list[list[tuple[str, str, float]]]:
    """Legend entries laid out in rows that fit the width: [(label, colour, x)]."""
    rows: list[list[tuple[str, str, float]]] = [[]]
    x = float(LEFT)
    for label, color in items:
        w = 24 + 6.5 * len(label)
        if rows[-1] and x + w > WIDTH - RIGHT:
            rows.append([])
            x = float(LEFT)
        rows[-1].append((label, color, x))
        x += w
    return rows


def _legend_height(items: Sequence[tuple[str, str]]) -> int:
    return LEGEND_ROW * len(_legend_rows(items)) if items else 0


def _legend(items: Sequence[tuple[str, str]], top: float) -> list[str]:
    out = []
    for r, row in enumerate(_legend_rows(items)):
        yy = top + r * LEGEND_ROW + 12
        for label, color, x in row:
            out.append(f'<rect x="{_n(x)}" y="{_n(yy - 9)}" width="10" height="10" fill="{esc(color)}"/>')
            out.append(f'<text class="lg" x="{_n(x + 14)}" y="{_n(yy)}">{esc(label)}</text>')
    return out


def stacked_bars(
    chart_id: str,
    title: str,
    categories: Sequence[str],
    series: Sequence[Series],
    fmt: Callable[[float], str],
    unit_label: str = "",
    height: int = 260,
) -> str:
    """One bar per category, the series stacked bottom to top in the order given."""
    totals = [sum(s.values[i] or 0 for s in series) for i in range(len(categories))]
    ticks = nice_ticks(max(totals, default=0))
    top = ticks[-1] or 1
    legend = [(s.label, s.color) for s in series]
    plot_h = height - TOP - BOTTOM
    height += _legend_height(legend)
    y0 = TOP + plot_h

    def y(v: float) -> float:
        return y0 - v / top * plot_h

    out = _open(chart_id, title, height)
    out += _y_axis(ticks, y, fmt, unit_label)
    n = max(len(categories), 1)
    slot = (WIDTH - LEFT - RIGHT) / n
    bar = max(slot * 0.75, 0.6)
    every = max(1, math.ceil(n / 20))
    for i, cat in enumerate(categories):
        x = LEFT + i * slot + (slot - bar) / 2
        base = 0.0
        parts = []
        for s in series:
            v = s.values[i] or 0
            if v <= 0:
                continue
            parts.append(
                f'<rect x="{_n(x)}" y="{_n(y(base + v))}" width="{_n(bar)}" height="{_n(y(base) - y(base + v))}" '
                f'fill="{esc(s.color)}"><title>{esc(cat)} · {esc(s.label)}: {esc(fmt(v))}</title></rect>'
            )
            base += v
        out.append(f'<g class="bar">{"".join(parts)}</g>')
        if i % every == 0:
            out.append(f'<text class="tk" x="{_n(x + bar / 2)}" y="{y0 + 14}" text-anchor="middle">{esc(cat)}</text>')
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y0}" y2="{y0}" stroke="{AXIS}"/>')
    out += _legend(legend, y0 + 24)
    out.append("</svg>")
    return "\n".join(out)


def overlaid_bars(
    chart_id: str,
    title: str,
    categories: Sequence[str],
    back: Series,
    front: Series,
    fmt: Callable[[float], str],
    unit_label: str = "",
    height: int = 240,
) -> str:
    """A wide bar per category (``back``) with a narrower one (``front``, a part of it) drawn over it."""
    ticks = nice_ticks(max((v or 0 for v in back.values), default=0))
    top = ticks[-1] or 1
    legend = [(back.label, back.color), (front.label, front.color)]
    plot_h = height - TOP - BOTTOM
    height += _legend_height(legend)
    y0 = TOP + plot_h

    def y(v: float) -> float:
        return y0 - v / top * plot_h

    out = _open(chart_id, title, height)
    out += _y_axis(ticks, y, fmt, unit_label)
    n = max(len(categories), 1)
    slot = (WIDTH - LEFT - RIGHT) / n
    bar = max(slot * 0.8, 0.6)
    every = max(1, math.ceil(n / 20))
    for i, cat in enumerate(categories):
        x = LEFT + i * slot + (slot - bar) / 2
        parts = []
        for s, w, dx in ((back, bar, 0.0), (front, bar * 0.6, bar * 0.2)):
            v = s.values[i] or 0
            if v > 0:
                parts.append(
                    f'<rect x="{_n(x + dx)}" y="{_n(y(v))}" width="{_n(w)}" height="{_n(y0 - y(v))}" fill="{esc(s.color)}">'
                    f"<title>{esc(cat)} · {esc(s.label)}: {esc(fmt(v))}</title></rect>"
                )
        out.append(f'<g class="bar">{"".join(parts)}</g>')
        if i % every == 0:
            out.append(f'<text class="tk" x="{_n(x + bar / 2)}" y="{y0 + 14}" text-anchor="middle">{esc(cat)}</text>')
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y0}" y2="{y0}" stroke="{AXIS}"/>')
    out += _legend(legend, y0 + 24)
    out.append("</svg>")
    return "\n".join(out)


def lines(
    chart_id: str,
    title: str,
    xs: Sequence[float],
    series: Sequence[Series],
    x_fmt: Callable[[float], str],
    y_fmt: Callable[[float], str],
    y_top: float | None = None,
    unit_label: str = "",
    height: int = 240,
) -> str:
    """Line series over a shared x axis (gaps where a value is None)."""
    ymax = max((v for s in series for v in s.values if v is not None), default=0)
    ticks = nice_ticks(y_top if y_top is not None else ymax)
    top = ticks[-1] or 1
    x_lo = min(xs, default=0)
    x_hi = max(xs, default=1)
    span = (x_hi - x_lo) or 1
    legend = [(s.label, s.color) for s in series]
    plot_h = height - TOP - BOTTOM
    height += _legend_height(legend)
    y0 = TOP + plot_h
    plot_w = WIDTH - LEFT - RIGHT

    def y(v: float) -> float:
        return y0 - min(v, top) / top * plot_h

    def x(v: float) -> float:
        return LEFT + (v - x_lo) / span * plot_w

    out = _open(chart_id, title, height)
    out += _y_axis(ticks, y, y_fmt, unit_label)
    step = nice_ticks(span, 6)[1]
    t = math.ceil(x_lo / step - 1e-9) * step
    while t <= x_hi + 1e-9 * step:
        out.append(f'<text class="tk" x="{_n(x(t))}" y="{y0 + 14}" text-anchor="middle">{esc(x_fmt(t))}</text>')
        t += step
    for s in series:
        runs: list[list[str]] = [[]]
        for xv, yv in zip(xs, s.values, strict=False):
            if yv is None:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append(f"{_n(x(xv))},{_n(y(yv))}")
        for pts in runs:
            if len(pts) == 1:
                cx, cy = pts[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{esc(s.color)}"><title>{esc(s.label)}</title></circle>')
            elif pts:
                out.append(
                    f'<polyline fill="none" stroke="{esc(s.color)}" stroke-width="1.8" points="{" ".join(pts)}">'
                    f"<title>{esc(s.label)}</title></polyline>"
                )
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y0}" y2="{y0}" stroke="{AXIS}"/>')
    out += _legend(legend, y0 + 24)
    out.append("</svg>")
    return "\n".join(out)


def columns(
    chart_id: str,
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    tooltips: Sequence[str],
    color: str,
    fmt: Callable[[float], str],
    unit_label: str = "",
    height: int = 230,
) -> str:
    """Vertical bars with a label under each (a histogram over given bins)."""
    ticks = nice_ticks(max(values, default=0))
    top = ticks[-1] or 1
    plot_h = height - TOP - BOTTOM
    y0 = TOP + plot_h

    def y(v: float) -> float:
        return y0 - v / top * plot_h

    out = _open(chart_id, title, height)
    out += _y_axis(ticks, y, fmt, unit_label)
    n = max(len(labels), 1)
    slot = (WIDTH - LEFT - RIGHT) / n
    bar = slot * 0.7
    for i, (label, v, tip) in enumerate(zip(labels, values, tooltips, strict=True)):
        x = LEFT + i * slot + (slot - bar) / 2
        if v > 0:
            out.append(
                f'<rect x="{_n(x)}" y="{_n(y(v))}" width="{_n(bar)}" height="{_n(y0 - y(v))}" fill="{esc(color)}">'
                f"<title>{esc(tip)}</title></rect>"
            )
            out.append(f'<text class="vl" x="{_n(x + bar / 2)}" y="{_n(y(v) - 4)}" text-anchor="middle">{esc(fmt(v))}</text>')
        out.append(f'<text class="tk" x="{_n(x + bar / 2)}" y="{y0 + 16}" text-anchor="middle">{esc(label)}</text>')
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y0}" y2="{y0}" stroke="{AXIS}"/>')
    out.append("</svg>")
    return "\n".join(out)


def hbars(
    chart_id: str,
    title: str,
    rows: Sequence[tuple[str, float, str]],
    color: str,
    label_chars: int = 48,
) -> str:
    """Horizontal bars: (name, value, text shown at the bar's end), longest first as given."""
    row_h = 22
    height = TOP + row_h * max(len(rows), 1) + 10
    label_w = 330
    x0 = label_w + 8
    plot_w = WIDTH - x0 - 170
    vmax = max((v for _, v, _ in rows), default=0) or 1
    out = _open(chart_id, title, height)
    for i, (name, v, text) in enumerate(rows):
        yy = TOP + i * row_h
        shown = name if len(name) <= label_chars else name[: label_chars - 1] + "…"
        w = max(v / vmax * plot_w, 1 if v > 0 else 0)
        out.append(
            f'<g class="bar"><text class="nm" x="{label_w}" y="{yy + 14}" text-anchor="end">{esc(shown)}<title>{esc(name)}</title></text>'
            f'<rect x="{x0}" y="{yy + 3}" width="{_n(w)}" height="{row_h - 6}" fill="{esc(color)}"><title>{esc(name)}: {esc(text)}</title></rect>'
            f'<text class="vl" x="{_n(x0 + w + 6)}" y="{yy + 14}">{esc(text)}</text></g>'
        )
    out.append("</svg>")
    return "\n".join(out)


def ranges(
    chart_id: str,
    title: str,
    rows: Sequence[tuple[str, float, float, float, float, str]],
    fmt: Callable[[float], str],
    unit_label: str = "",
) -> str:
    """One horizontal distribution per row on a shared axis: a whisker from min to max, a box
    from the median to the p90, a tick at the median. ``rows``: (label, min, median, p90, max,
    colour)."""
    row_h = 34
    height = TOP + row_h * max(len(rows), 1) + BOTTOM
    x0, x1 = LEFT + 40, WIDTH - RIGHT - 20
    ticks = nice_ticks(max((r[4] for r in rows), default=0))
    top = ticks[-1] or 1

    def x(v: float) -> float:
        return x0 + v / top * (x1 - x0)

    out = _open(chart_id, title, height, f"axis unit: {unit_label}" if unit_label else "")
    axis_y = TOP + row_h * len(rows)
    for t in ticks:
        out.append(f'<line x1="{_n(x(t))}" x2="{_n(x(t))}" y1="{TOP}" y2="{axis_y}" stroke="{GRID}"/>')
        out.append(f'<text class="tk" x="{_n(x(t))}" y="{axis_y + 14}" text-anchor="middle">{esc(fmt(t))}</text>')
    for i, (label, lo, med, p90, hi, color) in enumerate(rows):
        yy = TOP + i * row_h + row_h / 2
        tip = f"{label}: min {fmt(lo)}, median {fmt(med)}, p90 {fmt(p90)}, max {fmt(hi)}"
        out.append(
            f'<g class="range"><title>{esc(tip)}</title>'
            f'<text class="nm" x="{x0 - 8}" y="{_n(yy + 4)}" text-anchor="end">{esc(label)}</text>'
            f'<line x1="{_n(x(lo))}" x2="{_n(x(hi))}" y1="{_n(yy)}" y2="{_n(yy)}" stroke="{AXIS}"/>'
            f'<rect x="{_n(x(med))}" y="{_n(yy - 9)}" width="{_n(max(x(p90) - x(med), 1))}" height="18" '
            f'fill="{esc(color)}" fill-opacity="0.55" stroke="{esc(color)}"/>'
            f'<line x1="{_n(x(med))}" x2="{_n(x(med))}" y1="{_n(yy - 11)}" y2="{_n(yy + 11)}" stroke="{esc(color)}" '
            f'stroke-width="3"/></g>'
        )
    out.append("</svg>")
    return "\n".join(out)
