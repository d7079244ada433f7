"""The ledger (docs/account.md): each window split into exclusive parts that sum to it, on
hand-built timelines (times in µs × 1000), and the overlap model's cases."""

from __future__ import annotations

import pytest
from test_analysis_utilization import _launch, one_step

from gpudoctor.analysis import analyze_trace
from gpudoctor.analysis.ledger import mean_pct, steps_ledger
from gpudoctor.model.metrics import Component
from gpudoctor.model.run import StepRecord
from gpudoctor.model.trace import DeviceKind as D
from gpudoctor.model.trace import HostKind as H
from gpudoctor.model.trace import TimelineBuilder, TraceInfo

US = 1000
DL0 = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
DLN = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _parts(tl) -> dict[str, int]:
    m = analyze_trace(tl)
    assert m.ledger is not None
    assert sum(s.ns for s in m.ledger.slices) == m.ledger.total_ns
    assert all(sum(b.parts_ns.values()) == b.dur_ns for b in m.breakdown)
    return {s.component: s.ns // US for s in m.ledger.slices}


def test_idle_is_charged_instant_by_instant_to_what_the_host_was_doing():
    """torch-tb-profiler's step breakdown works this way: never a whole gap to one cause."""
    m = analyze_trace(one_step().build())
    p = {s.component: s.ns // US for s in m.ledger.slices}
    assert p == {
        "gpu_compute": 382,
        "data_loading": 300,  # the DataLoader's 300 µs of the gap [0, 310); its last 10 µs launch the kernel
        "sync_wait": 5,  # [500, 505): still blocked in the sync while the GPU idled
        # [300, 310) and [600, 605): the launch call and its latency; [700, 795) inside a short op,
        # [795, 800) its launch; [805, 808) queued (launch latency)
        "launch_overhead": 10 + 5 + 100 + 3,
        "other_cpu": 95 + 100,  # [505, 600) Python after the sync; [900, 1000) nothing profiled
    }
    # the gap the sync began (the queue drained): its launch and Python time, what removing the sync can win
    assert m.ledger.get(Component.LAUNCH_OVERHEAD).after_sync_ns == 5 * US
    assert m.ledger.get(Component.OTHER_CPU).after_sync_ns == 95 * US
    assert m.ledger.basis == "gpu" and m.ledger.total_ns == 1000 * US
    (u,) = m.utilization
    assert m.ledger.idle_pct == pytest.approx(u.idle_pct_steps, abs=1e-3)  # one classification, one figure
    assert m.breakdown_mean_pct["data_loading"] == 30.0
    assert m.ledger.get(Component.DATA_LOADING).detail.startswith("enumerate(DataLoader)")
    assert m.ledger.get(Component.GPU_COMPUTE).side == "device"
    assert m.ledger.get(Component.SYNC_WAIT).side == "host"


def test_busy_time_by_kind_first_match_wins_where_streams_overlap():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 1000 * US)
    b.add_device(D.KERNEL, "implicit_convolve_sgemm", 0, 100 * US, stream=7)
    b.add_device(D.KERNEL, "elementwise_kernel", 50 * US, 100 * US, stream=13)  # [50, 100) is the conv's
    b.add_device(D.MEMCPY, "Memcpy HtoD (Pinned -> Device)", 140 * US, 60 * US, nbytes=1)  # [150, 200) alone
    b.add_device(D.MEMCPY, "Memcpy DtoH (Device -> Pageable)", 200 * US, 20 * US, nbytes=1)
    b.add_device(D.KERNEL, "ncclKernel_AllReduce_RING_LL_Sum_float", 220 * US, 100 * US, stream=20)
    b.add_device(D.KERNEL, "elementwise_kernel", 300 * US, 50 * US, stream=7)  # hides [300, 320) of the all-reduce
    b.add_host(H.USER_ANNOTATION, "Optimizer.step#SGD.step", 400 * US, 100 * US)
    _launch(b, 410, 1, 420, 480)  # launched inside Optimizer.step: the optimizer's kernel
    b.add_device(D.MEMSET, "Memset (Device)", 600 * US, 400 * US, nbytes=1)  # a memset is compute
    p = _parts(b.build())
    assert p["gpu_conv"] == 100
    assert p["gpu_compute"] == (150 - 100) + (350 - 300) + 400
    assert p["h2d"] == 50 and p["d2h"] == 20
    assert p["comm_exposed"] == 80  # [220, 300): nothing else on the device
    assert p["gpu_optimizer"] == 60
    assert sum(p.values()) == 1000


def test_fp32_matmul_and_conv_kernels_need_recorded_shapes():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 100 * US)
    b.add_host(H.CPU_OP, "aten::mm", 0, 10 * US, external_id=1, input_dims="[[8, 8], [8, 8]]",
               input_types='["float", "float"]')
    b.add_host(H.CPU_OP, "aten::conv2d", 10 * US, 10 * US, external_id=2, input_dims="[[1]]", input_types='["float"]')
    b.add_host(H.CPU_OP, "aten::mm", 20 * US, 10 * US, external_id=3, input_dims="[[8]]", input_types='["c10::BFloat16"]')
    b.add_device(D.KERNEL, "volta_sgemm_128x64_nn", 0, 30 * US, external_id=1)
    b.add_device(D.KERNEL, "implicit_convolve_sgemm", 30 * US, 20 * US, external_id=2)
    b.add_device(D.KERNEL, "ampere_bf16_s16816gemm", 50 * US, 50 * US, external_id=3)
    p = _parts(b.build(TraceInfo(record_shapes=True)))
    # the BF16 matmul's kernel is a matmul of another precision (its op says so), not "other kernels"
    assert p == {"gpu_fp32_conv": 20, "gpu_fp32_matmul": 30, "gpu_matmul": 50}
    p = _parts(b.build(TraceInfo(record_shapes=False)))  # no shapes: no dtypes, the convolution is a convolution
    assert p == {"gpu_conv": 20, "gpu_compute": 80}


