"""The HTML report: one self-contained file that opens offline.

No script, no external style sheet, font, image or request: the CSS is inline, the
plots are inline SVG (``report/svg.py``), and a Content-Security-Policy forbids any
fetch, so the file shows the same on a laptop without network as in a CI artifact.
Every string from the run (kernel names, paths, messages, settings) is escaped.

Sections: headline numbers; findings with fix, evidence and before/after code; the
checklist; per-step stacked time breakdown and step times; GPU utilization and
memory over time (NVML samples, else the trace's busy time per interval); host CPU;
the idle-gap distribution and its causes; top kernels and ops; transfers and
synchronizations; ranks; the run, its environment and notes; the rule catalogue. The page
and its text sections are built here, the figures in ``report/htmlfigures.py``.
"""

from __future__ import annotations

from html import escape

from gpudoctor.model import ChecklistStatus, Finding, Report
from gpudoctor.report import _fmt as f
from gpudoctor.report import svg
from gpudoctor.report._html import e, e1, rich, table
from gpudoctor.report.htmlfigures import (  # noqa: F401 - MAX_POINTS: re-exported
    MAX_POINTS,
    breakdown_plot,
    busy_timeline,
    cpu_samples,
    gpu_samples,
    mean_table,
    step_times,
    trace_section,
)

MAX_TRACES = 16  # traces drawn in full; the others are listed

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

CSS = """
:root { color-scheme: light; --fg:#1d1f23; --muted:#5b6270; --line:#dde1e6; --bg:#ffffff; --panel:#f6f7f9;
  --err:#c62828; --warn:#b26a00; --info:#1565c0; --ok:#2e7d32; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
  color:var(--fg); background:var(--bg); }
main { max-width: 1080px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 36px 0 12px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 20px 0 8px; }
.meta, .muted { color: var(--muted); }
code, pre { font-family: ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; font-size: 12.5px; }
code { background: var(--panel); padding: 1px 4px; border-radius: 3px; overflow-wrap: anywhere; }
pre { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px;
  overflow-x: auto; margin: 6px 0; white-space: pre; }
nav { margin: 14px 0 0; display: flex; flex-wrap: wrap; gap: 6px 14px; font-size: 13px; }
nav a { color: var(--info); text-decoration: none; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px; margin-top: 18px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; }
.card .v { font-size: 20px; font-weight: 600; }
.card .k { color: var(--muted); font-size: 12.5px; }
.finding { border: 1px solid var(--line); border-left: 5px solid var(--muted); border-radius: 8px;
  padding: 12px 16px; margin: 12px 0; }
.finding.error { border-left-color: var(--err); } .finding.warning { border-left-color: var(--warn); }
.finding.info { border-left-color: var(--info); }
.finding .msg { font-size: 15px; margin: 6px 0; }
.badge { display: inline-block; font-size: 11.5px; font-weight: 600; text-transform: uppercase; letter-spacing: .03em;
  border-radius: 4px; padding: 1px 6px; color: #fff; background: var(--muted); white-space: nowrap; }
.badge.error { background: var(--err); } .badge.warning { background: var(--warn); } .badge.info { background: var(--info); }
.badge.applied { background: var(--ok); } .badge.recommended { background: var(--warn); }
.badge.no_problem_seen { background: #5f8f73; }
.badge.not_applicable, .badge.not_measurable { background: #8a9099; }
.ledger { display: flex; height: 26px; border-radius: 4px; overflow: hidden; margin: 10px 0 4px; border: 1px solid var(--line); }
.ledger span { display: block; height: 100%; }
.account .headline { font-size: 16px; margin: 4px 0; }
ol.actions li { margin: 2px 0; }

.verify { font-weight: 600; } .verify.confirmed { color: var(--ok); } .verify.refuted { color: var(--err); }
.verify.inconclusive { color: var(--warn); } .verify.not_tried { color: #8a9099; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 3px 14px; margin: 8px 0; }
dl.kv dt { color: var(--muted); } dl.kv dd { margin: 0; }
.snippets { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 10px; }
.snippets > div { min-width: 0; }
code.name { overflow-wrap: anywhere; word-break: break-all; white-space: normal; }
.snippets .label { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; margin: 8px 0; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top;
  overflow-wrap: anywhere; }
th { color: var(--muted); font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
svg.plot { display: block; max-width: 100%; height: auto; margin: 10px 0 4px; }
svg.plot text { font: 11px system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif; fill: #444; }
svg.plot text.ct { font-size: 13px; font-weight: 600; fill: #222; }
svg.plot .bar:hover rect { opacity: .8; }
details > summary { cursor: pointer; }
.trace { border: 1px solid var(--line); border-radius: 8px; padding: 4px 14px 10px; margin: 10px 0; }
.trace > summary { font-weight: 600; padding: 6px 0; }
.note { color: var(--muted); font-style: italic; }
footer { margin-top: 48px; color: var(--muted); font-size: 12px; }
@media (max-width: 720px) { .snippets { grid-template-columns: 1fr; } }
@media print { nav { display: none; } }
"""


