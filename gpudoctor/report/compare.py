"""Renderers of a ``Comparison`` (``gpudoctor compare A B``): terminal, md, json, html.

Pure formatting: every number is a field of the ``Comparison`` that
``analysis.compare`` computed once; these functions convert units for display, add
signs to deltas and lay things out. Untrusted text (paths, arguments, messages,
setting values, device names) is escaped as in the report renderers: control
characters shown as escapes on the terminal, Markdown punctuation backslash-escaped,
HTML escaped in a page that runs no script and fetches nothing.
"""

from __future__ import annotations

import json
import math
from html import escape

from gpudoctor.errors import UsageError
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
from gpudoctor.report import svg
from gpudoctor.report.htmlfmt import CSP
from gpudoctor.report.jsonfmt import finite
from gpudoctor.report.markdown import cell, code, esc, table

COMPARE_FORMATS = ("terminal", "md", "json", "html")

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


# --------------------------------------------------------------------------- shared text


def _signed(text: str, value: float | int) -> str:
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
        return f"{text} pp" if text == "0.0" else _signed(f"{text} pp", value)
    if unit == "ns":
        return _signed(f.duration(abs(value)), value)
    return _signed(f.with_unit(abs(value), unit), value)


def value_text(value: float | int | None, unit: str) -> str:
    return f.with_unit(value, unit)


def change_pct_text(value: float | None) -> str:
    if value is None:
        return "n/a"
    return _signed(f"{abs(value):.1f}%", value)


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


def _step_rows(a: StepTimes | None, b: StepTimes | None) -> list[tuple[str, str, str]]:
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


def _metric_window(m: MetricChange) -> str:
    if m.window_a == m.window_b:
        return m.window_a
    return f"A: {m.window_a or 'n/a'}; B: {m.window_b or 'n/a'}"


def _improved_word(m: MetricChange) -> str:
    if m.improved is None:
        return ""
    return "better" if m.improved else "worse"


def _setting_sites(s: SettingChange) -> str:
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


# --------------------------------------------------------------------------- terminal


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, code_: str) -> str:
        return f"\x1b[{code_}m{text}\x1b[0m" if self.color and text else text

    def bold(self, text: str) -> str:
        return self(text, "1")

    def dim(self, text: str) -> str:
        return self(text, "2")


_VERDICT_ANSI = {
    StepTimeVerdict.FASTER: "1;32",
    StepTimeVerdict.SLOWER: "1;31",
    StepTimeVerdict.WITHIN_NOISE: "1;33",
    StepTimeVerdict.TOO_FEW_STEPS: "1;33",
    StepTimeVerdict.NOT_MEASURED: "1",
}
_STATUS_ANSI = {
    FindingStatus.FIXED: "32",
    FindingStatus.REMAINING: "33",
    FindingStatus.NEW: "31",
    FindingStatus.NOT_JUDGED: "2",
}


