"""Per-op overhead on the host (``analysis.dispatch``): self times, glue gaps, the typical step."""

from __future__ import annotations

import numpy as np
import pytest

from gpudoctor.analysis import analyze_trace
from gpudoctor.analysis.dispatch import GLUE_GAP_MAX_NS, SHORT_OP_NS, dispatch_stats, self_times
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.metrics import WindowKind
from gpudoctor.model.trace import HostKind as H
from gpudoctor.model.trace import TimelineBuilder

US = 1000
DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MAIN = "10/10"


def _step(b: TimelineBuilder, n: int, t0_us: int, *, stall_us: int = 0, stall_in: str = "relu",
          with_add: bool = True, python_us: int = 0) -> None:
    """One 100 µs step on the main thread (longer by ``stall_us`` and ``python_us``):

    glue 10 | linear [t 2, addmm 24, self 4] | glue 5 | add_ 3 | glue 2 | relu 5 |
    glue 5 | DataLoader 20 (collate op inside) | glue 20 (+ python_us of Python work)

    Op self time 38 µs (short: linear 4, t 2, add_ 3, relu 5 = 14 µs; addmm 24 µs is long),
    glue 42 µs, DataLoader 20 µs. A stall (the process off the CPU) stretches relu or the first gap.
    """
    t = t0_us
    end = t + 100 + stall_us + python_us
    b.add_host(H.USER_ANNOTATION, f"ProfilerStep#{n}", t * US, (end - t) * US, thread=MAIN)
    o = t + (stall_us if stall_in == "glue" else 0)
    relu_extra = stall_us if stall_in == "relu" else 0
    b.add_host(H.CPU_OP, "aten::linear", (o + 10) * US, 30 * US, thread=MAIN)
    b.add_host(H.CPU_OP, "aten::t", (o + 11) * US, 2 * US, thread=MAIN)
    b.add_host(H.CPU_OP, "aten::addmm", (o + 14) * US, 24 * US, thread=MAIN)
    if with_add:
        b.add_host(H.CPU_OP, "aten::add_", (o + 45) * US, 3 * US, thread=MAIN)
    b.add_host(H.CPU_OP, "aten::relu", (o + 50) * US, (5 + relu_extra) * US, thread=MAIN)
    s = o + relu_extra
    b.add_host(H.USER_ANNOTATION, DL, (s + 60) * US, 20 * US, thread=MAIN)
    b.add_host(H.CPU_OP, "aten::stack", (s + 62) * US, 8 * US, thread=MAIN)  # collate: the DataLoader's


