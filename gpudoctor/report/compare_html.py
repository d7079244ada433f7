"""The comparison as an HTML page (``gpudoctor compare A B -o cmp.html``; ``report.compare``).

Self-contained, as the HTML report: inline CSS and SVG, a Content-Security-Policy that forbids any
fetch, no script; every string from the runs is escaped.
"""

from __future__ import annotations

from html import escape

from gpudoctor.model import (
    Comparison,
)
from gpudoctor.report import _fmt as f
from gpudoctor.report import svg
from gpudoctor.report._html import e1, table
from gpudoctor.report.compare_text import (
    STATUS_LABELS,
    VERDICT_LABELS,
    delta_text,
    finding_share_text,
    improved_word,
    metric_window,
    setting_sites,
    side_devices,
    side_program,
    speedup_line,
    step_rows,
    value_text,
)
from gpudoctor.report.htmlfmt import CSP

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
        f"<h1>gpudoctor compare: {e1(VERDICT_LABELS[step.verdict])}</h1>",
        f'<p class="headline {step.verdict.value}">{e1(cmp.headline)}</p>',
    ]
    rows = [
        [f"<strong>{e1(s.label)}</strong>", f"<code>{e1(s.source)}</code>", e1(s.status or s.kind),
         f"<code>{e1(side_program(s))}</code>" if side_program(s) else "", e1(side_devices(s))]
        for s in (cmp.a, cmp.b)
    ]
    body.append(table(["", "run", "status", "program", "devices"], rows))
    if cmp.warnings:
        body.append('<h2 id="warnings">Warnings</h2><ul>' + "".join(f'<li class="warn">{e1(w)}</li>' for w in cmp.warnings) + "</ul>")
    body.append('<h2 id="step-time">Step time</h2>')
    if step.basis_text:
        body.append(f'<p class="muted">Of: {e1(step.basis_text)}.</p>')
    if step.a is not None or step.b is not None:
        rows = [[e1(k), e1(a), e1(b)] for k, a, b in step_rows(step.a, step.b)]
        rows.append(["of", e1(step.a.window if step.a else "n/a"), e1(step.b.window if step.b else "n/a")])
        body.append(table(["", "A", "B"], rows, {1, 2}))
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
            body.append(f"<p>{e1(line)}.</p>")
    body.append(f"<p><strong>Verdict:</strong> {e1(step.verdict_text)}</p>")
    if cmp.metrics:
        rows = []
        for m in cmp.metrics:
            word = improved_word(m)
            rows.append([
                e1(m.label), e1(value_text(m.a, m.unit)), e1(value_text(m.b, m.unit)),
                f'<span class="{word}">{e1(delta_text(m.delta, m.delta_unit))}</span>' if word else e1(delta_text(m.delta, m.delta_unit)),
                e1(word), e1(metric_window(m)) + (f'<div class="muted">{e1(m.note)}</div>' if m.note else ""),
            ])
        body.append('<h2 id="figures">Figures</h2>' + table(["figure", "A", "B", "change", "", "of"], rows, {1, 2, 3}))
    body.append('<h2 id="breakdown">Step breakdown</h2>')
    bd = cmp.breakdown
    if bd is not None:
        where = f"{e1(bd.window_a)} in each run" if bd.window_a == bd.window_b else f"A: {e1(bd.window_a)}; B: {e1(bd.window_b)}"
        body.append(f'<p class="muted">Share of profiled step time and mean time per profiled step, over {where}.</p>')
        rows = [
            [e1(f.component_label(r.component)), e1(f.pct(r.a_pct)), e1(f.duration(r.a_ns) if r.a_ns is not None else ""),
             e1(f.pct(r.b_pct)), e1(f.duration(r.b_ns) if r.b_ns is not None else ""), e1(delta_text(r.delta_pp, "pp")),
             e1(delta_text(r.delta_ns, "ns") if r.delta_ns is not None else "")]
            for r in bd.rows
        ]
        if bd.step_mean_a_ns is not None and bd.step_mean_b_ns is not None:
            rows.append(["<strong>profiled step (mean)</strong>", "", e1(f.duration(bd.step_mean_a_ns)), "",
                         e1(f.duration(bd.step_mean_b_ns)), "", e1(delta_text(bd.step_mean_b_ns - bd.step_mean_a_ns, "ns"))])
        body.append(table(["component", "A", "A / step", "B", "B / step", "change", "change / step"], rows, {1, 2, 3, 4, 5, 6}))
        body += [f'<p class="muted">{e1(n)}</p>' for n in bd.notes]
    else:
        body.append(f'<p class="muted">{e1(cmp.breakdown_note or "not compared")}</p>')
    body.append(f'<h2 id="findings">Findings</h2><p>{e1(cmp.findings_summary)}</p>')
    if cmp.findings:
        rows = []
        for c in cmp.findings:
            msg = "".join(
                f"<div>{label}: {e1(text)}</div>" for label, text in (("A", c.message_a), ("B", c.message_b)) if text
            )
            if c.note:
                msg += f'<div class="muted">{e1(c.note)}</div>'
            rows.append([
                f'<span class="{c.status.value}">{e1(STATUS_LABELS[c.status])}</span>',
                f"<strong>{e1(c.code)}</strong> <code>{e1(c.name)}</code>" + (f" rank {c.rank}" if c.rank is not None else ""),
                e1(finding_share_text(c)), f"<code>{e1(str(c.location))}</code>" if c.location else "", msg,
            ])
        body.append(table(["", "rule", "at stake", "where", "message"], rows))
    body.append('<h2 id="settings">Settings changed</h2>')
    if cmp.settings:
        rows = [
            [e1(s.category), f"<code>{e1(s.name)}</code>", f"<code>{e1(s.a)}</code>", f"<code>{e1(s.b)}</code>",
             f"<code>{e1(setting_sites(s))}</code>" if setting_sites(s) else ""]
            for s in cmp.settings
        ]
        body.append(table(["", "setting", "A", "B", "set at"], rows))
    else:
        body.append(f'<p class="muted">None{": " + e1(cmp.settings_note) if cmp.settings_note else ""}.</p>')
    if cmp.notes:
        body.append('<h2 id="notes">Notes</h2><ul>' + "".join(f"<li>{e1(n)}</li>" for n in cmp.notes) + "</ul>")
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
        f"<footer>Generated by gpudoctor {e1(cmp.gpudoctor_version)} · {e1(cmp.created_at)} · comparison schema "
        f"{cmp.schema_version}. Self-contained: no script, no network.</footer>",
        "</main>",
        "</body>",
        "</html>",
        "",
    ])