# --------------------------------------------------------------------------- findings and checklist


def _finding(n: int, fd: Finding) -> str:
    sev = fd.severity.value
    head = [f'<span class="badge {sev}">{sev}</span>', f"<strong>{e1(fd.code)}</strong>", f"<code>{e1(fd.name)}</code>"]
    if fd.location is not None:
        head.append(f"at <code>{e1(str(fd.location))}</code>")
    if fd.rank is not None:
        head.append(f"rank {fd.rank}")
    head.append(f'<span class="muted">{e1(fd.confidence.value)}</span>')
    kv = [f"<dt>Fix</dt><dd>{rich(fd.fix.instruction)}</dd>"]
    if fd.verification is not None:  # --verify: what was measured comes before what was expected
        v = fd.verification
        kv.append(f'<dt>Verified</dt><dd><span class="verify {e1(v.status.value)}">{e1(f.VERIFY_LABELS[v.status])}</span>'
                  f"{e1(f.verification_text(v)[len(f.VERIFY_LABELS[v.status]):])}</dd>")
        if v.changes:
            kv.append(f"<dt>Trial change</dt><dd>{e1(f.verification_changes(v))}</dd>")
    gain = f.gain_text(fd.gain)
    if gain:
        kv.append(f"<dt>Gain</dt><dd>{e1(gain)}</dd>")
    ev = [e1(f.metric_text(m)) for m in fd.evidence.metrics]
    for s in fd.evidence.settings:
        item = f"<code>{e1(s.name)}</code> = <code>{e1(f.with_unit(s.value))}</code>"
        if s.location is not None:
            item += f" at <code>{e1(str(s.location))}</code>"
        ev.append(item)
    ev += [f"{e1(tr.label or 'time range')} ({e1(f.duration(tr.end_ns - tr.start_ns))})" for tr in fd.evidence.time_ranges]
    ev += [rich(note) for note in fd.evidence.notes]
    if ev:
        kv.append("<dt>Evidence</dt><dd>" + "<br>".join(ev) + "</dd>")
    parts = [
        f'<article class="finding {sev}" id="finding-{n}">',
        f"<div>{n}. {' '.join(head)}</div>",
        f'<p class="msg">{rich(fd.message)}</p>',
        f'<dl class="kv">{"".join(kv)}</dl>',
    ]
    if fd.fix.before or fd.fix.after:
        label = f.snippet_label(fd.fix)
        if label:
            parts.append(f'<p class="snippet-source">{e(label)}</p>')
        parts.append('<div class="snippets">')
        for label, code in (("before", fd.fix.before), ("after", fd.fix.after)):
            if code:
                parts.append(f'<div><div class="label">{label}</div><pre><code>{e(code)}</code></pre></div>')
        parts.append("</div>")
    parts.append("</article>")
    return "\n".join(parts)


def _findings(report: Report) -> str:
    if not report.findings:
        looked = f" ({len(report.rules_run)} rules looked)" if report.rules_run else ""
        return f'<h2 id="findings">Findings</h2><p>None: nothing to fix was found{e(looked)}.</p>'
    body = "\n".join(_finding(n, fd) for n, fd in enumerate(report.findings, 1))
    return f'<h2 id="findings">Findings: {e(f.findings_headline(report))}</h2>\n{body}'


def _checklist(report: Report) -> str:
    if not report.checklist:
        return ""
    rows = []
    for status, items in f.checklist_by_status(report.checklist):
        for it in items:
            gain = f.gain_text(it.gain) if status == ChecklistStatus.RECOMMENDED else ""
            rows.append(
                [
                    f'<span class="badge {status.value}">{e(f.STATUS_LABELS[status])}</span>',
                    e1(it.title),
                    rich(it.reason),
                    e1(gain),
                    e1(", ".join(it.codes)),
                ]
            )
    return '<h2 id="checklist">Checklist</h2>' + table(["status", "technique", "why", "gain", "rules"], rows)


