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

from gpudoctor.errors import UsageError
from gpudoctor.model import (
    Comparison,
    FindingStatus,
    StepTimeVerdict,
)
from gpudoctor.report import _fmt as f
from gpudoctor.report.compare_html import render_compare_html
from gpudoctor.report.compare_text import (
    STATUS_LABELS,
    VERDICT_LABELS,
    delta_text,
    finding_share_text,
    improved_word,
    metric_window,
    setting_sites,
    side_devices,
    side_line,
    side_program,
    speedup_line,
    step_rows,
    value_text,
)
from gpudoctor.report.jsonfmt import finite
from gpudoctor.report.markdown import cell, code, esc, table
from gpudoctor.safe import json_text

COMPARE_FORMATS = ("terminal", "md", "json", "html")


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
        rows = [["", "A", "B"]] + [list(r) for r in step_rows(step.a, step.b)]
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
                improved_word(m), cl(metric_window(m)),
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
            rows.append([cl(s.category), cl(s.name), cl(s.a), cl(s.b), cl(setting_sites(s))])
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
        rows = [[cell(k), cell(a), cell(b)] for k, a, b in step_rows(step.a, step.b)]
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
                cell(delta_text(m.delta, m.delta_unit)), cell(improved_word(m)), (esc(metric_window(m)) or " ") + note,
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
             code(setting_sites(s), table=True) or " "]
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
    text = json.dumps(comparison_dict(cmp), indent=2, ensure_ascii=False, allow_nan=False, default=str)
    return json_text(text) + "\n"


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
