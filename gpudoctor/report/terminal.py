"""The terminal report: where the step goes and the top actions, then the findings ranked,
the checklist.

Colour (ANSI) only when asked (the CLI decides: `cli.use_color`); without it
the bar uses one letter per component so that it stays readable in a CI log.
Untrusted text (kernel names, paths, messages) has its control characters shown
as escapes, so a trace cannot move the cursor or recolour the terminal.
"""

from __future__ import annotations

from gpudoctor.model import ChecklistStatus, Finding, Report, Severity, TraceMetrics, VerifyStatus
from gpudoctor.report import _fmt as f

BAR_WIDTH = 50
MAX_BARS = 4  # traces shown as a bar; the rest are counted

_SEVERITY_COLOR = {Severity.ERROR: "1;31", Severity.WARNING: "1;33", Severity.INFO: "1;36"}
_VERIFY_COLOR = {VerifyStatus.CONFIRMED: "32", VerifyStatus.REFUTED: "31", VerifyStatus.INCONCLUSIVE: "33",
                 VerifyStatus.NOT_TRIED: "2"}
_STATUS_MARK = {
    ChecklistStatus.APPLIED: ("[x]", "32"),
    ChecklistStatus.RECOMMENDED: ("[ ]", "1;33"),
    ChecklistStatus.NO_PROBLEM_SEEN: (" ok", "2"),
    ChecklistStatus.NOT_APPLICABLE: (" - ", "2"),
    ChecklistStatus.NOT_MEASURABLE: (" ? ", "2"),
}
_COMPONENT_ANSI = {
    "gpu_fp32_conv": "92",
    "gpu_fp32_matmul": "32;1",
    "gpu_conv": "92",
    "gpu_matmul": "32",
    "gpu_optimizer": "36",
    "gpu_compute": "32",
    "h2d": "96",
    "d2h": "34",
    "comm_exposed": "94",
    "data_loading": "33",
    "sync_wait": "31",
    "launch_overhead": "91",
    "optimizer": "35",
    "cpu_compute": "32",
    "forward": "96",
    "backward": "36",
    "other_cpu": "93",
    "dependency_wait": "95",
    "unexplained": "90",
}

clean = f.clean
clean_line = f.one_line


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and text else text

    def bold(self, text: str) -> str:
        return self(text, "1")

    def dim(self, text: str) -> str:
        return self(text, "2")


def _bar_cells(parts: dict[str, float], width: int) -> list[tuple[str, int]]:
    """Cells per component so that they add up to ``width`` (largest remainder)."""
    keys = [k for k in f.component_order(parts) if parts[k] > 0]
    total = sum(parts[k] for k in keys)
    if total <= 0:
        return []
    exact = {k: parts[k] / total * width for k in keys}
    cells = {k: int(exact[k]) for k in keys}
    rest = width - sum(cells.values())
    for k in sorted(keys, key=lambda k: (-(exact[k] - cells[k]), keys.index(k)))[:rest]:
        cells[k] += 1
    return [(k, cells[k]) for k in keys if cells[k] > 0]


def _bar(parts: dict[str, float], st: _Style) -> list[str]:
    cells = _bar_cells(parts, BAR_WIDTH)
    if st.color:
        bar = "".join(st("█" * n, _COMPONENT_ANSI.get(k, "37")) for k, n in cells)
    else:
        bar = "".join(f.COMPONENT_LETTERS.get(k, "?") * n for k, n in cells)
    legend = []
    for k in f.component_order(k for k in parts if parts[k] > 0):
        mark = st("█", _COMPONENT_ANSI.get(k, "37")) if st.color else f.COMPONENT_LETTERS.get(k, "?")
        legend.append(f"{mark} {clean_line(f.component_label(k))} {f.pct(parts[k])}")
    lines = [f"  |{bar}|"]
    row = "  "
    for item in legend:
        if len(row) > 2 and len(row) + len(item) > 92:
            lines.append(row.rstrip())
            row = "  "
        row += item + "   "
    lines.append(row.rstrip())
    return lines


