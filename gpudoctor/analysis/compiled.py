"""Compiled and graphed execution: what ``torch.compile`` and CUDA / HIP graphs leave in a trace.

``compiled_stats(view, windows) -> CompiledStats | None`` (None: the trace shows neither).
Counted over the analysis windows (the ProfilerStep windows, else the whole trace), events
that start in them:

- **Generated kernels**: Inductor names its Triton kernels ``triton_poi_…`` (pointwise),
  ``triton_red_…`` (reduction), ``triton_per_…`` (persistent reduction), ``triton_tem_…``
  (templates, its own matmuls); on a CPU its C++ kernels run as ``cpp_fused_…`` ops. Their
  share of kernel time says how much of the GPU's work the compiler generated.
- **Compiled regions** (host side): ``Torch-Compiled Region: F/C`` is one call of frame ``F``
  that Dynamo compiled, in its compilation ``C`` (``C`` > 0: the frame was recompiled; several
  frames in one step: graph breaks, or several compiled functions); AOTAutograd's
  ``CompiledFunction`` / ``CompiledFunctionBackward`` wrap a compiled forward and backward
  under autograd; Inductor's ``## Call CompiledFxGraph <hash> ##`` annotates each call of a
  compiled graph. Launch calls made inside any of these (compiled code) are what CUDA graphs
  (``mode="reduce-overhead"``) would replace by one launch per graph; the launches outside
  them are eager code.
- **Graph launches**: a ``cudaGraphLaunch`` (``cuGraphLaunch``, ``hipGraphLaunch``) issues every
  node of the graph with the launch's correlation id, so the kernels of each launch are the
  device events correlated with it. Those kernels were not launched one by one: the time
  between them is not launch overhead (``analysis.utilization`` charges a queued gap that
  ends at one of them to the dependency it waited on).

Names are what the trace has to go by: a Triton kernel that Inductor did not generate (a
library's own, ``_matmul_ogs_…`` in vLLM) is not counted as one.
"""

from __future__ import annotations

import re

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.kernels import name_stats
from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.metrics import CompiledStats, WindowKind

TOP_TRITON = 5
_REGION_ID = re.compile(r"^Torch-Compiled Region:\s*(\d+/\d+)")


def _in_windows(windows: Windows, ts: np.ndarray) -> np.ndarray:
    if not windows.from_steps or not len(ts):
        return np.ones(len(ts), bool)
    return windows.index_of(ts) >= 0


def _pct(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 3) if whole > 0 else None


def compiled_stats(view: TraceView, windows: Windows | None = None,
                   device_windows: Windows | None = None) -> CompiledStats | None:
    """What the trace shows of torch.compile and of CUDA / HIP graphs (None: neither): host events in
    ``windows``, device activity in ``device_windows`` (default: the same; the steps on the device's
    timeline where the device runs behind the host, ``analysis.timelines``)."""
    windows = windows or view.windows
    device_windows = device_windows or windows
    names = view.names
    if not any(t.any() for t in (names.compiled_region, names.compiled_function, names.compiled_graph_call,
                                  names.triton_kernel, names.inductor_cpp_kernel, names.graph_launch_call)):
        return None  # no such name in the trace: every count below would be 0 (~50 ms less at 1.5 M events)
    # kernels (and the graph-issued activity) in the windows
    kidx = np.flatnonzero(view.is_kernel)
    kidx = kidx[_in_windows(device_windows, view.d_ts[kidx])]
    kdur = view.d_dur[kidx]
    kernel_ns = int(kdur.sum())
    triton = view.dev_is(names.triton_kernel)[kidx]
    triton_ns = int(kdur[triton].sum())
    # host events in the windows
    in_w = _in_windows(windows, view.h_ts)
    ops = (view.is_cpu_op | view.is_annotation) & in_w
    region = ops & view.host_is(names.compiled_region)
    function = ops & view.host_is(names.compiled_function)
    graph_call = ops & view.host_is(names.compiled_graph_call)
    cpp = view.is_cpu_op & in_w & view.host_is(names.inductor_cpp_kernel)
    launch = view.is_launch_call & in_w
    graph_launch = launch & view.host_is(names.graph_launch_call)
    # what each graph launch issued: the activity correlated with it
    act = np.flatnonzero(view.is_activity)
    act = act[_in_windows(device_windows, view.d_ts[act])]
    issuer = view.dev_launch[act] if len(act) else np.zeros(0, np.int64)
    by_graph = issuer >= 0
    if by_graph.any():
        by_graph[by_graph] = graph_launch[issuer[by_graph]]
    g_kernel = by_graph & view.is_kernel[act]
    g_act = act[g_kernel]
    g_issuer = issuer[g_kernel]
    per_launch = np.unique(g_issuer, return_counts=True)[1] if len(g_issuer) else np.zeros(0, np.int64)
    stats = CompiledStats(
        window=WindowKind.STEPS if windows.from_steps else WindowKind.TRACE,
        windows=len(windows.steps) if windows.from_steps else 1,
        kernels=len(kidx),
        kernel_ns=kernel_ns,
        triton_kernels=int(triton.sum()),
        triton_ns=triton_ns,
        triton_pct=_pct(triton_ns, kernel_ns),
        top_triton=name_stats(view.tl.names, view.d_name[kidx][triton], kdur[triton], TOP_TRITON),
        cpp_kernels=int(cpp.sum()),
        cpp_ns=int(view.h_dur[cpp].sum()),
        graph_launches=int(graph_launch.sum()),
        graph_launch_ns=int(view.h_dur[graph_launch].sum()),
        graph_kernels=len(g_act),
        graph_kernel_ns=int(view.d_dur[g_act].sum()),
        graph_kernel_pct=_pct(int(view.d_dur[g_act].sum()), kernel_ns),
        graph_kernels_max=int(per_launch.max()) if len(per_launch) else 0,
        launches=int(launch.sum()),
        region_calls=int(region.sum()),
        regions=_region_ids(view, np.flatnonzero(region)),
        compiled_function_calls=int((function & ~view.host_is(names.backward)).sum()),
        compiled_backward_calls=int((function & view.host_is(names.backward)).sum()),
        graph_calls=int(graph_call.sum()),
        region_launches=_launches_inside(view, np.flatnonzero(region | function | graph_call), launch & ~graph_launch),
    )
    if not stats.compiled and not stats.graph_launches:
        return None
    return stats


def _region_ids(view: TraceView, idx: np.ndarray) -> tuple[str, ...]:
    """The distinct ``F/C`` ids of the compiled-region ranges ``idx``, frame by frame."""
    found: set[str] = set()
    for name_id in np.unique(view.h_name[idx]).tolist():
        m = _REGION_ID.match(view.tl.names[int(name_id)])
        if m:
            found.add(m.group(1))
    return tuple(sorted(found, key=lambda r: tuple(int(x) for x in r.split("/"))))


def _launches_inside(view: TraceView, regions: np.ndarray, launch: np.ndarray) -> int:
    """Launch calls (``launch``: a host mask) that start inside one of the ``regions`` ranges (on any thread)."""
    li = np.flatnonzero(launch)
    if not len(regions) or not len(li):
        return 0
    cov = iv.Coverage(*iv.union(view.h_ts[regions], view.h_end[regions]))
    ts = view.h_ts[li]
    return int((cov.covered(ts, ts + 1) > 0).sum())