# --------------------------------------------------------------------------- page


def _header(report: Report) -> str:
    run = report.run
    meta = f"{e(report.kind)} · <code>{e1(report.source)}</code> · gpudoctor {e(report.gpudoctor_version)} · {e(report.created_at)}"
    parts = [f"<h1>gpudoctor: {e(f.findings_headline(report))}</h1>", f'<div class="meta">{meta}</div>']
    if run is not None and run.manifest is not None:
        parts.append(f'<div class="meta">{e1(f.run_line(run.manifest))}</div>')
    for w in report.warnings:  # what every figure below is to be read with
        parts.append(f'<p class="finding warning"><span class="badge warning">warning</span> {e1(w)}</p>')
    if report.summary:
        cards = []
        for s in report.summary:
            window = f" (of {e1(s.window)})" if s.window else ""
            cards.append(f'<div class="card"><div class="v">{e1(f.with_unit(s.value, s.unit))}</div><div class="k">{e1(s.label)}{window}</div></div>')
        parts.append(f'<div class="cards">{"".join(cards)}</div>')
    return "\n".join(parts)


def _account(report: Report) -> str:
    """Where the step goes: the headline, one exclusive bar, the parts, and the top actions."""
    a = report.account
    if a is None:
        return ""
    parts = f.account_parts(a)
    bar = "".join(
        f'<span style="width:{p:.3f}%;background:{svg.esc(f.component_color(comp))}" '
        f'title="{e1(f.component_label(comp))}: {e(f.pct(p))}"></span>'
        for comp, p, _, _ in sorted(parts, key=lambda r: f.component_order([x[0] for x in parts]).index(r[0]))
    )
    rows = [
        [
            f'<span style="color:{svg.esc(f.component_color(comp))}">■</span> {e(f.component_label(comp))}',
            e(f.pct(p)),
            e(f.duration(ns)),
            "GPU busy" if side == "device" else "host side",
        ]
        for comp, p, ns, side in parts
    ]
    out = [
        '<section class="account">',
        '<h2 id="account">Where the step goes</h2>',
        f'<p class="headline">{e1(a.headline)}</p>',
    ]
    # the diagnosis first: what to change and what it wins, then the parts it comes from
    if a.actions:
        now = f.account_now(a)
        out.append(f'<h3 id="actions">Top actions{e(": " + now) if now else ""}</h3>')
        out.append('<ol class="actions">' + "".join(f"<li>{e1(f.action_text(x))}</li>" for x in a.actions) + "</ol>")
    else:
        out.append('<p class="note">No finding claims a part of this step.</p>')
    if a.tried:
        out.append('<h3 id="tried">Tried, did not help</h3>')
        out.append("<ul>" + "".join(f"<li>{e1(f.tried_text(x))}</li>" for x in a.tried) + "</ul>")
    out += [
        f'<p class="muted">{e1(f.account_title(a))}</p>',
        f'<div class="ledger">{bar}</div>',
        table(["part of the step", "share", "per step", "side"], rows, numeric=[1, 2]),
    ]
    out += [f'<p class="note">{e1(n)}</p>' for n in a.notes]
    out.append("</section>")
    return "\n".join(out)


def _nav(sections: list[tuple[str, str]]) -> str:
    return "<nav>" + "".join(f'<a href="#{sid}">{e(title)}</a>' for sid, title in sections) + "</nav>"


def _run_section(report: Report) -> str:
    out = []
    if report.environment:
        out.append(table(["", ""], [[e1(k), f"<code>{e1(v)}</code>"] for k, v in report.environment.items()]))
    run = report.run
    mf = run.manifest if run is not None else None
    if mf is not None:
        facts = [("command", "gpudoctor profile " + " ".join(mf.command)), ("cwd", mf.cwd), ("started", mf.started_at), ("status", mf.status.value)]
        if mf.status_detail:
            facts.append(("detail", mf.status_detail))
        if mf.exit_code is not None:
            facts.append(("exit code", str(mf.exit_code)))
        if mf.exception is not None:
            where = f" at {mf.exception.call_site}" if mf.exception.call_site else ""
            facts.append(("exception", f"{mf.exception.type}: {mf.exception.message}{where}"))
        facts.append(("steps seen", f"{mf.steps_seen:,} (steps found by {mf.step_source})"))
        out.append('<dl class="kv">' + "".join(f"<dt>{e(a)}</dt><dd><code>{e1(b)}</code></dd>" for a, b in facts) + "</dl>")
        if mf.collected:
            out.append(
                table(
                    ["instrument", "collected", "why not / detail"],
                    [[e1(c.name), "yes" if c.ok else "<strong>no</strong>", e1(c.reason or c.detail)] for c in mf.collected],
                )
            )
    notes = [f'<li><strong>error:</strong> {e1(x)}</li>' for x in report.errors]
    if run is not None:
        notes += [f"<li>{e1(n)}</li>" for n in run.notes]
    if notes:
        out.append("<h3>Notes</h3><ul>" + "".join(notes) + "</ul>")
    return "\n".join(out)


