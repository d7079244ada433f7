"""Per-step breakdown: sums to the step time, priority where components overlap."""

from __future__ import annotations

from gpudoctor.analysis.breakdown import PRIORITY, mean_pct, step_breakdown
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.metrics import Component
from gpudoctor.model.trace import DeviceKind as D
from gpudoctor.model.trace import HostKind as H
from gpudoctor.model.trace import TimelineBuilder

US = 1000
DL = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def test_parts_follow_the_priority_and_sum_to_the_step():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#7", 0, 1000 * US)
    b.add_host(H.USER_ANNOTATION, DL, 0, 200 * US)
    b.add_device(D.KERNEL, "k", 150 * US, 100 * US)  # overlaps the DataLoader: compute wins
    b.add_device(D.MEMCPY, "Memcpy HtoD (Pinned -> Device)", 260 * US, 40 * US, nbytes=1)
    b.add_device(D.MEMCPY, "Memcpy DtoH (Device -> Pageable)", 300 * US, 20 * US, nbytes=1)
    b.add_device(D.MEMCPY, "Memcpy DtoD (Device -> Device)", 320 * US, 10 * US, nbytes=1)  # compute
    b.add_host(H.RUNTIME, "cudaStreamSynchronize", 290 * US, 110 * US)  # [320,400) left: 10 compute + 70 sync
    b.add_host(H.USER_ANNOTATION, "Optimizer.step#SGD.step", 500 * US, 100 * US)
    b.add_host(H.CPU_OP, "aten::add", 550 * US, 150 * US)  # [600, 700) is other CPU
    (s,) = step_breakdown(TraceView(b.build()))
    assert s.step == 7 and s.dur_ns == 1000 * US
    p = {k: v // US for k, v in s.parts_ns.items()}
    assert p == {
        "gpu_compute": 110,
        "h2d": 40,
        "d2h": 20,
        "data_loading": 150,
        "sync_wait": 70,
        "optimizer": 100,
        "other_cpu": 100,
        "idle": 410,
    }
    assert sum(s.parts_ns.values()) == s.dur_ns


def test_gpu_first_priority_is_documented_order():
    assert PRIORITY[0] == Component.GPU_COMPUTE
    assert PRIORITY.index(Component.DATA_LOADING) < PRIORITY.index(Component.SYNC_WAIT)
    assert Component.IDLE not in PRIORITY


def test_one_window_per_step_and_whole_trace_without_steps():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 100 * US)
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#2", 100 * US, 100 * US)
    b.add_device(D.KERNEL, "k", 50 * US, 100 * US)  # spans both steps
    out = step_breakdown(TraceView(b.build()))
    assert [(x.step, x.parts_ns["gpu_compute"] // US) for x in out] == [(1, 50), (2, 50)]
    assert mean_pct(out)["gpu_compute"] == 50.0
    b = TimelineBuilder()
    b.add_host(H.CPU_OP, "aten::mm", 0, 30 * US)
    b.add_host(H.PYTHON_FUNCTION, "train.py(3): <module>", 0, 100 * US)  # Python is not an op
    (whole,) = step_breakdown(TraceView(b.build()))
    assert whole.step == 0 and whole.dur_ns == 100 * US
    assert whole.parts_ns["other_cpu"] == 30 * US and whole.parts_ns["idle"] == 70 * US


def test_cpu_only_trace_has_zero_gpu_parts():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#3", 0, 100 * US)
    b.add_host(H.USER_ANNOTATION, DL, 0, 60 * US)
    b.add_host(H.CPU_OP, "aten::conv2d", 60 * US, 40 * US)
    (s,) = step_breakdown(TraceView(b.build()))
    assert s.parts_ns["gpu_compute"] == 0 and s.parts_ns["data_loading"] == 60 * US
    assert s.parts_ns["other_cpu"] == 40 * US and s.parts_ns["idle"] == 0