def test_fp32_kernels_of_pytorch_1_traces_are_found_through_their_launch_call():
    """PyTorch 1.x kernels carry only their correlation id (no external id): the op that launched each is
    the eligible op around its launch call on the launch's thread."""
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 100 * US)
    b.add_host(H.CPU_OP, "aten::linear", 0, 20 * US, input_dims="[[8, 8], [8, 8]]", input_types='["float", "float"]')
    b.add_host(H.CPU_OP, "aten::addmm", 2 * US, 15 * US, input_dims="[[8], [8, 8], [8, 8]]",
               input_types='["float", "float", "float"]')
    b.add_host(H.RUNTIME, "cudaLaunchKernel", 5 * US, 5 * US, correlation=1)
    b.add_device(D.KERNEL, "volta_sgemm_128x64_nn", 10 * US, 40 * US, correlation=1)
    b.add_host(H.RUNTIME, "cudaLaunchKernel", 30 * US, 5 * US, correlation=2)  # outside any op
    b.add_device(D.KERNEL, "elementwise_kernel", 50 * US, 50 * US, correlation=2)
    p = _parts(b.build(TraceInfo(record_shapes=True)))
    assert p["gpu_fp32_matmul"] == 40 and p["gpu_compute"] == 50


def test_serial_loading_is_data_loading_overlapped_loading_is_not():
    """num_workers=0: the main process loads while the GPU has nothing queued (the gap is the
    DataLoader's); with workers the loop fetches a ready batch while the GPU still runs queued work,
    and that wait costs nothing."""
    serial = TimelineBuilder()
    serial.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 1000 * US)
    serial.add_host(H.USER_ANNOTATION, DL0, 0, 600 * US)
    _launch(serial, 600, 1, 610, 1000)
    assert _parts(serial.build()) == {"gpu_compute": 390, "data_loading": 600, "launch_overhead": 10}
    overlapped = TimelineBuilder()
    overlapped.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 1000 * US)
    _launch(overlapped, 0, 1, 5, 900)  # queued before the loop asks for the next batch
    overlapped.add_host(H.USER_ANNOTATION, DLN, 10 * US, 600 * US)
    _launch(overlapped, 890, 2, 900, 1000)
    assert _parts(overlapped.build()) == {"gpu_compute": 995, "launch_overhead": 5}


def test_idle_in_the_optimizer_and_queued_dependencies():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 1000 * US)
    _launch(b, 0, 1, 5, 100)
    b.add_host(H.USER_ANNOTATION, "Optimizer.step#AdamW.step", 100 * US, 300 * US)
    b.add_host(H.CPU_OP, "aten::_foreach_add_", 100 * US, 290 * US)
    _launch(b, 395, 2, 400, 500)  # the gap [100, 400) while the host was in the optimizer
    _launch(b, 401, 3, 800, 1000)  # queued long before: waited on something else
    p = _parts(b.build())
    assert p["optimizer"] == 300 and p["dependency_wait"] == 300
    assert p["launch_overhead"] == 5 and p["gpu_compute"] == 95 + 200
    assert p["gpu_optimizer"] == 100  # launched at 395 µs, inside Optimizer.step


