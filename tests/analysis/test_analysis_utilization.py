"""GPU busy/idle, gaps and their causes on small hand-built timelines (times in µs × 1000)."""

from __future__ import annotations

import pytest

from gpudoctor.analysis.utilization import (
    SHORT_GAP_NS,
    busy_timeline,
    device_utilization,
    hta_idle,
    span_idle,
)
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.metrics import GapCause, WindowKind
from gpudoctor.model.trace import DeviceKind as D
from gpudoctor.model.trace import HostKind as H
from gpudoctor.model.trace import TimelineBuilder

US = 1000


def _launch(b: TimelineBuilder, ts: int, corr: int, k0: int, k1: int, *, device: int = 0, stream: int = 7) -> None:
    b.add_host(H.RUNTIME, "cudaLaunchKernel", ts * US, 5 * US, correlation=corr)
    b.add_device(D.KERNEL, f"kernel_{corr}", k0 * US, (k1 - k0) * US, correlation=corr, device=device, stream=stream)


def one_step() -> TimelineBuilder:
    """One 1000 µs step with one gap of each cause."""
    b = TimelineBuilder("one_step")
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 1000 * US)
    b.add_host(H.USER_ANNOTATION, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 300 * US)
    _launch(b, 300, 1, 310, 400)  # gap [0, 310): host in the DataLoader
    _launch(b, 310, 2, 400, 500)  # queued: no gap
    b.add_host(H.RUNTIME, "cudaStreamSynchronize", 320 * US, 185 * US, correlation=100)
    _launch(b, 600, 3, 605, 700)  # gap [500, 605): the sync drained the queue
    b.add_host(H.CPU_OP, "aten::add", 700 * US, 100 * US)
    _launch(b, 795, 4, 800, 805)  # gap [700, 800): host inside an op, launching late
    _launch(b, 796, 5, 808, 900)  # gap [805, 808): queued, 3 µs
    return b  # gap [900, 1000): nothing on the host


def test_span_and_step_idle_are_exact():
    v = TraceView(one_step().build())
    w, busy, idle = span_idle(v, 0)
    assert (w.start_ns, w.end_ns) == (310 * US, 900 * US)
    assert busy == (90 + 100 + 95 + 5 + 92) * US
    assert idle == pytest.approx(100 * (590 - 382) / 590, abs=1e-3)
    u = device_utilization(v, 0)
    assert u.idle_pct_steps == pytest.approx(61.8)
    assert u.busy_ns_steps == 382 * US
    assert u.steps_window is not None and u.steps_window.kind == WindowKind.STEPS
    assert u.gaps_window == WindowKind.STEPS