def test_self_times_subtract_direct_children_per_thread():
    b = TimelineBuilder()
    b.add_host(H.CPU_OP, "outer", 0, 100 * US, thread="1/1")
    b.add_host(H.CPU_OP, "child", 10 * US, 40 * US, thread="1/1")
    b.add_host(H.CPU_OP, "grandchild", 20 * US, 10 * US, thread="1/1")
    b.add_host(H.CPU_OP, "child2", 60 * US, 20 * US, thread="1/1")
    b.add_host(H.CPU_OP, "empty", 60 * US, 0, thread="1/1")  # zero length, at child2's start
    b.add_host(H.CPU_OP, "other_thread", 15 * US, 50 * US, thread="1/2")  # overlaps, but elsewhere
    b.add_host(H.CPU_OP, "sibling", 100 * US, 5 * US, thread="1/1")  # starts where outer ends
    view = TraceView(b.build())
    idx = np.arange(7)
    got = dict(zip(["outer", "child", "grandchild", "child2", "empty", "other_thread", "sibling"],
                   (self_times(view, idx) // US).tolist(), strict=True))
    assert got == {"outer": 40, "child": 30, "grandchild": 10, "child2": 20, "empty": 0,
                   "other_thread": 50, "sibling": 5}
    assert len(self_times(view, np.zeros(0, np.int64))) == 0


def test_self_times_clip_at_zero_when_events_overlap_without_nesting():
    b = TimelineBuilder()
    b.add_host(H.CPU_OP, "a", 0, 10 * US)
    b.add_host(H.CPU_OP, "b", 5 * US, 10 * US)  # starts inside a, ends after it
    assert (self_times(TraceView(b.build()), np.arange(2)) // US).tolist() == [0, 10]


def test_typical_step_splits_ops_glue_and_dataloader():
    b = TimelineBuilder()
    for n in range(3):
        _step(b, n + 1, n * 10_000)
    b.add_host(H.CPU_OP, "aten::copy_", 20 * US, 3 * US, thread="10/11")  # another thread: fewer ops
    d = dispatch_stats(TraceView(b.build()))
    assert d is not None and d.aligned and d.steps == 3 and d.window == WindowKind.STEPS
    assert d.thread == MAIN
    assert d.ops_per_step == 5 and d.top_level_ops_per_step == 3  # the collate op is not counted
    assert d.op_ns == 38 * US and d.short_op_ns == 14 * US
    assert d.short_op_time_pct == pytest.approx(100 * 14 / 38, abs=1e-3)
    assert d.glue_ns == 42 * US and d.long_gap_ns == 0 and d.dataloader_ns == 20 * US
    assert d.typical_step_ns == 100 * US == d.step_median_ns
    assert d.dispatch_ns == 56 * US and d.dispatch_pct == 56.0
    assert d.op_self_median_ns == 4 * US
    assert d.short_op_max_ns == SHORT_OP_NS and d.glue_gap_max_ns == GLUE_GAP_MAX_NS
    assert [(s.name, s.count, s.total_ns // US) for s in d.top_short_ops] == [
        ("aten::relu", 1, 5), ("aten::linear", 1, 4), ("aten::add_", 1, 3), ("aten::t", 1, 2)
    ]


def test_a_stall_in_one_step_is_not_counted_as_work():
    b = TimelineBuilder()
    _step(b, 1, 0)
    _step(b, 2, 10_000, stall_us=5_000)  # the process was kept off the CPU inside relu
    _step(b, 3, 20_000)
    d = dispatch_stats(TraceView(b.build()))
    assert d.aligned and d.typical_step_ns == 100 * US and d.dispatch_pct == 56.0
    assert d.step_median_ns == 100 * US
    b = TimelineBuilder()
    _step(b, 1, 0, stall_us=5_000)  # most steps disturbed, each somewhere else: the median step is
    _step(b, 2, 10_000, stall_us=3_000, stall_in="glue")  # too, the typical step is not
    _step(b, 3, 20_000)
    d = dispatch_stats(TraceView(b.build()))
    assert d.step_median_ns == 3_100 * US
    assert d.aligned and d.typical_step_ns == 100 * US and d.dispatch_pct == 56.0


def test_long_python_gaps_are_not_glue():
    b = TimelineBuilder()
    for n in range(2):
        _step(b, n + 1, n * 10_000, python_us=2_000)  # 2 ms of Python work before the step ends
    d = dispatch_stats(TraceView(b.build()))
    assert d.glue_ns == 17 * US and d.long_gap_ns == 2_025 * US  # the last gap is 2.025 ms long
    assert d.typical_step_ns == 2_100 * US
    assert d.dispatch_ns == 31 * US and d.dispatch_pct == pytest.approx(100 * 31 / 2_100, abs=1e-3)


def test_steps_with_different_ops_fall_back_to_medians_per_name():
    b = TimelineBuilder()
    _step(b, 1, 0)
    _step(b, 2, 10_000, with_add=False)  # no add_: glue 10 + 10 + 25 = 45 µs
    d = dispatch_stats(TraceView(b.build()))
    assert not d.aligned
    assert d.op_ns == int(36.5 * US)  # add_ once in two steps: 3 µs × 0.5
    assert d.short_op_ns == int(12.5 * US)
    assert d.glue_ns == int(43.5 * US)  # median of the per-step totals 42 and 45
    add = next(s for s in d.top_short_ops if s.name == "aten::add_")
    assert (add.count, add.total_ns, add.max_ns) == (1, int(1.5 * US), 3 * US)  # half a call per step


def test_whole_trace_is_one_step_without_profiler_steps():
    b = TimelineBuilder()
    b.add_host(H.CPU_OP, "aten::add", 0, 2 * US)
    b.add_host(H.CPU_OP, "aten::mul", 5 * US, 3 * US)
    d = dispatch_stats(TraceView(b.build()))
    assert d.window == WindowKind.TRACE and d.steps == 1
    assert d.op_ns == 5 * US and d.short_op_ns == 5 * US and d.glue_ns == 3 * US
    assert d.typical_step_ns == 8 * US and d.dispatch_pct == 100.0


def test_no_ops_no_stats_and_analyze_trace_carries_them():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 100 * US)
    b.add_host(H.PYTHON_FUNCTION, "train.py(3): <module>", 0, 100 * US)
    assert dispatch_stats(TraceView(b.build())) is None
    b = TimelineBuilder()
    _step(b, 1, 0)
    m = analyze_trace(b.build())
    assert m.dispatch is not None and m.dispatch.dispatch_pct == 56.0
    assert m.to_dict()["dispatch"]["typical_step_ns"] == 100 * US


@pytest.mark.parametrize("seed", range(6))
def test_lookup_outermost_is_what_enclosing_lists_first(seed):
    # nested, overlapping (not nested) and long ops on three threads, queries inside and outside
    from gpudoctor.analysis.view import Lookup

    rng = np.random.default_rng(seed)
    b = TimelineBuilder()
    for _ in range(400):
        ts = int(rng.integers(0, 200)) * US
        dur = int(rng.choice([1, 3, 10, 60, 6000])) * US  # 6 ms: past Lookup.LONG_NS
        b.add_host(H.CPU_OP, "op", ts, dur, thread=f"1/{int(rng.integers(0, 3))}")
    view = TraceView(b.build())
    lk = Lookup(view, view.is_cpu_op)
    a = rng.integers(0, 7000, 300) * US
    e = a + rng.integers(0, 30, 300) * US
    th = rng.integers(0, 4, 300).astype(np.int32)  # thread 3 has no ops
    got = lk.outermost(a, e, th)
    for i in range(300):
        pos = lk.enclosing(int(a[i]), int(e[i]), int(th[i]))
        assert got[i] == (int(pos[0]) if len(pos) else -1)