def test_a_trace_without_steps_is_one_window_over_the_span_of_gpu_activity():
    b = TimelineBuilder()
    b.add_host(H.CPU_OP, "aten::empty", 0, 10 * US)  # before the first GPU activity: outside the window
    _launch(b, 100, 1, 110, 200)
    b.add_host(H.USER_ANNOTATION, DL0, 200 * US, 290 * US)
    _launch(b, 490, 2, 500, 600)
    m = analyze_trace(b.build())
    assert [(x.step, x.start_ns // US, x.dur_ns // US) for x in m.breakdown] == [(0, 110, 490)]
    # the gap [200, 500): in the DataLoader up to 490, then the launch of the next kernel
    assert {s.component: s.ns // US for s in m.ledger.slices} == {"gpu_compute": 190, "data_loading": 290,
                                                                 "launch_overhead": 10}
    assert "span of GPU activity" in m.ledger.window
    assert m.dataloader_iter == "single-process"


def test_cpu_only_trace_splits_the_host_time():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#3", 0, 10_000 * US)
    b.add_host(H.USER_ANNOTATION, DLN, 0, 2_000 * US)
    for i in range(100):  # 100 ops of 5 µs, 5 µs apart: per-op overhead
        b.add_host(H.CPU_OP, "aten::add", (2_000 + 10 * i) * US, 5 * US)
    b.add_host(H.CPU_OP, "aten::mm", 3_000 * US, 3_000 * US)  # the work
    b.add_host(H.USER_ANNOTATION, "Optimizer.step#SGD.step", 8_000 * US, 1_000 * US)
    b.add_host(H.CPU_OP, "aten::add_", 8_000 * US, 1_000 * US)
    m = analyze_trace(b.build())
    p = {s.component: s.ns // US for s in m.ledger.slices}
    assert m.ledger.basis == "cpu" and m.ledger.total_ns == 10_000 * US
    assert p["data_loading"] == 2_000 and p["optimizer"] == 1_000
    assert p["cpu_compute"] == 3_000
    assert p["launch_overhead"] == 100 * 5 + 99 * 5 + 5  # short ops, the glue between them, and to the mm
    assert p["other_cpu"] == 2_000 + 1_000  # Python gaps of 1 ms or more: [6000, 8000) and [9000, 10000)
    assert sum(p.values()) == 10_000
    assert m.dataloader_iter == "multi-process"


def _steps(n: int, wall_ms: float, wait_ms: float, **phases) -> tuple[StepRecord, ...]:
    return tuple(StepRecord(i, 0, int(wall_ms * 1e6), int(wait_ms * 1e6), **phases) for i in range(n))


def test_steps_ledger_takes_the_wait_from_every_step_and_splits_the_rest_by_the_trace():
    led = steps_ledger(_steps(10, 100.0, 30.0))
    assert {s.component: s.pct for s in led.slices} == {"data_loading": 30.0, "unexplained": 70.0}
    assert led.basis == "steps" and led.windows == 10 and led.step_ns == 100e6
    cpu = analyze_trace(_cpu_trace()).ledger
    led = steps_ledger(_steps(10, 100.0, 30.0), cpu)
    p = {s.component: s.pct for s in led.slices}
    assert p["data_loading"] == 30.0 and sum(p.values()) == pytest.approx(100.0)
    # the trace's own DataLoader share is replaced by the steps'; the rest keeps the trace's proportions
    assert p["cpu_compute"] == pytest.approx(70.0 * 0.75)
    assert all(s.source == "trace, scaled" for s in led.slices if s.component != "data_loading")
    assert sum(s.ns for s in led.slices) == led.total_ns


def _cpu_trace():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 2_000 * US)
    b.add_host(H.USER_ANNOTATION, DL0, 0, 1_000 * US)
    b.add_host(H.CPU_OP, "aten::mm", 1_000 * US, 750 * US)
    return b.build()


def test_mean_pct_is_time_weighted():
    m = analyze_trace(one_step().build())
    assert mean_pct(m.breakdown, "gpu") == m.breakdown_mean_pct
    assert sum(mean_pct(m.breakdown).values()) == pytest.approx(100.0)
    # every part of a GPU ledger is listed, zero or not, so that two traces compare part by part
    assert m.breakdown_mean_pct["comm_exposed"] == 0.0 and "comm_exposed" not in mean_pct(m.breakdown)
    assert "cpu_compute" not in m.breakdown_mean_pct


def test_steps_ledger_splits_by_phase_times_when_the_records_carry_them():
    """Issue 12 adds forward_ns / backward_ns / optimizer_ns to StepRecord; records that carry them
    are split by phase (host time), the rest of the loop being other host work."""
    from types import SimpleNamespace

    ms = 1_000_000
    recs = [SimpleNamespace(wall_ns=100 * ms, data_wait_ns=10 * ms, forward_ns=30 * ms, backward_ns=40 * ms,
                            optimizer_ns=5 * ms) for _ in range(4)]
    led = steps_ledger(recs)
    assert {s.component: s.pct for s in led.slices} == {
        "data_loading": 10.0, "optimizer": 5.0, "forward": 30.0, "backward": 40.0, "other_cpu": 15.0,
    }
    assert sum(s.ns for s in led.slices) == led.total_ns and "phase times" in led.notes[0]
