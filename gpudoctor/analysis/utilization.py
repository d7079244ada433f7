"""GPU busy/idle per device, the idle gaps, and why each gap happened.

Busy = the union of kernel, memcpy and memset intervals on any stream of the device.
Idle % is given over three windows, each named:

- ``span``: first to last GPU activity (the "span idle %" of shared/traces/README.md);
- ``steps``: the union of the ProfilerStep#N windows;
- ``hta``: Holistic Trace Analysis 0.5.0's window (``get_temporal_breakdown``): with two
  or more ProfilerStep names, HTA keeps only the GPU activity whose runtime call started
  before the last ProfilerStep began (it drops the last iteration as incomplete), and on
  traces with fractional-microsecond timestamps it rounds each interval inwards to whole
  microseconds (start up, end down). Idle is then measured from its first kept start to
  its last kept end.

Gap causes, gap by gap (``GapCause``), in this order:

1. The runtime call that launched the work ending the gap started after the gap began
   (the host had not launched it yet: "host wait") or is unknown. Then, looking at the
   host over the gap up to that launch:
   - ``dataloader``: DataLoader ``__next__`` covered at least half of it;
   - ``sync``: a blocking call (stream/device/event sync, synchronous or pageable copy)
     was running when the gap began (or ended less than ``SYNC_TOLERANCE_NS`` before):
     the host drained the queue and the GPU ran dry; or one covered half of the gap;
   - ``launch_bound``: the gap is under ``LAUNCH_GAP_MAX_NS`` and the host was inside ops
     and runtime calls for at least half of it: it was busy dispatching and could not
     keep the GPU fed;
   - ``other``: the host was busy in one long op (CPU work, cuDNN/MIOpen autotuning …;
     the detail names it) or outside profiled ops (Python, I/O, an unprofiled thread …).
2. The work was launched before the gap began (it was queued): ``short`` when the gap is
   under ``SHORT_GAP_NS`` (launch latency scale), else ``dependency`` (it waited on
   another stream, an event, a collective). Work that a graph launch issued
   (``cudaGraphLaunch``, ``hipGraphLaunch``: each node of the graph carries the launch's
   correlation id) was never launched on its own: a queued gap before it is the graph's
   own scheduling of its nodes and dependencies, ``dependency`` however short, never
   launch latency.

``idle_gaps`` returns every gap with its cause (``GapTable``): the ledger of
``analysis.ledger`` charges the idle time of a step from the same table, so the
GPU-idle causes of GD101 and the account of the step are one classification.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.view import Lookup, TraceView, Windows
from gpudoctor.model.metrics import (
    DeviceUtilization,
    GapCause,
    GapCauseTotal,
    HistogramBin,
    IdleGap,
    UtilizationBin,
    Window,
    WindowKind,
)

SHORT_GAP_NS = 10_000  # a queued kernel-to-kernel gap under 10 µs is launch-latency scale
LAUNCH_GAP_MAX_NS = 1_000_000  # longer op-covered gaps are CPU work in an op, not launch overhead
SYNC_TOLERANCE_NS = 20_000  # a blocking call ending this close before a gap still explains it
HOST_SHARE = 0.5  # share of the gap a host activity must cover to explain it
TOP_GAPS = 20
DETAIL_GAPS = 400  # gaps (the longest) whose host-side detail is looked up
TIMELINE_BUCKETS = 100
GRAPH_GAP_DETAIL = "queued in a graph launch: a node waited on its dependencies (in the graph, another stream, an event)"
HISTOGRAM_EDGES_NS = (0, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)  # <10 µs … ≥100 ms


def pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 4) if whole > 0 else 0.0


# --------------------------------------------------------------------------- busy intervals


def busy_set(view: TraceView, device: int, *, with_first: bool = False):
    """Union of kernel/memcpy/memset intervals of one device (and, with ``with_first``,
    the device-event index that starts each merged interval)."""
    s, e, first = view.busy_set(device)  # computed once per device (TraceView.busy_set)
    return (s, e, first) if with_first else (s, e)


def span_idle(view: TraceView, device: int) -> tuple[Window, int, float]:
    """(span window, busy ns, idle % of the span)."""
    s, e = busy_set(view, device)
    if len(s) == 0:
        return Window(WindowKind.SPAN, 0, 0, "no GPU activity"), 0, 0.0
    w = Window(WindowKind.SPAN, int(s[0]), int(e[-1]), f"first to last GPU activity on device {device}")
    busy = iv.total(s, e)
    return w, busy, pct(w.dur_ns - busy, w.dur_ns)


def hta_idle(view: TraceView, device: int) -> tuple[Window, float] | None:
    """Holistic Trace Analysis 0.5.0's temporal-breakdown idle % (see the module docstring)."""
    act = view.is_activity & (view.d_device == device) & (view.d_corr >= 0)
    steps = view.step_events
    step_names = {int(n) for n in view.h_name[steps]}
    kept_note = "all GPU activity (fewer than two ProfilerStep names: HTA keeps everything)"
    if len(step_names) >= 2:
        last_start = int(view.h_ts[steps].max())
        early = view.h_ts < last_start
        # membership by binary search in the sorted ids (np.unique/np.isin hash or sort the
        # union and took ~0.5 s on 600k runtime calls with numpy 2.4; this takes ~30 ms)
        corrs = np.sort(view.h_corr[early & (view.h_corr >= 0)])
        if len(corrs):
            pos = np.minimum(np.searchsorted(corrs, view.d_corr), len(corrs) - 1)
            act &= corrs[pos] == view.d_corr
        else:
            act &= False
        n_steps = len({(int(view.h_name[i]), int(view.h_ts[i])) for i in steps.tolist()})
        kept_note = f"GPU activity launched before the last of {n_steps} ProfilerStep iterations (HTA drops it)"
    idx = np.flatnonzero(act)
    if len(idx) == 0:
        return None
    s, e = view.d_ts[idx], view.d_end[idx]
    if view.tl.info.ts_unit == "ns":  # HTA rounds float-µs traces inwards to whole µs
        s = -((-s) // 1000) * 1000
        e = (e // 1000) * 1000
        e = np.maximum(e, s)
    us, ue = iv.union(s, e)
    w = Window(WindowKind.HTA, int(us[0]), int(ue[-1]), f"HTA 0.5.0 window: {kept_note}")
    return w, pct(w.dur_ns - iv.total(us, ue), w.dur_ns)


def busy_timeline(s: np.ndarray, e: np.ndarray, buckets: int = TIMELINE_BUCKETS) -> tuple[UtilizationBin, ...]:
    if len(s) == 0:
        return ()
    lo, hi = int(s[0]), int(e[-1])
    if hi <= lo:
        return ()
    n = max(1, min(buckets, hi - lo))
    edges = lo + (np.arange(n + 1, dtype=np.int64) * (hi - lo)) // n
    cov = iv.Coverage(s, e).covered(edges[:-1], edges[1:])
    width = edges[1:] - edges[:-1]
    return tuple(
        UtilizationBin(int(a), int(b), round(100.0 * int(c) / int(w), 2) if w > 0 else 0.0)
        for a, b, c, w in zip(edges[:-1], edges[1:], cov, width, strict=True)
    )


# --------------------------------------------------------------------------- gap causes


class HostState:
    """The host-side interval sets gap causes are read from (all threads merged), and
    lookups for the event that explains one gap."""

    def __init__(self, view: TraceView) -> None:
        self.view = view
        dl = view.is_dataloader
        self.dataloader = iv.Coverage(*iv.union(view.h_ts[dl], view.h_end[dl]))
        blk = view.is_blocking_call
        self.blocking = iv.Coverage(*iv.union(view.h_ts[blk], view.h_end[blk]))
        busy = view.is_cpu_op | view.is_runtime
        self.ops = iv.Coverage(*iv.union(view.h_ts[busy], view.h_end[busy]))
        self.dl_lookup = Lookup(view, dl)
        self.blocking_lookup = Lookup(view, blk)
        self.op_lookup = Lookup(view, view.is_cpu_op)
        self.python_lookup = Lookup(view, view.is_python)

    def outer_op(self, host_index: int) -> str:
        """The outermost cpu_op on the same thread around a host event ("" when none)."""
        v = self.view
        pos = self.op_lookup.enclosing(int(v.h_ts[host_index]), int(v.h_end[host_index]), int(v.h_thread[host_index]))
        return self.op_lookup.name(int(pos[0])) if len(pos) else ""


def classify_gaps(
    view: TraceView,
    g_s: np.ndarray,
    g_e: np.ndarray,
    next_launch: np.ndarray,
    host: HostState | None = None,
    *,
    short_gap_ns: int = SHORT_GAP_NS,
    sync_tolerance_ns: int = SYNC_TOLERANCE_NS,
    launch_gap_max_ns: int = LAUNCH_GAP_MAX_NS,
    graphed: np.ndarray | None = None,
) -> np.ndarray:
    """Cause code (index into ``CAUSES``) of each gap. ``next_launch``: host start time of the
    runtime call that launched the activity ending the gap (-1 when unknown); ``graphed``: that
    call was a graph launch (a queued gap before it is then a dependency, however short)."""
    host = host or HostState(view)
    n = len(g_s)
    causes = np.full(n, CAUSES.index(GapCause.OTHER), np.int8)
    if n == 0:
        return causes
    known = next_launch >= 0
    host_wait = ~known | (next_launch > g_s)
    he = np.where(known & host_wait, np.minimum(next_launch, g_e), g_e)
    he = np.maximum(he, g_s + 1)
    length = he - g_s
    dl = host.dataloader.covered(g_s, he) >= HOST_SHARE * length
    # blocked when the GPU ran dry (a sync that drained the queue), or for most of the gap
    sync = host.blocking.any_overlap(g_s - sync_tolerance_ns, g_s) | (
        host.blocking.covered(g_s, he) >= HOST_SHARE * length
    )
    ops = host.ops.covered(g_s, he) >= HOST_SHARE * length
    c = np.full(n, CAUSES.index(GapCause.OTHER), np.int8)
    c[host_wait & ops & ((g_e - g_s) < launch_gap_max_ns)] = CAUSES.index(GapCause.LAUNCH_BOUND)
    c[host_wait & sync] = CAUSES.index(GapCause.SYNC)
    c[host_wait & dl] = CAUSES.index(GapCause.DATALOADER)
    short = ~host_wait & ((g_e - g_s) < short_gap_ns)
    if graphed is not None:
        short &= ~graphed
    c[~host_wait & ~short] = CAUSES.index(GapCause.DEPENDENCY)
    c[short] = CAUSES.index(GapCause.SHORT)
    return c


CAUSES: tuple[GapCause, ...] = (
    GapCause.DATALOADER,
    GapCause.SYNC,
    GapCause.LAUNCH_BOUND,
    GapCause.SHORT,
    GapCause.OTHER,
    GapCause.DEPENDENCY,
)


def gap_detail(host: HostState, cause: GapCause, start: int, end: int, launch: int) -> str:
    """The host event that explains one gap (looked up for the longest gaps only)."""
    hi = launch if start < launch < end else end
    if cause == GapCause.SHORT:
        return "queued kernel-to-kernel gap"
    if cause == GapCause.SYNC:
        lk = host.blocking_lookup
        pos = lk.overlapping(start - SYNC_TOLERANCE_NS, start)
        if not len(pos):
            pos = lk.overlapping(start, hi)
        if not len(pos):
            return ""
        p = int(pos[np.argmax(lk.end[pos] - lk.ts[pos])])
        call = lk.name(p)
        op = host.outer_op(int(lk.idx[p]))
        return f"{op} › {call}" if op else call
    if cause == GapCause.DEPENDENCY:
        return "queued work waited on a dependency (stream/event wait, collective)"
    if cause == GapCause.OTHER:
        lk = host.op_lookup
        pos = lk.overlapping(start, hi)
        if len(pos):
            ov = np.minimum(lk.end[pos], hi) - np.maximum(lk.ts[pos], start)
            best = int(pos[np.argmax(ov)])
            if ov.max() >= HOST_SHARE * (hi - start):
                return f"host busy in {host.outer_op(int(lk.idx[best])) or lk.name(best)}"
        pos = host.python_lookup.enclosing(start, hi)
        if len(pos):  # the innermost Python frame spanning the gap
            return host.python_lookup.name(int(pos[-1]))
        return "host outside profiled ops"
    lk = host.dl_lookup if cause == GapCause.DATALOADER else host.op_lookup
    pos = lk.overlapping(start, hi)
    if not len(pos):
        return ""
    ov = np.minimum(lk.end[pos], hi) - np.maximum(lk.ts[pos], start)
    if cause == GapCause.LAUNCH_BOUND:  # name the outermost op doing most of the work
        best = int(pos[np.argmax(ov)])
        outer = host.outer_op(int(lk.idx[best]))
        return outer or lk.name(best)
    return lk.name(int(pos[np.argmax(ov)]))


def histogram(lengths: np.ndarray) -> tuple[HistogramBin, ...]:
    edges = (*HISTOGRAM_EDGES_NS, np.iinfo(np.int64).max)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        m = (lengths >= lo) & (lengths < hi)
        out.append(HistogramBin(int(lo), int(hi), int(m.sum()), int(lengths[m].sum())))
    return tuple(out)


@dataclass(frozen=True)
class GapTable:
    """Every GPU-idle gap of one device inside the analysis windows, with its cause.

    ``window`` is the index of the window each gap lies in (0 when the gaps are cut from the
    span of GPU activity: one window); ``cause`` indexes ``CAUSES``; ``launch`` is the host start
    of the runtime call that launched the activity ending the gap (-1 when unknown); ``graphed``
    says that call was a graph launch (None: no gap ends at graph-issued work).
    """

    device: int
    kind: WindowKind  # STEPS (the ProfilerStep windows) or SPAN (first to last GPU activity)
    w_starts: np.ndarray  # the windows the gaps were cut from
    w_ends: np.ndarray
    start: np.ndarray
    end: np.ndarray
    window: np.ndarray
    cause: np.ndarray
    launch: np.ndarray
    graphed: np.ndarray | None = None

    @property
    def lengths(self) -> np.ndarray:
        return self.end - self.start


def idle_gaps(
    view: TraceView,
    device: int,
    windows: Windows | None = None,
    host: HostState | None = None,
    *,
    short_gap_ns: int = SHORT_GAP_NS,
    busy: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> GapTable:
    """The idle gaps of ``device`` inside the ProfilerStep windows, or over the span of its
    activity without steps, each with its cause (``classify_gaps``)."""
    windows = windows or view.windows
    s, e, first = busy if busy is not None else busy_set(view, device, with_first=True)
    if windows.from_steps:
        g_s, g_e, g_w = iv.gaps_in_windows(s, e, windows.starts, windows.ends)
        kind, w_s, w_e = WindowKind.STEPS, windows.starts, windows.ends
    elif len(s):
        g_s, g_e = iv.gaps(s, e, int(s[0]), int(e[-1]))
        g_w = np.zeros(len(g_s), np.int64)
        kind, w_s, w_e = WindowKind.SPAN, np.array([s[0]], np.int64), np.array([e[-1]], np.int64)
    else:
        g_s = g_e = g_w = np.zeros(0, np.int64)
        kind, w_s, w_e = WindowKind.SPAN, np.zeros(0, np.int64), np.zeros(0, np.int64)
    # the activity that ends each gap, and its launch time
    k = np.searchsorted(s, g_e, side="left")
    has_next = k < len(s)
    next_dev = np.where(has_next, first[np.minimum(k, max(len(first) - 1, 0))], -1) if len(first) else np.full(len(g_s), -1)
    launch_idx = np.where(next_dev >= 0, view.dev_launch[np.maximum(next_dev, 0)] if len(view.dev_launch) else -1, -1)
    next_launch = np.where(launch_idx >= 0, view.h_ts[np.maximum(launch_idx, 0)] if len(view.h_ts) else -1, -1)
    graphed = None
    if len(launch_idx) and len(view.h_name):
        graphed = (launch_idx >= 0) & view.host_is(view.names.graph_launch_call)[np.maximum(launch_idx, 0)]
        graphed = graphed if graphed.any() else None
    host = host or HostState(view)
    causes = classify_gaps(view, g_s, g_e, next_launch, host, short_gap_ns=short_gap_ns, graphed=graphed)
    return GapTable(device, kind, w_s, w_e, g_s, g_e, g_w, causes, next_launch, graphed)


def device_utilization(
    view: TraceView,
    device: int,
    windows: Windows | None = None,
    host: HostState | None = None,
    *,
    short_gap_ns: int = SHORT_GAP_NS,
    gaps: GapTable | None = None,
) -> DeviceUtilization:
    windows = windows or view.windows
    s, e, first = busy_set(view, device, with_first=True)
    span_w, busy_span, idle_span = span_idle(view, device)
    # steps window
    busy_steps = idle_steps = None
    steps_w = None
    if windows.from_steps:
        ws, we = iv.union(windows.starts, windows.ends)
        steps_total = iv.total(ws, we)
        busy_steps = iv.total(*iv.intersect(s, e, ws, we))
        idle_steps = pct(steps_total - busy_steps, steps_total)
        steps_w = Window(WindowKind.STEPS, int(ws[0]), int(we[-1]), f"{windows.describe()}, {steps_total} ns in all")
    hta = hta_idle(view, device)
    host = host or HostState(view)
    if gaps is None:
        gaps = idle_gaps(view, device, windows, host, short_gap_ns=short_gap_ns, busy=(s, e, first))
    g_s, g_e, g_w, causes, next_launch = gaps.start, gaps.end, gaps.window, gaps.cause, gaps.launch
    gaps_kind = gaps.kind
    lengths = g_e - g_s
    idle_total = int(lengths.sum())
    # details for the longest gaps
    order = np.argsort(-lengths, kind="stable")[:DETAIL_GAPS]
    details: dict[int, str] = {}
    for i in order.tolist():
        if gaps.graphed is not None and gaps.graphed[i] and CAUSES[causes[i]] == GapCause.DEPENDENCY:
            details[i] = GRAPH_GAP_DETAIL
            continue
        details[i] = gap_detail(host, CAUSES[causes[i]], int(g_s[i]), int(g_e[i]), int(next_launch[i]))
    cause_totals = []
    for ci, cause in enumerate(CAUSES):
        m = causes == ci
        cnt = int(m.sum())
        if not cnt:
            continue
        tot = int(lengths[m].sum())
        top_detail = Counter(d for i, d in details.items() if causes[i] == ci and d).most_common(1)
        cause_totals.append(
            GapCauseTotal(cause, cnt, tot, pct(tot, idle_total), top_detail[0][0] if top_detail else "")
        )
    cause_totals.sort(key=lambda c: (-c.total_ns, c.cause.value))
    top = [
        IdleGap(
            device=device,
            start_ns=int(g_s[i]),
            end_ns=int(g_e[i]),
            cause=CAUSES[causes[i]],
            detail=details.get(i, ""),
            step=int(windows.numbers[g_w[i]]) if windows.from_steps and g_w[i] >= 0 else None,
        )
        for i in order[:TOP_GAPS].tolist()
    ]
    return DeviceUtilization(
        device=device,
        busy_ns_span=busy_span,
        span=span_w,
        idle_pct_span=idle_span,
        busy_ns_steps=busy_steps,
        idle_pct_steps=idle_steps,
        steps_window=steps_w,
        idle_pct_hta=hta[1] if hta else None,
        hta_window=hta[0] if hta else None,
        gaps_window=gaps_kind,
        gap_count=len(g_s),
        gaps_over_1ms=int((lengths >= 1_000_000).sum()),
        gap_causes=tuple(cause_totals),
        gap_histogram=histogram(lengths),
        top_gaps=tuple(top),
        busy_timeline=busy_timeline(s, e),
    )

