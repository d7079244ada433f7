"""Compiled and graphed execution (``analysis.compiled``) on hand-built timelines (µs × 1000),
and the rule that queued gaps before graph-issued kernels are never launch overhead."""

from __future__ import annotations

from gpudoctor.analysis import analyze_trace
from gpudoctor.analysis.compiled import compiled_stats
from gpudoctor.analysis.utilization import GRAPH_GAP_DETAIL
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.metrics import Component, GapCause
from gpudoctor.model.trace import DeviceKind as D
from gpudoctor.model.trace import HostKind as H
from gpudoctor.model.trace import TimelineBuilder

US = 1000


def _launch(b: TimelineBuilder, name: str, ts_us: int, corr: int, dur_us: int = 5) -> None:
    b.add_host(H.RUNTIME, name, ts_us * US, dur_us * US, correlation=corr)


def compiled_step() -> TimelineBuilder:
    """One 1 ms step: a compiled region (frame 0, its second compilation) that launches two Triton
    kernels and one cuBLAS GEMM, then an eager op that launches one kernel."""
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#3", 0, 1000 * US)
    b.add_host(H.CPU_OP, "Torch-Compiled Region: 0/1", 10 * US, 300 * US)
    b.add_host(H.CPU_OP, "CompiledFunction", 20 * US, 280 * US)
    b.add_host(H.USER_ANNOTATION, "## Call CompiledFxGraph abc123 ##", 30 * US, 260 * US)
    _launch(b, "cudaLaunchKernel", 40, 1)
    _launch(b, "cuLaunchKernel", 100, 2)
    _launch(b, "cudaLaunchKernel", 200, 3)
    b.add_host(H.CPU_OP, "aten::add", 400 * US, 50 * US)
    _launch(b, "cudaLaunchKernel", 410, 4)
    b.add_device(D.KERNEL, "triton_poi_fused_add_mul_0", 50 * US, 100 * US, correlation=1)
    b.add_device(D.KERNEL, "triton_red_fused_sum_1", 150 * US, 100 * US, correlation=2)
    b.add_device(D.KERNEL, "sm90_xmma_gemm_bf16", 250 * US, 200 * US, correlation=3)
    b.add_device(D.KERNEL, "elementwise_kernel", 450 * US, 100 * US, correlation=4)
    return b


def test_triton_kernels_regions_and_launches_inside_compiled_code():
    st = compiled_stats(TraceView(compiled_step().build()))
    assert st is not None and st.compiled and not st.graph_launches
    assert (st.kernels, st.kernel_ns) == (4, 500 * US)
    assert (st.triton_kernels, st.triton_ns, st.triton_pct) == (2, 200 * US, 40.0)
    assert [n.name for n in st.top_triton] == ["triton_poi_fused_add_mul_0", "triton_red_fused_sum_1"]
    assert (st.region_calls, st.regions, st.frames, st.recompiled) == (1, ("0/1",), ("0",), ("0/1",))
    assert (st.compiled_function_calls, st.compiled_backward_calls, st.graph_calls) == (1, 0, 1)
    assert (st.launches, st.region_launches, st.eager_launches) == (4, 3, 1)  # the aten::add's launch is eager


def _three_kernels(graphed: bool) -> TimelineBuilder:
    """Three kernels with 4 µs gaps between them, all launched before the first runs (queued): by one
    cudaGraphLaunch (they share its correlation id), or one cudaLaunchKernel each; then an eager kernel
    queued 4 µs after the last."""
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 200 * US)
    if graphed:
        _launch(b, "cudaGraphLaunch", 5, 9, dur_us=15)
    else:
        for k in range(3):
            _launch(b, "cudaLaunchKernel", 5 + 5 * k, 9 + 10 * k)
    for k, t in enumerate((30, 64, 98)):
        b.add_device(D.KERNEL, f"node_{k}", t * US, 30 * US, correlation=9 + (0 if graphed else 10 * k))
    _launch(b, "cudaLaunchKernel", 25, 50)
    b.add_device(D.KERNEL, "eager_queued", 132 * US, 30 * US, correlation=50)
    return b


def test_graph_launch_issues_its_kernels_and_its_gaps_are_not_launch_overhead():
    m = analyze_trace(_three_kernels(graphed=True).build())
    st = m.compiled
    assert st is not None and not st.compiled
    assert (st.graph_launches, st.graph_kernels, st.graph_kernels_max, st.graph_kernel_ns) == (1, 3, 3, 90 * US)
    assert (st.launches, st.eager_launches) == (2, 1)
    (u,) = m.utilization
    causes = {c.cause: (c.count, c.total_ns) for c in u.gap_causes}
    # the two gaps inside the graph: the graph's dependencies, never launch latency
    assert causes[GapCause.DEPENDENCY] == (2, 8 * US)
    # the eager kernel queued 4 µs after the graph's last: launch latency, as before
    assert causes[GapCause.SHORT] == (1, 4 * US)
    assert any(g.detail == GRAPH_GAP_DETAIL for g in u.top_gaps)
    graphed = {s.component: s.ns for s in m.ledger.slices}
    eager = {s.component: s.ns for s in analyze_trace(_three_kernels(graphed=False).build()).ledger.slices}
    # the same timeline launched kernel by kernel charges those 8 µs to launch overhead
    assert Component.DEPENDENCY_WAIT.value not in eager
    assert graphed[Component.DEPENDENCY_WAIT.value] == 8 * US
    assert eager[Component.LAUNCH_OVERHEAD.value] - graphed[Component.LAUNCH_OVERHEAD.value] == 8 * US
    assert sum(graphed.values()) == sum(eager.values()) == 200 * US


def test_eager_trace_has_no_compiled_stats():
    b = TimelineBuilder()
    b.add_host(H.CPU_OP, "aten::mm", 0, 20 * US, external_id=1)
    _launch(b, "cudaLaunchKernel", 5, 1)
    b.add_device(D.KERNEL, "ampere_sgemm_128x64_nn", 30 * US, 50 * US, correlation=1)
    assert compiled_stats(TraceView(b.build())) is None
    assert analyze_trace(b.build()).compiled is None


def test_inductor_cpp_kernels_on_a_cpu_trace():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#0", 0, 500 * US)
    b.add_host(H.CPU_OP, "Torch-Compiled Region: 0/0", 10 * US, 200 * US)
    b.add_host(H.CPU_OP, "cpp_fused_add_relu_0", 20 * US, 30 * US)
    b.add_host(H.CPU_OP, "CompiledFunctionBackward", 250 * US, 100 * US)
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 500 * US, 500 * US)
    b.add_host(H.CPU_OP, "Torch-Compiled Region: 1/0", 510 * US, 100 * US)  # a second frame: a graph break
    st = compiled_stats(TraceView(b.build()))
    assert st is not None and st.compiled
    assert (st.cpp_kernels, st.cpp_ns, st.kernels, st.triton_pct) == (1, 30 * US, 0, None)
    assert (st.windows, st.region_calls, st.frames, st.recompiled) == (2, 2, ("0", "1"), ())
    assert (st.compiled_function_calls, st.compiled_backward_calls) == (0, 1)
