"""The HTML report's figures (``report.htmlfmt``): the run's steps, its samples over time, each trace.

Per-step stacked time breakdown and step times; GPU utilization and memory over time (NVML
samples, else the trace's busy time per interval); host CPU; per trace, the idle-gap
distribution and its causes, the top kernels and ops, transfers and synchronizations. Inline
SVG (``report/svg.py``); every string from the run is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpudoctor.model import (
    NameStat,
    RunData,
    Samples,
    TraceMetrics,
)
from gpudoctor.report import _fmt as f
from gpudoctor.report import svg
from gpudoctor.report._html import e, e1, table, tick, time_fmt, time_scale

MAX_STEPS_DRAWN = 400


MAX_SAMPLE_LINES = 8


MAX_POINTS = 2000  # samples drawn per line; a longer run draws every k-th sample


OPEN_ENDED_NS = 10**15  # a histogram bin ending past ~11 days is open-ended


def breakdown_plot(m: TraceMetrics, idx: int) -> str:
    bd = m.breakdown[:MAX_STEPS_DRAWN]
    if not bd:
        return ""
    keys: list[str] = []
    for b in bd:
        keys += [k for k in b.parts_ns if k not in keys]
    keys = f.component_order(keys)
    scale, unit = time_scale(max(b.dur_ns for b in bd))
    series = [
        svg.Series(f.component_label(k), f.component_color(k), [b.parts_ns.get(k, 0) / scale for b in bd]) for k in keys
    ]
    chart = svg.stacked_bars(
        f"breakdown-{idx}",
        "Where each profiled step's time went",
        [f"#{b.step}" for b in bd],
        series,
        time_fmt(unit),
        unit,
    )
    more = f'<p class="note">First {MAX_STEPS_DRAWN} of {len(m.breakdown)} steps drawn.</p>' if len(m.breakdown) > MAX_STEPS_DRAWN else ""
    return chart + more


def mean_table(m: TraceMetrics) -> str:
    if not m.breakdown_mean_pct:
        return ""
    rows = [
        [f'<span style="color:{svg.esc(f.component_color(k))}">■</span> {e(f.component_label(k))}', e(f.pct(m.breakdown_mean_pct[k]))]
        for k in f.component_order(m.breakdown_mean_pct)
    ]
    return table(["component", "mean share of step time"], rows, numeric=[1])


def step_times(run: RunData) -> str:
    steps = run.steps[:MAX_STEPS_DRAWN]
    if not steps:
        return ""
    scale, unit = time_scale(max(s.wall_ns for s in steps))
    chart = svg.overlaid_bars(
        "step-times",
        "Every step of the run: wall time and time waiting for data",
        [str(s.index) for s in steps],
        svg.Series("step wall time", "#009E73", [s.wall_ns / scale for s in steps]),
        svg.Series("waiting for the next batch", "#E69F00", [s.data_wait_ns / scale for s in steps]),
        time_fmt(unit),
        unit,
    )
    more = f'<p class="note">First {MAX_STEPS_DRAWN} of {len(run.steps)} steps drawn.</p>' if len(run.steps) > MAX_STEPS_DRAWN else ""
    return chart + more


def _stride(n: int) -> tuple[int, str]:
    """Every k-th sample is drawn when there are more than MAX_POINTS (display only)."""
    k = -(-n // MAX_POINTS)
    return (k, f"; every {k}th sample drawn") if k > 1 else (1, "")


def gpu_samples(samples: Samples | None) -> str:
    if samples is None or not samples.gpu:
        return ""
    devices = sorted({g.index for g in samples.gpu})
    k, drawn = _stride(max(sum(1 for g in samples.gpu if g.index == d) for d in devices))
    scale, unit = time_scale(max(g.t_ns for g in samples.gpu))
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
            time_fmt(unit),
            lambda v: f"{tick(v)}%",
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
                time_fmt(unit),
                lambda v: f"{tick(v)} GiB",
                y_top=max(totals) / 2**30 if totals else None,
                unit_label="GiB",
            )
        )
    return "\n".join(out)


def busy_timeline(metrics: Sequence[TraceMetrics]) -> str:
    for i, m in enumerate(metrics):
        for u in m.utilization:
            if u.busy_timeline:
                t0 = u.busy_timeline[0].start_ns
                scale, unit = time_scale(u.busy_timeline[-1].start_ns - t0)
                return svg.lines(
                    f"busy-{i}-{u.device}",
                    f"GPU {u.device} busy share over the trace ({f.trace_label(m, i)}; no NVML samples)",
                    [(b.start_ns - t0) / scale for b in u.busy_timeline],
                    [svg.Series("busy (kernel, memcpy or memset running)", "#009E73", [b.busy_pct for b in u.busy_timeline])],
                    time_fmt(unit),
                    lambda v: f"{tick(v)}%",
                    y_top=100,
                    unit_label="%",
                )
    return ""


def cpu_samples(samples: Samples | None) -> str:
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
    scale, unit = time_scale(times[-1])
    return svg.lines(
        "cpu",
        f"Host CPU of the training process and its DataLoader workers (100% = one core{cores}{drawn})",
        [t / scale for t in times],
        series,
        time_fmt(unit),
        lambda v: f"{tick(v)}%",
        unit_label="%",
    )


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
                table(
                    ["gap length", "gaps", "idle time"],
                    [[e(lab), f"{b.count:,}", e(f.duration(b.total_ns))] for lab, b in zip(labels, u.gap_histogram, strict=True)],
                    numeric=[1, 2],
                )
            )
        if u.gap_causes:
            out.append(
                table(
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
                table(
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
    return f"<details><summary>Full names of the {e(what)} above</summary>" + table(
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
            table(
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
            out.append(table(["call", "count", "time", "share"], rows, numeric=[1, 2, 3]))
        rows = [[f"<code>{e1(n.name)}</code>", f"{n.count:,}", e(f.duration(n.total_ns)), e(f.pct(n.share_pct))] for n in s.by_frame]
        if rows:
            out.append(table(["where (Python frame)", "count", "time", "share"], rows, numeric=[1, 2, 3]))
    if m.memory:
        rows = [
            [str(x.device), e(f.size(x.peak_allocated_bytes)), e(f.size(x.peak_reserved_bytes)), e(f.size(x.total_bytes)),
             f"{x.cuda_malloc_count:,}", f"{x.empty_cache_count:,}"]
            for x in m.memory
        ]
        out.append("<h3>Memory</h3>" + table(["GPU", "peak allocated", "peak reserved", "total", "cudaMalloc", "empty_cache"], rows, numeric=[1, 2, 3, 4, 5]))
    return "\n".join(out)


def trace_section(m: TraceMetrics, idx: int, open_: bool) -> str:
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
        parts += ["<h3>Step breakdown</h3>", breakdown_plot(m, idx), mean_table(m)]
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