def _account_section(report: Report, st: _Style) -> list[str]:
    a = report.account
    if a is None:
        return []
    out = [st.bold("Where the step goes") + st.dim(f"  ({clean_line(f.account_title(a))})")]
    out.append("  " + clean_line(a.headline))
    out.extend(_bar({s.component: s.pct for s in a.ledger.slices}, st))
    if a.actions:
        now = f.account_now(a)
        out.append(st.bold("Top actions") + (st.dim(f"  ({clean_line(now)})") if now else ""))
        for n, act in enumerate(a.actions, 1):
            out.append(f"  {n}. {clean_line(f.action_text(act))}")
    else:
        out.append(st.dim("  no finding claims a part of this step"))
    if a.tried:
        out.append(st.bold("Tried, did not help"))
        out.extend(f"  - {clean_line(f.tried_text(x))}" for x in a.tried)
    out.extend(st.dim(f"  {clean_line(note)}") for note in a.notes)
    return out


def _breakdown_section(metrics: tuple[TraceMetrics, ...], st: _Style, account_key: str = "") -> list[str]:
    shown = [
        (i, m) for i, m in enumerate(metrics)
        if m.breakdown_mean_pct and not (account_key and f"trace:{m.path}" in account_key)
    ]
    if not shown:
        return []
    out = [st.bold("Step breakdown of the other traces") if account_key else st.bold("Step breakdown")]
    out[0] += st.dim("  (mean share of step time)")
    for i, m in shown[:MAX_BARS]:
        n = len(m.breakdown)
        steps = f"{n} step{'s' if n != 1 else ''}" if m.breakdown else "the whole trace"
        source = "ProfilerStep windows" if m.step_source == "ProfilerStep" else "no ProfilerStep markers"
        out.append(f"  {clean_line(f.trace_label(m, i))}: {steps} ({source})")
        out.extend(_bar(m.breakdown_mean_pct, st))
    if len(shown) > MAX_BARS:
        out.append(st.dim(f"  … {len(shown) - MAX_BARS} more traces: see the html or md report"))
    return out


def _finding(n: int, fd: Finding, st: _Style) -> list[str]:
    sev = st(f"{fd.severity.value.upper():<7}", _SEVERITY_COLOR[fd.severity])
    head = f"{n:>2}. {sev} {st.bold(fd.code)} {clean_line(fd.name)}"
    if fd.location is not None:
        head += f"  {clean_line(str(fd.location))}"
    if fd.rank is not None:
        head += f"  rank {fd.rank}"
    head += st.dim(f"  [{fd.confidence.value}]")
    pad = " " * 4
    label_w = 10
    out = [head, pad + clean_line(fd.message)]

    def field(label: str, lines: list[str]) -> None:
        for j, line in enumerate(lines):
            name = f"{label}:" if j == 0 else ""
            out.append(pad + st.dim(f"{name:<{label_w}}") + line)

    field("fix", [clean_line(fd.fix.instruction)])
    if fd.verification is not None:  # --verify: what was measured comes before what was expected
        v = fd.verification
        field("verified", [st(clean_line(f.verification_text(v)), _VERIFY_COLOR[v.status])])
        if v.changes:
            field("trial", [clean_line(f.verification_changes(v))])
    gain = f.gain_text(fd.gain)
    if gain:
        field("gain", [clean_line(gain)])
    ev: list[str] = [clean_line(f.metric_text(m)) for m in fd.evidence.metrics]
    for s in fd.evidence.settings:
        text = f"{s.name} = {f.with_unit(s.value)}"
        if s.location is not None:
            text += f" at {s.location}"
        ev.append(clean_line(text))
    for tr in fd.evidence.time_ranges:
        ev.append(clean_line(f"{tr.label or 'time range'} ({f.duration(tr.end_ns - tr.start_ns)})"))
    ev.extend(clean_line(note) for note in fd.evidence.notes)
    if ev:
        field("evidence", ev)
    label = f.snippet_label(fd.fix) if fd.fix.before or fd.fix.after else ""
    if label:
        field("code", [clean_line(label)])
    if fd.fix.before:
        field("before", [clean(line) for line in fd.fix.before.splitlines()])
    if fd.fix.after:
        field("after", [clean(line) for line in fd.fix.after.splitlines()])
    return out


