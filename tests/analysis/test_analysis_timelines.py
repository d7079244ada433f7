"""Each step on two timelines (``analysis.timelines``), on hand-built Kineto timelines: work tied to the
step that launched it, the device's windows, which timeline limits each step, the account's windows."""

from __future__ import annotations

import numpy as np
import pytest

from gpudoctor.analysis import analyze_trace
from gpudoctor.analysis.timelines import DEVICE_BOUND_WAIT_PCT, step_timelines
from gpudoctor.analysis.utilization import HostState
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.metrics import DeviceInfo
from gpudoctor.model.run import StepRecord
from gpudoctor.model.steady import loop_times, step_figures
from gpudoctor.model.trace import DeviceKind, HostKind, TimelineBuilder, TraceInfo

US = 1_000
MS = 1_000_000
H200 = DeviceInfo(0, "NVIDIA H200", "9.0", 141 * 2**30)
GEMM = "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize256x64x8_stage3_warpsize2x2x1_ffma"


class Loop:
    """A training loop's trace built step by step: the host enqueues, the device runs in launch order."""

    def __init__(self) -> None:
        self.b = TimelineBuilder("loop.pt.trace.json")
        self.corr = 0
        self.device_free = 0  # when the device is done with what was queued so far

    def step(self, n: int, start: int, host_ns: int, kernels: list[int], *, thread: str = "0/1",
             launch_gap: int = 10 * US, tie: bool = True, stall: int = 0) -> None:
        """ProfilerStep#n on the host from ``start`` for ``host_ns``, launching one kernel per entry of
        ``kernels`` (its duration) every ``launch_gap``; each runs once launched and the device is free.
        ``tie``: the launch call is in the trace (else the kernel carries a correlation id nothing has).
        ``stall``: each kernel but the first waits this long after the one before (on another stream, an
        event or a collective: it was queued)."""
        self.b.add_host(HostKind.USER_ANNOTATION, f"ProfilerStep#{n}", start, host_ns)
        t = start + 50 * US
        for i, dur in enumerate(kernels):
            self.corr += 1
            if tie:
                self.b.add_host(HostKind.RUNTIME, "cudaLaunchKernel", t, 5 * US, thread=thread, correlation=self.corr)
            begin = max(t + 5 * US, self.device_free + (stall if i else 0))
            self.b.add_device(DeviceKind.KERNEL, GEMM, begin, dur, correlation=self.corr)
            self.device_free = begin + dur
            t += launch_gap

    def gpu_step(self, n: int, start: int, dur: int) -> None:
        self.b.add_device(DeviceKind.ANNOTATION, f"ProfilerStep#{n}", start, dur)

    def view(self) -> TraceView:
        return TraceView(self.b.build(TraceInfo(platform="cuda", devices=(H200,), event_count=1)))

    def timelines(self):
        v = self.view()
        return step_timelines(v, v.windows, v.primary_device, HostState(v))


def test_a_host_that_runs_ahead_leaves_the_steps_on_the_device_timeline() -> None:
    """2 ms host steps each launching 20 ms of kernels: the host races ahead, every step runs on the
    device long after its host span; its device window is 20 ms, busy, and the lead grows."""
    loop = Loop()
    for k in range(5):
        loop.step(k + 1, k * 2 * MS, 2 * MS, [10 * MS, 10 * MS])
    r = loop.timelines()
    t = r.summary
    assert t.device_bound_steps == 5 and t.host_bound_steps == 0
    assert t.device_step_ns == pytest.approx(20 * MS, rel=0.01) and t.host_step_ns == 2 * MS
    assert t.device_busy_pct > 99.0 and t.device_wait_pct < 1.0  # the first kernel's launch latency
    leads = [s.device_start_ns - s.host_start_ns for s in t.steps]
    assert leads == sorted(leads) and t.lead_ns == int(np.median(leads))
    # the account's windows are the device's: back to back, each a step's 20 ms
    assert np.array_equal(r.account.starts, r.device.starts) and "device's timeline" in r.account.describe()
    assert np.all(r.account.starts[1:] == r.account.ends[:-1])


def test_a_device_that_waits_on_its_dependencies_is_not_the_bottleneck() -> None:
    """2 ms host steps each launching 10 ms of kernels that wait 10 ms on another stream (or a collective)
    between them: the device never waits for the host, but it is idle half of each step, queued behind
    its dependencies. It does not limit the step (an A100 rank of 16 in HTA's traces read "the GPU limits
    4 of 5 steps" while 31-37% busy, 54% waiting on collectives): the host's windows stand."""
    loop = Loop()
    for k in range(5):
        loop.step(k + 1, k * 2 * MS, 2 * MS, [5 * MS, 5 * MS], stall=10 * MS)
    v = loop.view()
    r = step_timelines(v, v.windows, v.primary_device, HostState(v))
    t = r.summary
    assert t.device_bound_steps == 0 and r.account is v.windows
    for s in t.steps:
        if s.window_end_ns is None:
            continue
        d = s.window_end_ns - s.window_start_ns
        assert 100.0 * s.host_wait_ns < DEVICE_BOUND_WAIT_PCT * d and s.dependency_wait_ns > 0.4 * d


def test_a_device_that_waits_keeps_the_host_windows() -> None:
    """10 ms host steps launching 1 ms of kernels: the device waits 90% of each step; the account's
    windows are the ProfilerStep spans themselves (nothing changes from before the two timelines)."""
    loop = Loop()
    for k in range(4):
        loop.step(k + 1, k * 10 * MS, 10 * MS, [500 * US, 500 * US])
    v = loop.view()
    r = step_timelines(v, v.windows, v.primary_device, HostState(v))
    assert r.summary.device_bound_steps == 0 and r.summary.host_bound_steps == 4
    assert r.account is v.windows
    assert all(s.host_wait_ns > 0.8 * (s.window_end_ns - s.window_start_ns) for s in r.summary.steps)


