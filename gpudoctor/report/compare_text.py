"""The comparison's text that every format shares (``report.compare``): labels, signed deltas, units.

Pure formatting of the numbers ``analysis.compare`` computed once.
"""

from __future__ import annotations

import math

from gpudoctor.model import (
    Comparison,
    FindingChange,
    FindingStatus,
    MetricChange,
    RunSide,
    SettingChange,
    StepTimes,
    StepTimeVerdict,
)
from gpudoctor.report import _fmt as f

STATUS_LABELS = {
    FindingStatus.FIXED: "fixed",
    FindingStatus.REMAINING: "remaining",
    FindingStatus.NEW: "new",
    FindingStatus.NOT_JUDGED: "not judged in B",
}


VERDICT_LABELS = {
    StepTimeVerdict.FASTER: "faster",
    StepTimeVerdict.SLOWER: "slower",
    StepTimeVerdict.WITHIN_NOISE: "within noise",
    StepTimeVerdict.TOO_FEW_STEPS: "too few steps to tell",
    StepTimeVerdict.NOT_MEASURED: "not measured",
}


def signed(text: str, value: float | int) -> str:
    """``text`` of a delta with an explicit sign (``+`` / ``−``; nothing for zero)."""
    text = text.lstrip("-")
    if value > 0:
        return "+" + text
    if value < 0:
        return "−" + text
    return text


def delta_text(value: float | int | None, unit: str) -> str:
    """A delta (B - A) with its sign and unit: ``−37.2 pp``, ``+1.3 ms``, ``+12 samples/s``."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if unit == "pp":
        text = f"{abs(value):.1f}"
        return f"{text} pp" if text == "0.0" else signed(f"{text} pp", value)
    if unit == "ns":
        return signed(f.duration(abs(value)), value)
    return signed(f.with_unit(abs(value), unit), value)


def value_text(value: float | int | None, unit: str) -> str:
    return f.with_unit(value, unit)


def change_pct_text(value: float | None) -> str:
    if value is None:
        return "n/a"
    return signed(f"{abs(value):.1f}%", value)


def speedup_text(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.2f}×"


def side_line(s: RunSide) -> str:
    """``run starved-… · stopped (stopped after 24 steps) · started 2026-…`` (untrusted: escape it)."""
    parts = [s.source]
    if s.status:
        parts.append(s.status)
    if s.started_at:
        parts.append(f"started {s.started_at}")
    if s.kind == "trace":
        parts.append(f"{s.traces} trace{'s' if s.traces != 1 else ''}, no run directory")
    return " · ".join(parts)


def side_program(s: RunSide) -> str:
    prog = s.script or (f"-m {s.module}" if s.module else "")
    if not prog:
        return ""
    return " ".join([prog, *s.args])


def side_devices(s: RunSide) -> str:
    if s.devices:
        return ", ".join(s.devices)
    return s.device_type or "unknown"


def site_text(site) -> str:
    return str(site) if site is not None else ""


def finding_share_text(c: FindingChange) -> str:
    """What is at stake on each side: ``15.2% → 3.1% (−12.1 pp)`` or ``15.2% in A``."""
    if c.share_a_pct is not None and c.share_b_pct is not None:
        return f"{f.pct(c.share_a_pct)} → {f.pct(c.share_b_pct)} ({delta_text(c.delta_pp, 'pp')})"
    if c.share_a_pct is not None:
        return f"{f.pct(c.share_a_pct)} of step time in A"
    if c.share_b_pct is not None:
        return f"{f.pct(c.share_b_pct)} of step time in B"
    return ""


def step_rows(a: StepTimes | None, b: StepTimes | None) -> list[tuple[str, str, str]]:
    def d(t: StepTimes | None, key: str) -> str:
        return f.duration(getattr(t, key)) if t is not None else "n/a"

    return [
        ("median", d(a, "median_ns"), d(b, "median_ns")),
        ("p90", d(a, "p90_ns"), d(b, "p90_ns")),
        ("mean", d(a, "mean_ns"), d(b, "mean_ns")),
        ("min … max", f"{d(a, 'min_ns')} … {d(a, 'max_ns')}" if a else "n/a",
         f"{d(b, 'min_ns')} … {d(b, 'max_ns')}" if b else "n/a"),
        ("steps", f"{a.count:,}" if a else "n/a", f"{b.count:,}" if b else "n/a"),
    ]


def speedup_line(cmp: Comparison) -> str:
    st = cmp.step_time
    if st.speedup is None:
        return ""
    line = f"speed-up (A median / B median{', per sample' if st.per_sample else ''}): {speedup_text(st.speedup)}"
    if st.ci_low is not None and st.ci_high is not None:
        line += f", {st.confidence_pct:g}% CI {speedup_text(st.ci_low)}–{speedup_text(st.ci_high)} (bootstrap)"
    if st.p_value is not None:
        p = "p < 0.001" if st.p_value < 0.001 else f"p = {st.p_value:.3f}"
        line += f"; {st.test}: {p}"
    line += f"; change of the median {change_pct_text(st.change_pct)}"
    return line


def metric_window(m: MetricChange) -> str:
    if m.window_a == m.window_b:
        return m.window_a
    return f"A: {m.window_a or 'n/a'}; B: {m.window_b or 'n/a'}"


def improved_word(m: MetricChange) -> str:
    if m.improved is None:
        return ""
    return "better" if m.improved else "worse"


def setting_sites(s: SettingChange) -> str:
    a, b = site_text(s.site_a), site_text(s.site_b)
    if a and b:
        if a == b:
            return a
        if s.site_a is not None and s.site_b is not None and s.site_a.file == s.site_b.file:
            return f"{s.site_a.file}:{s.site_a.line} (A), :{s.site_b.line} (B)"
        return f"A: {a}; B: {b}"
    if a:
        return f"A: {a}"
    if b:
        return f"B: {b}"
    return ""