def _findings_section(report: Report, st: _Style) -> list[str]:
    if not report.findings:
        return [st.bold("Findings") + ": none" + st.dim(f" ({len(report.rules_run)} rules looked)" if report.rules_run else "")]
    out = [st.bold(f"Findings: {f.findings_headline(report)}")]
    for n, fd in enumerate(report.findings, 1):
        out.extend(_finding(n, fd, st))
        out.append("")
    return out[:-1]


def _checklist_section(report: Report, st: _Style) -> list[str]:
    if not report.checklist:
        return []
    out = [st.bold("Checklist")]
    for status, items in f.checklist_by_status(report.checklist):
        mark, code = _STATUS_MARK[status]
        if status in (ChecklistStatus.APPLIED, ChecklistStatus.RECOMMENDED):
            groups = [(it.reason, [it]) for it in items]
        else:  # items that ask nothing: one sentence per distinct reason, not one per item
            groups = f.group_by_reason(items)
        for reason, same in groups:
            for it in same:
                out.append(f"  {st(mark, code)} {clean_line(it.title)}" + st.dim(f"  {f.STATUS_LABELS[status]}"))
            detail = clean_line(reason)
            gain = f.gain_text(same[0].gain) if status == ChecklistStatus.RECOMMENDED else ""
            if gain:
                detail += f"; {clean_line(gain)}"
            codes = [c for it in same for c in it.codes]
            if codes:
                detail += st.dim(f"  ({', '.join(clean_line(c) for c in codes)})")
            out.append(f"      {detail}")
    return out


def _summary_section(report: Report, st: _Style) -> list[str]:
    if not report.summary:
        return []
    width = max(len(clean_line(s.label)) for s in report.summary)
    out = [st.bold("Summary")]
    for s in report.summary:
        value = clean_line(f.with_unit(s.value, s.unit))
        window = st.dim(f"  (of {clean_line(s.window)})") if s.window else ""
        out.append(f"  {clean_line(s.label):<{width}}  {value}{window}")
    return out


def _ranks_section(report: Report, st: _Style) -> list[str]:
    if not report.ranks:
        return []
    mixed = f.mixed_jobs(report.ranks)
    cells = [f.rank_cells(r, mixed) for r in report.ranks]
    header = list(f.RANK_HEADER[:-1])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    out = [st.bold("Ranks"), st.dim("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))]
    for r, c in zip(report.ranks, cells, strict=True):
        flag = st("  straggler", "1;31") if r.straggler else ""
        out.append("  " + "  ".join(x.rjust(w) for x, w in zip(c[:-1], widths, strict=True)) + flag)
    for line in f.rank_summary_lines(report.rank_summary):
        if line.startswith("straggler:"):
            out.append("  " + st(clean_line(line), "1;31"))
        else:
            out.append(st.dim("  " + clean_line(line)))
    return out


def render_terminal(report: Report, *, color: bool = False, quiet: bool = False) -> str:
    st = _Style(color)
    warnings = [st(f"warning: {clean_line(w)}", "1;33") for w in report.warnings]  # every figure is read with them
    if quiet:
        return "\n".join([*warnings, *_findings_section(report, st)]) + "\n"
    sections: list[list[str]] = []
    head = [st.bold(f"gpudoctor {clean_line(report.gpudoctor_version)}") + f" · {clean_line(report.kind)} · {clean_line(report.source)}"]
    run = report.run
    if run is not None and run.manifest is not None:
        head.append(st.dim("  " + clean_line(f.run_line(run.manifest))))
    sections.append(head)
    sections.append(warnings)
    sections.append(_account_section(report, st))
    sections.append(_summary_section(report, st))
    if run is not None:
        sections.append(_breakdown_section(run.metrics, st, report.account.ledger.key if report.account else ""))
    sections.append(_findings_section(report, st))
    sections.append(_checklist_section(report, st))
    sections.append(_ranks_section(report, st))
    notes = [st(f"  error: {clean_line(e)}", "31") for e in report.errors]
    if run is not None:
        notes += [st.dim(f"  note: {clean_line(n)}") for n in run.notes]
    if notes:
        sections.append([st.bold("Notes"), *notes])
    return "\n\n".join("\n".join(s) for s in sections if s) + "\n"
