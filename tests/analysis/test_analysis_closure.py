"""The closure is the model's work (issue 43, item 4): forward and backward run inside
``Optimizer.step(closure)`` (Lightning's automatic optimization, LBFGS, a closure loop) are charged
as the model's work in the account, the CPU summary and the optimizer's kernel count (GD404), on
hand-built timelines (times in µs × 1000)."""

from __future__ import annotations

from test_analysis_utilization import _launch

from gpudoctor.analysis import analyze_trace
from gpudoctor.analysis.host import cpu_summary
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.trace import CLOSURE_RANGE, TimelineBuilder
from gpudoctor.model.trace import HostKind as H

US = 1000
STEP = "Optimizer.step#AdamW.step"
NODE = "autograd::engine::evaluate_function: "


def _model_work(b: TimelineBuilder, t0: int, *, bwd_thread: str = "0/0") -> int:
    """zero_grad, a forward (addmm), the loss and a backward from ``t0`` µs: where it ends."""
    b.add_host(H.USER_ANNOTATION, "Optimizer.zero_grad#AdamW.zero_grad", t0 * US, 20 * US)
    b.add_host(H.CPU_OP, "aten::linear", (t0 + 100) * US, 1_900 * US)
    b.add_host(H.CPU_OP, "aten::addmm", (t0 + 110) * US, 1_880 * US)
    b.add_host(H.CPU_OP, "aten::cross_entropy_loss", (t0 + 2_000) * US, 400 * US)
    b.add_host(H.CPU_OP, NODE + "AddmmBackward0", (t0 + 2_500) * US, 2_400 * US, thread=bwd_thread)
    b.add_host(H.CPU_OP, "AddmmBackward0", (t0 + 2_500) * US, 2_390 * US, thread=bwd_thread)
    b.add_host(H.CPU_OP, NODE + "torch::autograd::AccumulateGrad", (t0 + 4_950) * US, 50 * US, thread=bwd_thread)
    b.add_host(H.CPU_OP, "torch::autograd::AccumulateGrad", (t0 + 4_950) * US, 40 * US, thread=bwd_thread)
    return t0 + 5_000


def _update(b: TimelineBuilder, t0: int) -> None:
    """AdamW's own ops from ``t0`` µs: 2,000 µs."""
    b.add_host(H.CPU_OP, "aten::_foreach_lerp_", t0 * US, 1_000 * US)
    b.add_host(H.CPU_OP, "aten::_foreach_addcdiv_", (t0 + 1_000) * US, 1_000 * US)


def _closure_step(marked: bool) -> TimelineBuilder:
    """One 10 ms step: ``opt.step(closure)`` over [1000, 9000) µs, the closure's work first."""
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 10_000 * US)
    b.add_host(H.USER_ANNOTATION, STEP, 1_000 * US, 8_000 * US)
    if marked:
        b.add_host(H.USER_ANNOTATION, CLOSURE_RANGE, 1_050 * US, 5_100 * US)
    end = _model_work(b, 1_100)
    _update(b, end + 500)
    return b


def _plain_step() -> TimelineBuilder:
    """The same work with ``backward()`` outside ``opt.step()``: the step runs [6100, 9000) µs."""
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 10_000 * US)
    end = _model_work(b, 1_100)
    b.add_host(H.USER_ANNOTATION, STEP, (end + 0) * US, 2_900 * US)
    _update(b, end + 500)
    return b


def _parts(b: TimelineBuilder) -> dict[str, int]:
    m = analyze_trace(b.build())
    assert m.ledger is not None and sum(s.ns for s in m.ledger.slices) == m.ledger.total_ns
    return {s.component: s.ns // US for s in m.ledger.slices}


def test_a_closure_s_forward_and_backward_are_not_the_optimizer_s():
    plain = _parts(_plain_step())
    assert plain["optimizer"] == 2_900  # [6100, 9000)
    for marked in (False, True):  # the collector's range, or (a trace from elsewhere) the backward nodes
        closure = _parts(_closure_step(marked))
        # the optimizer keeps what it ran after the closure: [6100, 9000), or with the range [1000, 1050) and
        # [6150, 9000)
        assert closure["optimizer"] == 2_900, (marked, closure)
        assert closure["cpu_compute"] == plain["cpu_compute"] > 4_000  # addmm, the loss, AddmmBackward0
        before = {c: v for c, v in closure.items() if c != "optimizer"}
        assert sum(before.values()) == 10_000 - closure["optimizer"]


def test_before_the_fix_the_whole_step_would_be_the_optimizer_s():
    """What the account said before (issue 43): every instant inside Optimizer.step is the optimizer's.
    The closure's intervals are what changed it."""
    v = TraceView(_closure_step(marked=False).build())
    c_s, c_e = v.closure_intervals
    assert [(int(s) // US, int(e) // US) for s, e in zip(c_s, c_e, strict=True)] == [(1_000, 6_100)]
    o_s, o_e = v.optimizer_intervals
    assert [(int(s) // US, int(e) // US) for s, e in zip(o_s, o_e, strict=True)] == [(6_100, 9_000)]


def test_lbfgs_calls_its_closure_several_times_the_ranges_say_where():
    """LBFGS runs the closure, computes a direction, runs the closure again: with the collector's ranges
    the optimizer's work between them stays the optimizer's."""
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 20_000 * US)
    b.add_host(H.USER_ANNOTATION, "Optimizer.step#LBFGS.step", 0, 20_000 * US)
    for start in (100, 8_100):
        b.add_host(H.USER_ANNOTATION, CLOSURE_RANGE, start * US, 5_100 * US)
        _model_work(b, start + 50)
    _update(b, 5_500)  # the direction between the closures: [5500, 7500)
    _update(b, 13_500)
    v = TraceView(b.build())
    c_s, c_e = v.closure_intervals
    assert [(int(s) // US, int(e) // US) for s, e in zip(c_s, c_e, strict=True)] == [(100, 5_200), (8_100, 13_200)]
    p = _parts(b)
    assert p["optimizer"] == 20_000 - 2 * 5_100


def test_backward_on_the_engine_s_thread_and_the_kernels_of_the_closure():
    """On a GPU the backward nodes run on the autograd engine's device thread; the kernels the closure
    launches are the model's (gpu_compute), and GD404 counts only the update's kernels per step."""
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 10_000 * US)
    b.add_host(H.USER_ANNOTATION, STEP, 1_000 * US, 8_000 * US)
    end = _model_work(b, 1_100, bwd_thread="0/1")
    corr = 1
    for t in range(1_200, end, 500):  # the forward's and backward's kernels, launched inside the closure
        _launch(b, t, corr, t + 10, t + 400)
        corr += 1
    for t in range(end + 100, 9_000, 300):  # the update's kernels
        _launch(b, t, corr, t + 10, t + 200)
        corr += 1
    n_update = len(range(end + 100, 9_000, 300))
    m = analyze_trace(b.build())
    p = {s.component: s.ns // US for s in m.ledger.slices}
    assert p["gpu_optimizer"] == 190 * n_update
    assert p["gpu_compute"] == 390 * len(range(1_200, end, 500))
    assert m.kernels is not None and m.kernels.optimizer_kernels_per_step == n_update


def test_the_cpu_summary_s_optimizer_time_leaves_the_closure_out():
    v = TraceView(_closure_step(marked=True).build())
    assert cpu_summary(v).optimizer_ns == (50 + 2_850) * US  # [1000, 1050) and [6150, 9000)
