"""analysis.comm for distributed: exposed host collectives (gloo) and per-step communication."""

from __future__ import annotations

from gpudoctor.analysis import analyze_trace
from gpudoctor.analysis.comm import comm_stats
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.trace import DeviceKind as D
from gpudoctor.model.trace import HostKind as H
from gpudoctor.model.trace import TimelineBuilder, TraceInfo

US = 1_000


def _gloo_step(b: TimelineBuilder, start: int, n: int, *, wait_us: int) -> None:
    """One DDP step on a CPU: backward ops on the main thread while gloo all-reduces on its
    own thread; the main thread then waits ``wait_us`` (no op) for the all-reduce to end."""
    main, gloo = "1/1", "1/7"
    b.add_host(H.USER_ANNOTATION, f"ProfilerStep#{n}", start, 1000 * US, thread=main)
    b.add_host(H.CPU_OP, "aten::addmm", start + 100 * US, 500 * US, thread=main)
    b.add_host(H.CPU_OP, "c10d::allreduce_", start + 600 * US, 20 * US, thread=main)
    b.add_host(H.USER_ANNOTATION, "gloo:all_reduce", start + 400 * US, (220 + wait_us) * US, thread=gloo)
    b.add_host(H.CPU_OP, "aten::copy_", start + 410 * US, 50 * US, thread=gloo)  # gloo's own work: not compute
    b.add_host(H.CPU_OP, "Optimizer.step#SGD.step", start + (620 + wait_us) * US, 100 * US, thread=main)


def test_host_collectives_exposed_where_no_other_thread_computes():
    b = TimelineBuilder()
    _gloo_step(b, 0, 10, wait_us=200)
    _gloo_step(b, 1000 * US, 11, wait_us=50)
    (c,) = comm_stats(TraceView(b.build()))
    assert c.device == -1 and c.host_ops == 2
    # each range: [400, 620 + wait); addmm hides [400, 600): exposed = 20 (c10d call) + wait
    assert c.comm_ns == c.host_ns == (420 + 270) * US
    assert c.exposed_ns == (220 + 70) * US and c.exposed_pct == round(100 * 290 / 690, 3)
    assert [(p.step, p.dur_ns, p.comm_ns, p.exposed_ns) for p in c.per_step] == [
        (10, 1000 * US, 420 * US, 220 * US),
        (11, 1000 * US, 270 * US, 70 * US),
    ]


def test_gpu_collectives_per_step_and_the_backend_of_the_trace():
    b = TimelineBuilder()
    for n in range(2):
        t = n * 1000 * US
        b.add_host(H.USER_ANNOTATION, f"ProfilerStep#{n}", t, 1000 * US)
        b.add_device(D.KERNEL, "gemm", t + 100 * US, 400 * US, stream=7)
        b.add_device(D.KERNEL, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 300 * US, 300 * US * (n + 1), stream=20)
    tl = b.build()
    tl = type(tl)(**{**{k: getattr(tl, k) for k in tl.__slots__}, "info": TraceInfo(platform="cuda", rank=1, world_size=2, backend="nccl")})
    m = analyze_trace(tl)
    (c,) = m.comm
    assert m.backend == "nccl" and (m.rank, m.world_size) == (1, 2)
    # step 0: comm [300, 600), gemm until 500: 100 exposed; step 1: comm [1300, 1900), gemm until 1500: 400
    assert [(p.step, p.comm_ns, p.exposed_ns) for p in c.per_step] == [(0, 300 * US, 100 * US), (1, 600 * US, 400 * US)]


def test_no_steps_no_per_step():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "gloo:all_reduce", 0, 10 * US, thread="1/7")
    (g,) = comm_stats(TraceView(b.build()))
    assert g.per_step == () and g.exposed_ns == g.comm_ns == 10 * US
