"""Where each step's time went: a partition of the step window into ``Component``s.

At every instant of a step exactly one component is charged: the first of ``PRIORITY``
that is active then. GPU activity comes first, as in torch-tb-profiler's overview
(kernel > memcpy > … > CPU): time the GPU spends computing is not time at stake, even
when the host is waiting in a sync or the DataLoader at the same moment. What the
host was doing is charged only while the GPU was idle:

1. ``gpu_compute``: a kernel, memset or device-to-device copy runs on any device;
2. ``h2d``: a host→device copy runs (and no kernel);
3. ``d2h``: a device→host copy runs;
4. ``data_loading``: the host is in ``enumerate(DataLoader)#…__next__``;
5. ``sync_wait``: the host is blocked in a stream/device/event sync or a synchronous copy;
6. ``optimizer``: the host is in ``Optimizer.step#…``;
7. ``other_cpu``: the host is in any other op, runtime call or annotation;
8. ``idle``: none of these (the host is in Python outside ops, or not profiled).

``sum(parts_ns.values()) == dur_ns`` for every step, exactly (integer ns). For a CPU-only
trace the GPU components are simply zero.
"""

from __future__ import annotations

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.names import memcpy_kind
from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.metrics import Component, StepBreakdown
from gpudoctor.model.trace import DeviceKind

PRIORITY: tuple[Component, ...] = (
    Component.GPU_COMPUTE,
    Component.H2D,
    Component.D2H,
    Component.DATA_LOADING,
    Component.SYNC_WAIT,
    Component.OPTIMIZER,
    Component.OTHER_CPU,
)


def _copy_direction(view: TraceView) -> np.ndarray:
    """Per device event: 1 host→device copy, 2 device→host copy, 0 otherwise."""
    table = np.zeros(len(view.tl.names), np.int8)
    for i, name in enumerate(view.tl.names):
        if name.startswith("Memcpy"):
            d, _ = memcpy_kind(name)
            table[i] = 1 if d == "HtoD" else 2 if d == "DtoH" else 0
    out = table[view.d_name] if len(table) else np.zeros(len(view.d_name), np.int8)
    return np.where(view.d_kind == DeviceKind.MEMCPY, out, 0)


def component_sets(view: TraceView) -> dict[Component, tuple[np.ndarray, np.ndarray]]:
    """The interval set of each component (before priority is applied)."""
    act = view.is_activity
    direction = _copy_direction(view)
    h2d = act & (direction == 1)
    d2h = act & (direction == 2)
    compute = act & ~h2d & ~d2h
    other_host = (view.is_cpu_op | view.is_runtime | view.is_annotation) & ~view.host_is(view.names.profiler_step)
    sets = {
        Component.GPU_COMPUTE: (view.d_ts[compute], view.d_end[compute]),
        Component.H2D: (view.d_ts[h2d], view.d_end[h2d]),
        Component.D2H: (view.d_ts[d2h], view.d_end[d2h]),
        Component.DATA_LOADING: (view.h_ts[view.is_dataloader], view.h_end[view.is_dataloader]),
        Component.SYNC_WAIT: (view.h_ts[view.is_blocking_call], view.h_end[view.is_blocking_call]),
        Component.OPTIMIZER: (view.h_ts[view.is_optimizer_step], view.h_end[view.is_optimizer_step]),
        Component.OTHER_CPU: (view.h_ts[other_host], view.h_end[other_host]),
    }
    return {k: iv.union(*v) for k, v in sets.items()}


def step_breakdown(view: TraceView, windows: Windows | None = None) -> tuple[StepBreakdown, ...]:
    """One ``StepBreakdown`` per analysis window (each ProfilerStep, or the whole trace)."""
    windows = windows or view.windows
    if len(windows.starts) == 0:
        return ()
    w_s, w_e = windows.starts, windows.ends
    remaining = iv.union(w_s, w_e)
    parts: dict[Component, np.ndarray] = {}
    for comp, (cs, ce) in component_sets(view).items():
        take = iv.intersect(remaining[0], remaining[1], cs, ce)
        cov = iv.Coverage(*take)
        parts[comp] = cov.covered(w_s, w_e)
        remaining = iv.subtract(remaining[0], remaining[1], *take)
    out = []
    for k in range(len(w_s)):
        dur = int(w_e[k] - w_s[k])
        p = {c.value: int(parts[c][k]) for c in PRIORITY}
        p[Component.IDLE.value] = dur - sum(p.values())
        out.append(StepBreakdown(step=int(windows.numbers[k]), start_ns=int(w_s[k]), dur_ns=dur, parts_ns=p))
    return tuple(out)


def mean_pct(breakdown: tuple[StepBreakdown, ...]) -> dict[str, float]:
    """Each component's share of all step time (time-weighted), in %."""
    total = sum(b.dur_ns for b in breakdown)
    if not total:
        return {}
    keys = [c.value for c in (*PRIORITY, Component.IDLE)]
    return {k: round(100.0 * sum(b.parts_ns.get(k, 0) for b in breakdown) / total, 3) for k in keys}