def test_a_run_that_turns_device_bound_mixes_both_kinds_of_window() -> None:
    """Two host-bound steps, then three whose kernels outlast the host: each step is judged on its own
    (the device's wait through the host's long second step is that step's, as CUDA events would time
    it: step 3 begins on the device when the host begins it). The windows stay sorted and disjoint,
    and the account says how many of each."""
    loop = Loop()
    start = 0
    for k in range(2):
        loop.step(k + 1, start, 10 * MS, [1 * MS])
        start += 10 * MS
    for k in range(2, 5):
        loop.step(k + 1, start, 2 * MS, [8 * MS])
        start += 2 * MS
    r = loop.timelines()
    assert [s.limit for s in r.summary.steps] == ["host", "host", "device", "device", "device"]
    a = r.account
    assert np.all(a.ends > a.starts) and np.all(a.starts[1:] >= a.ends[:-1])
    assert "3 of 5 on the device's timeline" in a.describe()
    m = analyze_trace(loop.b.build(TraceInfo(platform="cuda", devices=(H200,), event_count=1)))
    assert m.ledger is not None and m.ledger.device_windows == 3 and m.ledger.windows == 5
    assert m.ledger.idle_pct < 50.0  # the host-bound steps' idle, the device-bound steps' busy time


def test_work_is_tied_by_its_launch_on_any_thread() -> None:
    """The autograd engine launches the backward's kernels from its own thread, inside the step's time:
    they are the step's."""
    loop = Loop()
    loop.step(1, 0, 2 * MS, [10 * MS], thread="0/1")
    loop.step(2, 2 * MS, 2 * MS, [10 * MS], thread="0/2")  # the backward thread
    t = loop.timelines().summary
    assert [s.activities for s in t.steps] == [1, 1] and t.untied == 0
    assert t.tied_by == "launch calls (correlation ids)"


def test_the_gpu_side_profiler_step_ranges_tie_what_has_no_launch_call() -> None:
    """Kernels whose launch call is not in the trace are tied by the GPU-side ProfilerStep#N range that
    holds them; outside every such range they belong to no step."""
    loop = Loop()
    loop.step(1, 0, 2 * MS, [10 * MS, 10 * MS], tie=False)
    loop.step(2, 2 * MS, 2 * MS, [10 * MS], tie=False)
    loop.gpu_step(1, 0, 20 * MS + 60 * US)
    t = loop.timelines().summary
    assert [s.activities for s in t.steps] == [2, 0]
    assert t.untied == 1 and t.tied_by == "GPU-side ProfilerStep annotations"


def test_work_launched_before_the_profiled_steps_opens_the_first_device_window() -> None:
    """Kernels still running from steps before the profile (no launch in the trace, no GPU-side range):
    untied; the first step's device window starts when the device is done with them."""
    loop = Loop()
    loop.b.add_device(DeviceKind.KERNEL, GEMM, 0, 30 * MS, correlation=999)
    loop.device_free = 30 * MS
    loop.step(1, 1 * MS, 2 * MS, [10 * MS])
    loop.step(2, 3 * MS, 2 * MS, [10 * MS])
    r = loop.timelines()
    (first, _) = r.summary.steps
    assert r.summary.untied == 1 and first.window_start_ns == 30 * MS
    assert first.limit == "device" and first.window_end_ns - first.window_start_ns == pytest.approx(10 * MS, rel=0.01)


def test_the_last_step_keeps_the_host_time_after_its_last_kernel() -> None:
    """The device waits for the next step from the end of the last one's work: the trace holds no next
    step, so the last window ends at the later of its last kernel and its host end."""
    loop = Loop()
    loop.step(1, 0, 10 * MS, [1 * MS])
    (s,) = loop.timelines().summary.steps
    assert s.window_end_ns == 10 * MS and s.limit == "host"
    assert 100.0 * s.host_wait_ns / (s.window_end_ns - s.window_start_ns) > DEVICE_BOUND_WAIT_PCT


def test_no_steps_or_no_gpu_work_means_no_timelines() -> None:
    b = TimelineBuilder("cpu.pt.trace.json")
    b.add_host(HostKind.USER_ANNOTATION, "ProfilerStep#1", 0, 10 * MS)
    v = TraceView(b.build())
    assert step_timelines(v, v.windows, v.primary_device) is None
    loop = Loop()
    loop.b.add_device(DeviceKind.KERNEL, GEMM, 0, MS, correlation=1)
    v = loop.view()  # GPU work but no ProfilerStep
    assert step_timelines(v, v.windows, v.primary_device) is None


# --------------------------------------------------------------------------- the step time


def _step(i: int, wall_ms: float, gpu_ms: float | None) -> StepRecord:
    return StepRecord(index=i, start_ns=i * 100 * MS, wall_ns=int(wall_ms * MS),
                      gpu_ns=None if gpu_ms is None else int(gpu_ms * MS))


def test_the_step_time_is_the_cuda_events_where_most_steps_carry_them() -> None:
    """A GPU-bound loop: 2 ms to enqueue a step, 54 ms to run it; the events time the loop."""
    steps = [_step(i, 2.0, 54.0) for i in range(10)]
    assert loop_times(steps) == ([54 * MS] * 10, "CUDA events")
    figs = step_figures(steps)
    assert figs.median_ms == 54.0 and figs.source == "CUDA events"
    # fewer than half carry an event time (events that lagged too far): the wall time stands
    mixed = [_step(i, 2.0, 54.0 if i < 4 else None) for i in range(10)]
    assert loop_times(mixed) == ([2 * MS] * 10, "wall") and step_figures(mixed).median_ms == 2.0