def _ranks(report: Report) -> str:
    if not report.ranks:
        return ""
    mixed = f.mixed_jobs(report.ranks)
    rows = []
    for r in report.ranks:
        c = [e(x) for x in f.rank_cells(r, mixed)]
        c[-1] = '<span class="badge error">straggler</span>' if r.straggler else ""
        rows.append(c)
    lines = f.rank_summary_lines(report.rank_summary)
    summary = ""
    if lines:
        summary = "<ul>" + "".join(
            f"<li><strong>{e1(x)}</strong></li>" if x.startswith("straggler:") else f"<li>{e1(x)}</li>" for x in lines
        ) + "</ul>"
    return '<h2 id="ranks">Ranks</h2>' + table(list(f.RANK_HEADER), rows, numeric=[0, 1, 2, 3, 4, 5, 6]) + summary


def _rules(report: Report) -> str:
    if not report.rules:
        return ""
    items = [
        f"<details><summary><strong>{e1(r.code)}</strong> <code>{e1(r.name)}</code>: {e1(r.title)}</summary><pre>{e(r.doc)}</pre></details>"
        for r in report.rules
    ]
    return '<h2 id="rules">Rules</h2>' + "\n".join(items)


def render_html(report: Report) -> str:
    run = report.run
    sections: list[tuple[str, str]] = []
    body = []
    account = _account(report)
    if account:
        sections.append(("account", "Where the step goes"))
        body.append(account)
    sections.append(("findings", "Findings"))
    body.append(_findings(report))
    checklist = _checklist(report)
    if checklist:
        sections.append(("checklist", "Checklist"))
        body.append(checklist)
    if run is not None:
        timeline = [step_times(run), gpu_samples(run.samples) or busy_timeline(run.metrics), cpu_samples(run.samples)]
        timeline = [t for t in timeline if t]
        if timeline:
            sections.append(("timeline", "Over time"))
            body.append('<h2 id="timeline">Over time</h2>' + "\n".join(timeline))
        elif run.metrics or run.steps:
            body.append('<h2 id="timeline">Over time</h2><p class="note">No time series: no NVML samples and no busy timeline in the trace.</p>')
        if run.metrics:
            sections.append(("traces", "Traces"))
            traces = [trace_section(m, i, i == 0) for i, m in enumerate(run.metrics[:MAX_TRACES])]
            if len(run.metrics) > MAX_TRACES:
                rest = ", ".join(f.trace_label(m, i) for i, m in enumerate(run.metrics) if i >= MAX_TRACES)
                traces.append(f'<p class="note">{len(run.metrics) - MAX_TRACES} more traces are in the JSON report: {e1(rest)}</p>')
            body.append('<h2 id="traces">Traces</h2>' + "\n".join(traces))
    ranks = _ranks(report)
    if ranks:
        sections.append(("ranks", "Ranks"))
        body.append(ranks)
    run_html = _run_section(report)
    if run_html:
        sections.append(("run", "Run and environment"))
        body.append('<h2 id="run">Run and environment</h2>' + run_html)
    rules = _rules(report)
    if rules:
        sections.append(("rules", "Rules"))
        body.append(rules)
    title = f"gpudoctor report: {f.one_line(report.source)}"
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            '<meta name="referrer" content="no-referrer">',
            f"<title>{escape(title, quote=True)}</title>",
            f"<style>{CSS}</style>",
            "</head>",
            "<body>",
            "<main>",
            _header(report),
            _nav(sections),
            *body,
            f"<footer>Generated by gpudoctor {e(report.gpudoctor_version)} · report schema {report.schema_version}. "
            "Self-contained: no script, no network.</footer>",
            "</main>",
            "</body>",
            "</html>",
            "",
        ]
    )