def _columns(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        out.append("  " + "  ".join(cells).rstrip())
    return out


def render_compare_terminal(cmp: Comparison, *, color: bool = False) -> str:
    st = _Style(color)
    cl = f.one_line
    sections: list[list[str]] = []
    head = [st.bold(f"gpudoctor {cl(cmp.gpudoctor_version)}") + " · compare"]
    for s in (cmp.a, cmp.b):
        head.append(f"  {st.bold(s.label)}  {cl(side_line(s))}")
        prog = side_program(s)
        if prog:
            head.append(st.dim(f"     {cl(prog)}"))
        head.append(st.dim(f"     devices: {cl(side_devices(s))}"))
    sections.append(head)
    sections.append([st(cl(cmp.headline), _VERDICT_ANSI[cmp.step_time.verdict])])
    if cmp.warnings:
        sections.append([st.bold("Warnings"), *(st(f"  ! {cl(w)}", "33") for w in cmp.warnings)])

    step = cmp.step_time
    block = [st.bold("Step time") + (st.dim(f"  ({cl(step.basis_text)})") if step.basis_text else "")]
    if step.a is not None or step.b is not None:
        rows = [["", "A", "B"]] + [list(r) for r in _step_rows(step.a, step.b)]
        lines = _columns(rows, {1, 2})
        block.append(st.dim(lines[0]))
        block += lines[1:]
        windows = {step.a.window if step.a else "", step.b.window if step.b else ""}
        if len(windows) > 1:
            block.append(st.dim(f"  of: A {cl(step.a.window if step.a else 'n/a')}; B {cl(step.b.window if step.b else 'n/a')}"))
        elif step.a is not None:
            block.append(st.dim(f"  of: {cl(step.a.window)}"))
        line = speedup_line(cmp)
        if line:
            block.append("  " + cl(line))
    block.append("  " + st(f"verdict: {VERDICT_LABELS[step.verdict]}", _VERDICT_ANSI[step.verdict]))
    sections.append(block)

    if cmp.metrics:
        rows = [["", "A", "B", "change", "", "of"]]
        for m in cmp.metrics:
            rows.append([
                cl(m.label), value_text(m.a, m.unit), value_text(m.b, m.unit), delta_text(m.delta, m.delta_unit),
                _improved_word(m), cl(_metric_window(m)),
            ])
        lines = _columns(rows, {1, 2, 3})
        block = [st.bold("Figures"), st.dim(lines[0])]
        for m, line in zip(cmp.metrics, lines[1:], strict=True):
            code_ = "" if m.improved is None else ("32" if m.improved else "31")
            block.append(st(line, code_) if code_ else line)
            if m.note:
                block.append(st.dim(f"    note: {cl(m.note)}"))
        sections.append(block)

    bd = cmp.breakdown
    if bd is not None:
        block = [st.bold("Step breakdown") + st.dim("  (share of profiled step time; mean time per profiled step)")]
        if bd.window_a == bd.window_b:
            block.append(st.dim(f"  of: {cl(bd.window_a)} in each run"))
        else:
            block.append(st.dim(f"  of: A {cl(bd.window_a)}; B {cl(bd.window_b)}"))
        rows = [["component", "A", "", "B", "", "change", ""]]
        for r in bd.rows:
            rows.append([
                cl(f.component_label(r.component)),
                f.pct(r.a_pct), f.duration(r.a_ns) if r.a_ns is not None else "",
                f.pct(r.b_pct), f.duration(r.b_ns) if r.b_ns is not None else "",
                delta_text(r.delta_pp, "pp"), delta_text(r.delta_ns, "ns") if r.delta_ns is not None else "",
            ])
        if bd.step_mean_a_ns is not None and bd.step_mean_b_ns is not None:
            rows.append(["profiled step (mean)", "", f.duration(bd.step_mean_a_ns), "", f.duration(bd.step_mean_b_ns), "",
                         delta_text(bd.step_mean_b_ns - bd.step_mean_a_ns, "ns")])
        lines = _columns(rows, {1, 2, 3, 4, 5, 6})
        block += [st.dim(lines[0]), *lines[1:]]
        block += [st.dim(f"  note: {cl(n)}") for n in bd.notes]
        sections.append(block)
    elif cmp.breakdown_note:
        sections.append([st.bold("Step breakdown") + ": " + cl(cmp.breakdown_note)])

    block = [st.bold("Findings") + (f": {cl(cmp.findings_summary)}" if cmp.findings_summary else "")]
    for c in cmp.findings:
        label = st(f"{STATUS_LABELS[c.status]:<15}", _STATUS_ANSI[c.status])
        headline = f"  {label} {st.bold(cl(c.code))} {cl(c.name)}"
        if c.rank is not None:
            headline += f"  rank {c.rank}"
        if c.location is not None:
            headline += st.dim(f"  {cl(str(c.location))}")
        block.append(headline)
        share = finding_share_text(c)
        sev = " → ".join(x for x in (c.severity_a or "–", c.severity_b or "–"))
        block.append(st.dim(f"{'':18}severity {sev}" + (f"; at stake: {share}" if share else "")))
        if c.message_a:
            block.append(f"{'':18}A: {cl(c.message_a)}")
        if c.message_b:
            block.append(f"{'':18}B: {cl(c.message_b)}")
        if c.note:
            block.append(st.dim(f"{'':18}note: {cl(c.note)}"))
    if cmp.findings_compared and not cmp.findings:
        block.append("  none in either run")
    sections.append(block)

    block = [st.bold("Settings changed")]
    if cmp.settings:
        rows = [["", "setting", "A", "B", "set at"]]
        for s in cmp.settings:
            rows.append([cl(s.category), cl(s.name), cl(s.a), cl(s.b), cl(_setting_sites(s))])
        lines = _columns(rows, set())
        block += [st.dim(lines[0]), *lines[1:]]
    else:
        block[0] += ": none" + (st.dim(f" ({cl(cmp.settings_note)})") if cmp.settings_note else "")
    sections.append(block)

    if cmp.notes:
        sections.append([st.bold("Notes"), *(st.dim(f"  note: {cl(n)}") for n in cmp.notes)])
    return "\n\n".join("\n".join(s) for s in sections if s) + "\n"


# --------------------------------------------------------------------------- markdown


def render_compare_markdown(cmp: Comparison) -> str:
    out: list[str] = [f"## gpudoctor compare: {esc(VERDICT_LABELS[cmp.step_time.verdict])}", "", esc(cmp.headline), ""]
    rows = []
    for s in (cmp.a, cmp.b):
        rows.append([
            f"**{esc(s.label)}**", code(s.source, table=True) or " ", cell(s.status or s.kind),
            code(side_program(s), table=True) or " ", cell(side_devices(s)),
        ])
    out += [table(["", "run", "status", "program", "devices"], rows), ""]
    if cmp.warnings:
        out += ["> [!WARNING]", *(f"> - {esc(w)}" for w in cmp.warnings), ""]

    step = cmp.step_time
    out += ["### Step time", ""]
    if step.basis_text:
        out += [f"Of: {esc(step.basis_text)}.", ""]
    if step.a is not None or step.b is not None:
        rows = [[cell(k), cell(a), cell(b)] for k, a, b in _step_rows(step.a, step.b)]
        rows.append(["of", cell(step.a.window if step.a else "n/a"), cell(step.b.window if step.b else "n/a")])
        out += [table(["", "A", "B"], rows, ["l", "r", "r"]), ""]
        line = speedup_line(cmp)
        if line:
            out += [esc(line) + ".", ""]
    out += [f"**Verdict:** {esc(step.verdict_text)}", ""]

    if cmp.metrics:
        rows = []
        for m in cmp.metrics:
            note = f" ({esc(m.note)})" if m.note else ""
            rows.append([
                cell(m.label), cell(value_text(m.a, m.unit)), cell(value_text(m.b, m.unit)),
                cell(delta_text(m.delta, m.delta_unit)), cell(_improved_word(m)), (esc(_metric_window(m)) or " ") + note,
            ])
        out += ["### Figures", "", table(["figure", "A", "B", "change", "", "of"], rows, ["l", "r", "r", "r", "l", "l"]), ""]

    bd = cmp.breakdown
    out += ["### Step breakdown", ""]
    if bd is not None:
        where = f"{esc(bd.window_a)} in each run" if bd.window_a == bd.window_b else f"A: {esc(bd.window_a)}; B: {esc(bd.window_b)}"
        out += [f"Share of profiled step time and mean time per profiled step, over {where}.", ""]
        rows = []
        for r in bd.rows:
            rows.append([
                cell(f.component_label(r.component)), f.pct(r.a_pct), f.duration(r.a_ns) if r.a_ns is not None else "",
                f.pct(r.b_pct), f.duration(r.b_ns) if r.b_ns is not None else "",
                delta_text(r.delta_pp, "pp"), delta_text(r.delta_ns, "ns") if r.delta_ns is not None else "",
            ])
        if bd.step_mean_a_ns is not None and bd.step_mean_b_ns is not None:
            rows.append(["**profiled step (mean)**", "", f.duration(bd.step_mean_a_ns), "", f.duration(bd.step_mean_b_ns), "",
                         delta_text(bd.step_mean_b_ns - bd.step_mean_a_ns, "ns")])
        out += [table(["component", "A", "A / step", "B", "B / step", "change", "change / step"], rows,
                      ["l", "r", "r", "r", "r", "r", "r"]), ""]
        out += [f"- {esc(n)}" for n in bd.notes]
        if bd.notes:
            out.append("")
    else:
        out += [esc(cmp.breakdown_note or "not compared"), ""]

    out += ["### Findings", "", esc(cmp.findings_summary) + ("." if cmp.findings_summary else ""), ""]
    if cmp.findings:
        rows = []
        for c in cmp.findings:
            what = esc(c.message_b or c.message_a)
            if c.note:
                what += f" *({esc(c.note)})*"
            rows.append([
                f"**{esc(STATUS_LABELS[c.status])}**", f"{esc(c.code)} {code(c.name, table=True)}"
                + (f" rank {c.rank}" if c.rank is not None else ""),
                cell(finding_share_text(c)), code(str(c.location), table=True) if c.location else " ", what or " ",
            ])
        out += [table(["", "rule", "at stake", "where", "message"], rows), ""]

    out += ["### Settings changed", ""]
    if cmp.settings:
        rows = [
            [cell(s.category), code(s.name, table=True), code(s.a, table=True) or " ", code(s.b, table=True) or " ",
             code(_setting_sites(s), table=True) or " "]
            for s in cmp.settings
        ]
        out += [table(["", "setting", "A", "B", "set at"], rows), ""]
    else:
        out += ["None" + (f": {esc(cmp.settings_note)}" if cmp.settings_note else "") + ".", ""]
    if cmp.notes:
        out += ["<details><summary>Notes</summary>", "", *(f"- {esc(n)}" for n in cmp.notes), "", "</details>", ""]
    out.append(f"<sub>gpudoctor {esc(cmp.gpudoctor_version)} · {esc(cmp.created_at)}</sub>")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- json


def comparison_dict(cmp: Comparison) -> dict:
    return finite(cmp.to_dict())


def render_compare_json(cmp: Comparison) -> str:
    return json.dumps(comparison_dict(cmp), indent=2, ensure_ascii=False, allow_nan=False, default=str) + "\n"


# --------------------------------------------------------------------------- html


def _e(text: object) -> str:
    return escape(f.one_line(text), quote=True)


def _table(header: list[str], rows: list[list[str]], numeric: frozenset[int] | set[int] = frozenset()) -> str:
    th = "".join(f'<th class="n">{h}</th>' if i in numeric else f"<th>{h}</th>" for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


_HTML_CSS = """
:root { color-scheme: light; --fg:#1d1f23; --muted:#5b6270; --line:#dde1e6; --panel:#f6f7f9;
  --bad:#c62828; --warn:#b26a00; --good:#2e7d32; }
body { margin:0; font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif; color:var(--fg); }
main { max-width: 1080px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 22px; margin: 0 0 6px; } h2 { font-size: 18px; margin: 30px 0 10px; border-bottom: 1px solid var(--line); }
.meta, .muted { color: var(--muted); }
code { font-family: ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; font-size: 12.5px; background: var(--panel);
  padding: 1px 4px; border-radius: 3px; overflow-wrap: anywhere; }
.headline { font-size: 16px; padding: 10px 14px; border-radius: 8px; background: var(--panel); border-left: 5px solid var(--muted); }
.headline.faster { border-left-color: var(--good); } .headline.slower { border-left-color: var(--bad); }
.headline.within_noise, .headline.too_few_steps { border-left-color: var(--warn); }
.warn { color: var(--warn); }
table { border-collapse: collapse; width: 100%; margin: 8px 0; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top; overflow-wrap: anywhere; }
th { color: var(--muted); font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.better { color: var(--good); } .worse { color: var(--bad); }
.fixed { color: var(--good); font-weight: 600; } .new { color: var(--bad); font-weight: 600; }
.remaining { color: var(--warn); font-weight: 600; } .not_judged { color: var(--muted); font-weight: 600; }
.fixed, .new, .remaining, .not_judged { white-space: nowrap; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; }
svg.plot { display: block; max-width: 100%; height: auto; margin: 10px 0 4px; }
svg.plot text { font: 11px system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif; fill: #444; }
svg.plot text.ct { font-size: 13px; font-weight: 600; fill: #222; }
"""


def render_compare_html(cmp: Comparison) -> str:
    step = cmp.step_time
    body = [
        f"<h1>gpudoctor compare: {_e(VERDICT_LABELS[step.verdict])}</h1>",
        f'<p class="headline {step.verdict.value}">{_e(cmp.headline)}</p>',
    ]
    rows = [
        [f"<strong>{_e(s.label)}</strong>", f"<code>{_e(s.source)}</code>", _e(s.status or s.kind),
         f"<code>{_e(side_program(s))}</code>" if side_program(s) else "", _e(side_devices(s))]
        for s in (cmp.a, cmp.b)
    ]
    body.append(_table(["", "run", "status", "program", "devices"], rows))
    if cmp.warnings:
        body.append('<h2 id="warnings">Warnings</h2><ul>' + "".join(f'<li class="warn">{_e(w)}</li>' for w in cmp.warnings) + "</ul>")
    body.append('<h2 id="step-time">Step time</h2>')
    if step.basis_text:
        body.append(f'<p class="muted">Of: {_e(step.basis_text)}.</p>')
    if step.a is not None or step.b is not None:
        rows = [[_e(k), _e(a), _e(b)] for k, a, b in _step_rows(step.a, step.b)]
        rows.append(["of", _e(step.a.window if step.a else "n/a"), _e(step.b.window if step.b else "n/a")])
        body.append(_table(["", "A", "B"], rows, {1, 2}))
        sides = [(lab, t, col) for lab, t, col in (("A (before)", step.a, "#0072B2"), ("B (after)", step.b, "#D55E00"))
                 if t is not None]
        if sides:  # the two distributions on one axis: where each run's steps lie, not only their medians
            body.append(svg.ranges(
                "step-times-ab", "Step time, A and B (whisker min–max, box median–p90, tick the median)",
                [(lab, t.min_ns / 1e6, t.median_ns / 1e6, t.p90_ns / 1e6, t.max_ns / 1e6, col) for lab, t, col in sides],
                lambda v: f"{v:,.1f}", "ms",
            ))
        line = speedup_line(cmp)
        if line:
            body.append(f"<p>{_e(line)}.</p>")
    body.append(f"<p><strong>Verdict:</strong> {_e(step.verdict_text)}</p>")
    if cmp.metrics:
        rows = []
        for m in cmp.metrics:
            word = _improved_word(m)
            rows.append([
                _e(m.label), _e(value_text(m.a, m.unit)), _e(value_text(m.b, m.unit)),
                f'<span class="{word}">{_e(delta_text(m.delta, m.delta_unit))}</span>' if word else _e(delta_text(m.delta, m.delta_unit)),
                _e(word), _e(_metric_window(m)) + (f'<div class="muted">{_e(m.note)}</div>' if m.note else ""),
            ])
        body.append('<h2 id="figures">Figures</h2>' + _table(["figure", "A", "B", "change", "", "of"], rows, {1, 2, 3}))
    body.append('<h2 id="breakdown">Step breakdown</h2>')
    bd = cmp.breakdown
    if bd is not None:
        where = f"{_e(bd.window_a)} in each run" if bd.window_a == bd.window_b else f"A: {_e(bd.window_a)}; B: {_e(bd.window_b)}"
        body.append(f'<p class="muted">Share of profiled step time and mean time per profiled step, over {where}.</p>')
        rows = [
            [_e(f.component_label(r.component)), _e(f.pct(r.a_pct)), _e(f.duration(r.a_ns) if r.a_ns is not None else ""),
             _e(f.pct(r.b_pct)), _e(f.duration(r.b_ns) if r.b_ns is not None else ""), _e(delta_text(r.delta_pp, "pp")),
             _e(delta_text(r.delta_ns, "ns") if r.delta_ns is not None else "")]
            for r in bd.rows
        ]
        if bd.step_mean_a_ns is not None and bd.step_mean_b_ns is not None:
            rows.append(["<strong>profiled step (mean)</strong>", "", _e(f.duration(bd.step_mean_a_ns)), "",
                         _e(f.duration(bd.step_mean_b_ns)), "", _e(delta_text(bd.step_mean_b_ns - bd.step_mean_a_ns, "ns"))])
        body.append(_table(["component", "A", "A / step", "B", "B / step", "change", "change / step"], rows, {1, 2, 3, 4, 5, 6}))
        body += [f'<p class="muted">{_e(n)}</p>' for n in bd.notes]
    else:
        body.append(f'<p class="muted">{_e(cmp.breakdown_note or "not compared")}</p>')
    body.append(f'<h2 id="findings">Findings</h2><p>{_e(cmp.findings_summary)}</p>')
    if cmp.findings:
        rows = []
        for c in cmp.findings:
            msg = "".join(
                f"<div>{label}: {_e(text)}</div>" for label, text in (("A", c.message_a), ("B", c.message_b)) if text
            )
            if c.note:
                msg += f'<div class="muted">{_e(c.note)}</div>'
            rows.append([
                f'<span class="{c.status.value}">{_e(STATUS_LABELS[c.status])}</span>',
                f"<strong>{_e(c.code)}</strong> <code>{_e(c.name)}</code>" + (f" rank {c.rank}" if c.rank is not None else ""),
                _e(finding_share_text(c)), f"<code>{_e(str(c.location))}</code>" if c.location else "", msg,
            ])
        body.append(_table(["", "rule", "at stake", "where", "message"], rows))
    body.append('<h2 id="settings">Settings changed</h2>')
    if cmp.settings:
        rows = [
            [_e(s.category), f"<code>{_e(s.name)}</code>", f"<code>{_e(s.a)}</code>", f"<code>{_e(s.b)}</code>",
             f"<code>{_e(_setting_sites(s))}</code>" if _setting_sites(s) else ""]
            for s in cmp.settings
        ]
        body.append(_table(["", "setting", "A", "B", "set at"], rows))
    else:
        body.append(f'<p class="muted">None{": " + _e(cmp.settings_note) if cmp.settings_note else ""}.</p>')
    if cmp.notes:
        body.append('<h2 id="notes">Notes</h2><ul>' + "".join(f"<li>{_e(n)}</li>" for n in cmp.notes) + "</ul>")
    title = f"gpudoctor compare: {f.one_line(cmp.a.source)} → {f.one_line(cmp.b.source)}"
    return "\n".join([
        "<!doctype html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="referrer" content="no-referrer">',
        f"<title>{escape(title, quote=True)}</title>",
        f"<style>{_HTML_CSS}</style>",
        "</head>",
        "<body>",
        "<main>",
        *body,
        f"<footer>Generated by gpudoctor {_e(cmp.gpudoctor_version)} · {_e(cmp.created_at)} · comparison schema "
        f"{cmp.schema_version}. Self-contained: no script, no network.</footer>",
        "</main>",
        "</body>",
        "</html>",
        "",
    ])


# --------------------------------------------------------------------------- entry point


def render_comparison(cmp: Comparison, fmt: str, *, color: bool = False) -> str:
    """The comparison as ``fmt`` (terminal | md | json | html); ``color`` for the terminal only."""
    if fmt == "terminal":
        return render_compare_terminal(cmp, color=color)
    if fmt == "md":
        return render_compare_markdown(cmp)
    if fmt == "json":
        return render_compare_json(cmp)
    if fmt == "html":
        return render_compare_html(cmp)
    raise UsageError(f"`gpudoctor compare` cannot write {fmt!r}: use one of {', '.join(COMPARE_FORMATS)}")


__all__ = ["COMPARE_FORMATS", "comparison_dict", "render_comparison"]
