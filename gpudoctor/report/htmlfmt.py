"""The HTML report: one self-contained file that opens offline.

No script, no external style sheet, font, image or request: the CSS is inline, the
plots are inline SVG (``report/svg.py``), and a Content-Security-Policy forbids any
fetch, so the file shows the same on a laptop without network as in a CI artifact.
Every string from the run (kernel names, paths, messages, settings) is escaped.

Sections: headline numbers; findings with fix, evidence and before/after code; the
checklist; per-step stacked time breakdown and step times; GPU utilization and
memory over time (NVML samples, else the trace's busy time per interval); host CPU;
the idle-gap distribution and its causes; top kernels and ops; transfers and
synchronizations; ranks; the run, its environment and notes; the rule catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from gpudoctor.model import (
    ChecklistStatus,
    Finding,
    NameStat,
    Report,
    RunData,
    Samples,
    TraceMetrics,
)
from gpudoctor.report import _fmt as f
from gpudoctor.report import svg

MAX_TRACES = 16  # traces drawn in full; the others are listed
MAX_STEPS_DRAWN = 400
MAX_SAMPLE_LINES = 8
MAX_POINTS = 2000  # samples drawn per line; a longer run draws every k-th sample
OPEN_ENDED_NS = 10**15  # a histogram bin ending past ~11 days is open-ended

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


def e(text: object) -> str:
    """Escaped text; control characters shown as visible escapes (``_fmt.markup``, as the SVG charts)."""
    return f.markup(text)


def e1(text: object) -> str:
    """Escaped text on one line."""
    return escape(f.one_line(text), quote=True)


def rich(text: object) -> str:
    """Escaped text on one line; `backtick` pairs become <code>."""
    return "".join(
        f"<code>{escape(part, quote=True)}</code>" if is_code else escape(part, quote=True) for is_code, part in f.code_parts(text)
    )


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A table; header and cells must already be escaped HTML."""
    num = set(numeric)
    th = "".join(f'<th class="n">{h}</th>' if i in num else f"<th>{h}</th>" for i, h in enumerate(header))
    body = []
    for r in rows:
        body.append("<tr>" + "".join(f'<td class="n">{c}</td>' if i in num else f"<td>{c}</td>" for i, c in enumerate(r)) + "</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _tick(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:.3g}"


def _time_scale(max_ns: float) -> tuple[float, str]:
    """The unit an axis of durations up to ``max_ns`` reads best in: (ns per unit, unit)."""
    for scale, unit in ((6e10, "min"), (1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if max_ns >= (10 * scale if unit == "min" else scale):
            return scale, unit
    return 1.0, "ns"


def _time_fmt(unit: str):
    return lambda v: f"{_tick(v)} {unit}"


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
    return '<h2 id="checklist">Checklist</h2>' + _table(["status", "technique", "why", "gain", "rules"], rows)


# --------------------------------------------------------------------------- steps


def _breakdown_plot(m: TraceMetrics, idx: int) -> str:
    bd = m.breakdown[:MAX_STEPS_DRAWN]
    if not bd:
        return ""
    keys: list[str] = []
    for b in bd:
        keys += [k for k in b.parts_ns if k not in keys]
    keys = f.component_order(keys)
    scale, unit = _time_scale(max(b.dur_ns for b in bd))
    series = [
        svg.Series(f.component_label(k), f.component_color(k), [b.parts_ns.get(k, 0) / scale for b in bd]) for k in keys
    ]
    chart = svg.stacked_bars(
        f"breakdown-{idx}",
        "Where each profiled step's time went",
        [f"#{b.step}" for b in bd],
        series,
        _time_fmt(unit),
        unit,
    )
    more = f'<p class="note">First {MAX_STEPS_DRAWN} of {len(m.breakdown)} steps drawn.</p>' if len(m.breakdown) > MAX_STEPS_DRAWN else ""
    return chart + more


def _mean_table(m: TraceMetrics) -> str:
    if not m.breakdown_mean_pct:
        return ""
    rows = [
        [f'<span style="color:{svg.esc(f.component_color(k))}">■</span> {e(f.component_label(k))}', e(f.pct(m.breakdown_mean_pct[k]))]
        for k in f.component_order(m.breakdown_mean_pct)
    ]
    return _table(["component", "mean share of step time"], rows, numeric=[1])


def _step_times(run: RunData) -> str:
    steps = run.steps[:MAX_STEPS_DRAWN]
    if not steps:
        return ""
    scale, unit = _time_scale(max(s.wall_ns for s in steps))
    chart = svg.overlaid_bars(
        "step-times",
        "Every step of the run: wall time and time waiting for data",
        [str(s.index) for s in steps],
        svg.Series("step wall time", "#009E73", [s.wall_ns / scale for s in steps]),
        svg.Series("waiting for the next batch", "#E69F00", [s.data_wait_ns / scale for s in steps]),
        _time_fmt(unit),
        unit,
    )
    more = f'<p class="note">First {MAX_STEPS_DRAWN} of {len(run.steps)} steps drawn.</p>' if len(run.steps) > MAX_STEPS_DRAWN else ""
    return chart + more


# --------------------------------------------------------------------------- over time


def _stride(n: int) -> tuple[int, str]:
    """Every k-th sample is drawn when there are more than MAX_POINTS (display only)."""
    k = -(-n // MAX_POINTS)
    return (k, f"; every {k}th sample drawn") if k > 1 else (1, "")


def _gpu_samples(samples: Samples | None) -> str:
    if samples is None or not samples.gpu:
        return ""
    devices = sorted({g.index for g in samples.gpu})
    k, drawn = _stride(max(sum(1 for g in samples.gpu if g.index == d) for d in devices))
    scale, unit = _time_scale(max(g.t_ns for g in samples.gpu))
    palette = ("#009E73", "#0072B2", "#D55E00", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
    util_series, mem_series, xs_by_dev = [], [], {}
    for j, d in enumerate(devices[:MAX_SAMPLE_LINES]):
        rows = [g for g in samples.gpu if g.index == d][::k]
        xs_by_dev[d] = [g.t_ns / scale for g in rows]
        util_series.append((d, svg.Series(f"GPU {d} utilization", palette[j % len(palette)], [g.util_pct for g in rows])))
        mem_series.append(
            (d, svg.Series(f"GPU {d} memory used", palette[j % len(palette)],
                           [None if g.mem_used_bytes is None else g.mem_used_bytes / 2**30 for g in rows]))
        )
    # All devices are sampled together: one x axis (the first device's), lines per device.
    xs = xs_by_dev[devices[0]]
    same = all(len(xs_by_dev[d]) == len(xs) for d in xs_by_dev)
    if not same:  # draw the first device only rather than misalign the others
        util_series, mem_series = util_series[:1], mem_series[:1]
    interval = f", every {f.number(samples.interval_ms)} ms" if samples.interval_ms else ""
    out = [
        svg.lines(
            "gpu-util",
            f"GPU utilization over the run (NVML{interval}{drawn})",
            xs,
            [s for _, s in util_series],
            _time_fmt(unit),
            lambda v: f"{_tick(v)}%",
            y_top=100,
            unit_label="%",
        )
    ]
    totals = [g.mem_total_bytes for g in samples.gpu if g.mem_total_bytes]
    if any(v is not None for _, s in mem_series for v in s.values):
        out.append(
            svg.lines(
                "gpu-mem",
                f"GPU memory used over the run (NVML{drawn})",
                xs,
                [s for _, s in mem_series],
                _time_fmt(unit),
                lambda v: f"{_tick(v)} GiB",
                y_top=max(totals) / 2**30 if totals else None,
                unit_label="GiB",
            )
        )
    return "\n".join(out)


def _busy_timeline(metrics: Sequence[TraceMetrics]) -> str:
    for i, m in enumerate(metrics):
        for u in m.utilization:
            if u.busy_timeline:
                t0 = u.busy_timeline[0].start_ns
                scale, unit = _time_scale(u.busy_timeline[-1].start_ns - t0)
                return svg.lines(
                    f"busy-{i}-{u.device}",
                    f"GPU {u.device} busy share over the trace ({f.trace_label(m, i)}; no NVML samples)",
                    [(b.start_ns - t0) / scale for b in u.busy_timeline],
                    [svg.Series("busy (kernel, memcpy or memset running)", "#009E73", [b.busy_pct for b in u.busy_timeline])],
                    _time_fmt(unit),
                    lambda v: f"{_tick(v)}%",
                    y_top=100,
                    unit_label="%",
                )
    return ""


def _cpu_samples(samples: Samples | None) -> str:
    if samples is None or not samples.process:
        return ""
    keys: list[tuple[str, int]] = []
    for p in samples.process:
        if (p.role, p.pid) not in keys:
            keys.append((p.role, p.pid))
    keys = sorted(keys, key=lambda k: (k[0] != "main", k[1]))[:MAX_SAMPLE_LINES]
    times = sorted({p.t_ns for p in samples.process})
    k, drawn = _stride(len(times))
    times = times[::k]
    by_key = {(p.role, p.pid, p.t_ns): p.cpu_pct for p in samples.process}
    palette = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
    series = [
        svg.Series(f"{role} {pid}", palette[j % len(palette)], [by_key.get((role, pid, t)) for t in times])
        for j, (role, pid) in enumerate(keys)
    ]
    cores = f" ({samples.system_cpu_count} cores)" if samples.system_cpu_count else ""
    scale, unit = _time_scale(times[-1])
    return svg.lines(
        "cpu",
        f"Host CPU of the training process and its DataLoader workers (100% = one core{cores}{drawn})",
        [t / scale for t in times],
        series,
        _time_fmt(unit),
        lambda v: f"{_tick(v)}%",
        unit_label="%",
    )


# --------------------------------------------------------------------------- per trace


def _gaps(m: TraceMetrics, idx: int) -> str:
    out = []
    for u in m.utilization:
        head = (
            f"<h3>GPU {u.device}: idle {e(f.pct(u.idle_pct_span))} of the span"
            + (f", {e(f.pct(u.idle_pct_steps))} of the profiled steps" if u.idle_pct_steps is not None else "")
            + (f", {e(f.pct(u.idle_pct_hta))} of the HTA window" if u.idle_pct_hta is not None else "")
            + "</h3>"
        )
        out.append(head)
        out.append(
            f'<p class="muted">{u.gap_count:,} idle gaps ({u.gaps_over_1ms:,} over 1 ms) cut from the '
            f"{e(u.gaps_window.value)} window; span {e(f.duration(u.span.dur_ns))}, "
            f"busy {e(f.duration(u.busy_ns_span))}.</p>"
        )
        if u.gap_histogram:
            labels = [_bin_label(b.lo_ns, b.hi_ns) for b in u.gap_histogram]
            idle = sum(b.total_ns for b in u.gap_histogram) or 1
            tips = [f"{lab}: {f.duration(b.total_ns)} idle ({f.pct(100.0 * b.total_ns / idle)} of the idle time), "
                    f"{b.count:,} gaps" for lab, b in zip(labels, u.gap_histogram, strict=True)]
            # by idle time, not by count: thousands of µs gaps must not tower over the few long
            # ones that hold the idle time
            out.append(
                svg.columns(
                    f"gaps-{idx}-{u.device}",
                    f"Idle time by gap length, GPU {u.device} (ms of idle time in gaps of each length)",
                    labels,
                    [b.total_ns / 1e6 for b in u.gap_histogram],
                    tips,
                    "#D55E00",
                    lambda v: f"{v:,.1f}",
                    "ms idle",
                )
            )
            out.append(
                _table(
                    ["gap length", "gaps", "idle time"],
                    [[e(lab), f"{b.count:,}", e(f.duration(b.total_ns))] for lab, b in zip(labels, u.gap_histogram, strict=True)],
                    numeric=[1, 2],
                )
            )
        if u.gap_causes:
            out.append(
                _table(
                    ["cause", "gaps", "idle time", "share of idle", "most frequent"],
                    [
                        [e(c.cause.value), f"{c.count:,}", e(f.duration(c.total_ns)), e(f.pct(c.share_of_idle_pct)), f"<code>{e1(c.top_detail)}</code>" if c.top_detail else ""]
                        for c in u.gap_causes
                    ],
                    numeric=[1, 2, 3],
                )
            )
        if u.top_gaps:
            out.append("<details><summary>Longest gaps</summary>")
            out.append(
                _table(
                    ["length", "cause", "step", "what the host was doing"],
                    [
                        [e(f.duration(g.end_ns - g.start_ns)), e(g.cause.value), "" if g.step is None else str(g.step), f"<code>{e1(g.detail)}</code>" if g.detail else ""]
                        for g in u.top_gaps
                    ],
                    numeric=[0],
                )
            )
            out.append("</details>")
    return "\n".join(out)


def _bin_label(lo_ns: int, hi_ns: int) -> str:
    def short(ns: int) -> str:
        return f.duration(ns).replace(".0 ", " ")

    if lo_ns <= 0:
        return f"< {short(hi_ns)}"
    if hi_ns >= OPEN_ENDED_NS:  # the last bin is open-ended
        return f"≥ {short(lo_ns)}"
    return f"{short(lo_ns)}–{short(hi_ns)}"


def _name_rows(stats: Sequence[NameStat]) -> list[tuple[str, float, str]]:
    return [(s.name, s.total_ns, f"{f.duration(s.total_ns)} · {f.pct(s.share_pct)} · {s.count:,}×") for s in stats]


def _full_names(what: str, stats: Sequence[NameStat]) -> str:
    """The chart's rows with their whole names, wrapped (a chart label is cut to fit)."""
    rows = [[f'<code class="name">{e(s.name)}</code>', e(f.duration(s.total_ns)), e(f.pct(s.share_pct)), f"{s.count:,}"]
            for s in stats]
    return f"<details><summary>Full names of the {e(what)} above</summary>" + _table(
        ["name", "time", "share", "count"], rows, numeric=[1, 2, 3]) + "</details>"


def _kernels(m: TraceMetrics, idx: int) -> str:
    out = []
    k = m.kernels
    if k is not None:
        if k.top:
            out.append(svg.hbars(f"kernels-{idx}", "Top kernels by GPU time (time · share of kernel time · count)", _name_rows(k.top), "#009E73"))
            out.append(_full_names("kernels", k.top))
        facts = [
            ("kernels", f"{k.count:,} ({f.duration(k.total_ns)})"),
            ("median / p90 / max", f"{f.duration(k.p50_ns)} / {f.duration(k.p90_ns)} / {f.duration(k.max_ns)}"),
            ("shorter than 10 µs", f.pct(k.under_10us_pct)),
        ]
        if k.launch_count:
            facts.append(("launches", f"{k.launch_count:,} ({f.duration(k.launch_total_ns)} on the host)"))
        if k.launch_to_kernel_ratio is not None:
            facts.append(("launch / kernel time", f.number(k.launch_to_kernel_ratio)))
        if k.median_launch_delay_ns is not None:
            facts.append(("median launch delay", f.duration(k.median_launch_delay_ns)))
        facts.append(("tensor-core kernels", f.pct(k.tensor_core_pct) + " of kernel time"))
        if k.fp32_eligible_pct_of_gpu is not None:
            facts.append(("FP32 matmul/conv", f.pct(k.fp32_eligible_pct_of_gpu) + " of kernel time"))
        if k.optimizer_kernels_per_step is not None:
            facts.append(("optimizer kernels per step", f.number(k.optimizer_kernels_per_step)))
        out.append('<dl class="kv">' + "".join(f"<dt>{e(a)}</dt><dd>{e(b)}</dd>" for a, b in facts) + "</dl>")
    if m.cpu is not None and m.cpu.top_ops:
        out.append(svg.hbars(f"ops-{idx}", "Top CPU ops by self time (nested ops not counted twice; time · share · count)",
                             _name_rows(m.cpu.top_ops), "#0072B2"))
        out.append(_full_names("CPU ops", m.cpu.top_ops))
    return "\n".join(out)


def _transfers_syncs(m: TraceMetrics) -> str:
    out = []
    if m.transfers:
        out.append("<h3>Copies and memsets</h3>")
        out.append(
            _table(
                ["direction", "memory", "count", "bytes", "time", "bandwidth", "blocking", "per step"],
                [
                    [
                        e(t.direction), e(t.memory_kind), f"{t.count:,}", e(f.size(t.bytes)), e(f.duration(t.dur_ns)),
                        e("n/a" if t.bandwidth_gbps is None else f"{f.number(t.bandwidth_gbps)} GB/s"),
                        f"{t.blocking_count:,}", e("n/a" if t.per_step_count is None else f.number(t.per_step_count)),
                    ]
                    for t in m.transfers
                ],
                numeric=[2, 3, 4, 5, 6, 7],
            )
        )
    s = m.syncs
    if s is not None and s.count:
        share = f", {f.pct(s.share_of_steps_pct)} of step time" if s.share_of_steps_pct is not None else ""
        out.append(f"<h3>Host synchronizations: {s.count:,} ({e(f.duration(s.total_ns))}{e(share)})</h3>")
        rows = [[f"<code>{e1(n.name)}</code>", f"{n.count:,}", e(f.duration(n.total_ns)), e(f.pct(n.share_pct))] for n in s.by_name]
        if rows:
            out.append(_table(["call", "count", "time", "share"], rows, numeric=[1, 2, 3]))
        rows = [[f"<code>{e1(n.name)}</code>", f"{n.count:,}", e(f.duration(n.total_ns)), e(f.pct(n.share_pct))] for n in s.by_frame]
        if rows:
            out.append(_table(["where (Python frame)", "count", "time", "share"], rows, numeric=[1, 2, 3]))
    if m.memory:
        rows = [
            [str(x.device), e(f.size(x.peak_allocated_bytes)), e(f.size(x.peak_reserved_bytes)), e(f.size(x.total_bytes)),
             f"{x.cuda_malloc_count:,}", f"{x.empty_cache_count:,}"]
            for x in m.memory
        ]
        out.append("<h3>Memory</h3>" + _table(["GPU", "peak allocated", "peak reserved", "total", "cudaMalloc", "empty_cache"], rows, numeric=[1, 2, 3, 4, 5]))
    return "\n".join(out)


def _trace(m: TraceMetrics, idx: int, open_: bool) -> str:
    label = f.trace_label(m, idx)
    devices = ", ".join(f"{d.name or 'GPU'} {d.index}" for d in m.devices)
    facts = [m.platform, f"{m.event_count:,} events", m.schema]
    if devices:
        facts.append(devices)
    if m.world_size:
        facts.append(f"rank {m.rank} of {m.world_size}")
    parts = [
        f'<details class="trace"{" open" if open_ else ""}><summary>{e1(label)}</summary>',
        f'<p class="muted"><code>{e1(m.path)}</code> · {e(" · ".join(facts))}</p>',
    ]
    if m.breakdown_mean_pct or m.breakdown:
        parts += ["<h3>Step breakdown</h3>", _breakdown_plot(m, idx), _mean_table(m)]
    gaps = _gaps(m, idx)
    if gaps:
        parts += [gaps]
    kernels = _kernels(m, idx)
    if kernels:
        parts += ["<h3>Kernels and ops</h3>", kernels]
    parts.append(_transfers_syncs(m))
    if m.notes:
        parts.append("<ul>" + "".join(f'<li class="note">{e1(n)}</li>' for n in m.notes) + "</ul>")
    parts.append("</details>")
    return "\n".join(p for p in parts if p)


# --------------------------------------------------------------------------- page


def _header(report: Report) -> str:
    run = report.run
    meta = f"{e(report.kind)} · <code>{e1(report.source)}</code> · gpudoctor {e(report.gpudoctor_version)} · {e(report.created_at)}"
    parts = [f"<h1>gpudoctor: {e(f.findings_headline(report))}</h1>", f'<div class="meta">{meta}</div>']
    if run is not None and run.manifest is not None:
        parts.append(f'<div class="meta">{e1(f.run_line(run.manifest))}</div>')
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
        _table(["part of the step", "share", "per step", "side"], rows, numeric=[1, 2]),
    ]
    out += [f'<p class="note">{e1(n)}</p>' for n in a.notes]
    out.append("</section>")
    return "\n".join(out)


def _nav(sections: list[tuple[str, str]]) -> str:
    return "<nav>" + "".join(f'<a href="#{sid}">{e(title)}</a>' for sid, title in sections) + "</nav>"


def _run_section(report: Report) -> str:
    out = []
    if report.environment:
        out.append(_table(["", ""], [[e1(k), f"<code>{e1(v)}</code>"] for k, v in report.environment.items()]))
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
                _table(
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
    return '<h2 id="ranks">Ranks</h2>' + _table(list(f.RANK_HEADER), rows, numeric=[0, 1, 2, 3, 4, 5, 6]) + summary


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
        timeline = [_step_times(run), _gpu_samples(run.samples) or _busy_timeline(run.metrics), _cpu_samples(run.samples)]
        timeline = [t for t in timeline if t]
        if timeline:
            sections.append(("timeline", "Over time"))
            body.append('<h2 id="timeline">Over time</h2>' + "\n".join(timeline))
        elif run.metrics or run.steps:
            body.append('<h2 id="timeline">Over time</h2><p class="note">No time series: no NVML samples and no busy timeline in the trace.</p>')
        if run.metrics:
            sections.append(("traces", "Traces"))
            traces = [_trace(m, i, i == 0) for i, m in enumerate(run.metrics[:MAX_TRACES])]
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