def test_each_gap_gets_its_cause():
    u = device_utilization(TraceView(one_step().build()), 0)
    causes = {(g.start_ns // US, g.end_ns // US): g.cause for g in u.top_gaps}
    assert causes == {
        (0, 310): GapCause.DATALOADER,
        (500, 605): GapCause.SYNC,
        (700, 800): GapCause.LAUNCH_BOUND,
        (805, 808): GapCause.SHORT,
        (900, 1000): GapCause.OTHER,
    }
    details = {g.cause: g.detail for g in u.top_gaps}
    assert details[GapCause.SYNC] == "cudaStreamSynchronize"
    assert details[GapCause.LAUNCH_BOUND] == "aten::add"
    assert details[GapCause.DATALOADER].startswith("enumerate(DataLoader)")
    totals = {c.cause: (c.count, c.total_ns) for c in u.gap_causes}
    assert totals[GapCause.DATALOADER] == (1, 310 * US)
    # each share is rounded to 4 decimals (analysis.utilization.pct): their sum is 100 within half a unit of the
    # last decimal per share (here 99.9999; 3.11's sum() gave 99.99990000000001, 3.12's is exact)
    assert sum(c.share_of_idle_pct for c in u.gap_causes) == pytest.approx(100.0, abs=0.5e-4 * len(u.gap_causes))
    assert u.gap_count == 5 and u.gaps_over_1ms == 0
    assert all(g.step == 1 for g in u.top_gaps)


def test_histogram_counts_every_gap():
    u = device_utilization(TraceView(one_step().build()), 0)
    assert sum(b.count for b in u.gap_histogram) == u.gap_count
    assert sum(b.total_ns for b in u.gap_histogram) == (310 + 105 + 100 + 3 + 100) * US
    under_10us = u.gap_histogram[0]
    assert (under_10us.lo_ns, under_10us.hi_ns, under_10us.count) == (0, 10_000, 1)


def test_long_gap_inside_one_op_is_not_launch_bound():
    b = TimelineBuilder()
    _launch(b, 0, 1, 5, 10)
    b.add_host(H.CPU_OP, "aten::conv2d", 10 * US, 5000 * US)  # e.g. cuDNN autotuning
    _launch(b, 5005, 2, 5012, 5020)
    u = device_utilization(TraceView(b.build()), 0)
    (gap,) = u.top_gaps
    assert gap.cause == GapCause.OTHER and gap.detail == "host busy in aten::conv2d"


def test_queued_long_gap_is_a_dependency_not_short():
    b = TimelineBuilder()
    _launch(b, 0, 1, 5, 10)
    _launch(b, 1, 2, 200, 210)  # launched long before; waited on something else
    (gap,) = device_utilization(TraceView(b.build()), 0).top_gaps
    assert gap.cause == GapCause.DEPENDENCY and "dependency" in gap.detail
    b = TimelineBuilder()
    _launch(b, 0, 1, 5, 10)
    _launch(b, 1, 2, 10 + SHORT_GAP_NS // US - 1, 30)
    (gap,) = device_utilization(TraceView(b.build()), 0).top_gaps
    assert gap.cause == GapCause.SHORT


def test_busy_is_a_union_over_streams_and_kinds():
    b = TimelineBuilder()
    b.add_device(D.KERNEL, "a", 0, 100 * US, stream=7)
    b.add_device(D.KERNEL, "b", 50 * US, 100 * US, stream=13)  # overlaps on another stream
    b.add_device(D.MEMCPY, "Memcpy HtoD (Pinned -> Device)", 200 * US, 50 * US, nbytes=10)
    b.add_device(D.MEMSET, "Memset (Device)", 250 * US, 50 * US, nbytes=10)
    b.add_device(D.ANNOTATION, "## forward ##", 0, 1000 * US)  # not activity
    v = TraceView(b.build())
    w, busy, idle = span_idle(v, 0)
    assert busy == 250 * US and w.dur_ns == 300 * US
    assert idle == pytest.approx(100 * 50 / 300, abs=1e-3)


def test_devices_are_separate():
    b = TimelineBuilder()
    b.add_device(D.KERNEL, "a", 0, 100 * US, device=0)
    b.add_device(D.KERNEL, "b", 200 * US, 100 * US, device=1)
    v = TraceView(b.build())
    assert v.devices == [0, 1]
    assert span_idle(v, 0)[2] == 0.0 and span_idle(v, 1)[2] == 0.0


def test_hta_window_drops_the_last_iteration_and_rounds_fractional_traces():
    b = TimelineBuilder()
    for n, start in ((1, 0), (2, 1000), (3, 2000)):
        b.add_host(H.USER_ANNOTATION, f"ProfilerStep#{n}", start * US, 1000 * US)
        _launch(b, start + 10, n, start + 100, start + 600)
    v = TraceView(b.build())
    w, idle = hta_idle(v, 0)
    # kept: the kernels of steps 1 and 2 (launched before step 3 began)
    assert (w.start_ns, w.end_ns) == (100 * US, 1600 * US)
    assert idle == pytest.approx(100 * 500 / 1500, abs=1e-3)
    assert w.kind == WindowKind.HTA and "HTA" in w.description


def test_hta_rounding_inwards_on_ns_traces():
    from gpudoctor.model.trace import TraceInfo

    b = TimelineBuilder()
    b.add_device(D.KERNEL, "a", 100_400, 1_200, correlation=1)  # 100.4 .. 101.6 µs -> 101 .. 101
    b.add_device(D.KERNEL, "b", 103_000, 2_000, correlation=2)
    tl = b.build(TraceInfo(ts_unit="ns", platform="cuda"))
    w, idle = hta_idle(TraceView(tl), 0)
    assert (w.start_ns, w.end_ns) == (101_000, 105_000)
    assert idle == pytest.approx(50.0)


def test_no_activity_gives_no_gaps_and_busy_timeline_is_bounded():
    b = TimelineBuilder()
    b.add_device(D.KERNEL, "a", 0, 50 * US)
    b.add_device(D.KERNEL, "b", 100 * US, 100 * US)
    v = TraceView(b.build())
    s, e = [0, 100 * US], [50 * US, 200 * US]
    import numpy as np

    bins = busy_timeline(np.array(s), np.array(e), buckets=4)
    assert [round(x.busy_pct) for x in bins] == [100, 0, 100, 100]
    u = device_utilization(v, 0)
    assert len(u.busy_timeline) <= 100 and u.gap_count == 1
