"""Collective communication: time in NCCL/RCCL kernels and how much of it compute hides.

On each device, communication time is the union of collective kernels (names starting
``nccl``/``rccl``, ``ncclDevKernel_…``); it is *exposed* where no other kernel runs at
the same time on that device. Host-side collectives are the ``record_function`` ranges
PyTorch's process groups emit (``nccl:all_reduce``, ``gloo:all_reduce`` …); a
trace without collective kernels (CPU-only, or gloo on CUDA tensors) gets one entry with
``device == -1`` whose communication is the union of those host ranges, exposed where
no compute runs: no ``cpu_op`` on any thread (other than the collectives' own work on
their threads, and ``c10d::`` calls) and no kernel on any device. Measured over the
analysis windows (ProfilerStep windows, or the whole trace), and per ProfilerStep
window (``per_step``).
"""

from __future__ import annotations

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.kernels import name_stats
from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.metrics import CommStats, StepComm

TOP = 10


def per_step(windows: Windows, comm, exposed) -> tuple[StepComm, ...]:
    """Communication and exposed communication inside each ProfilerStep window."""
    if not windows.from_steps:
        return ()
    comm_cov, exp_cov = iv.Coverage(*comm), iv.Coverage(*exposed)
    c = comm_cov.covered(windows.starts, windows.ends)
    x = exp_cov.covered(windows.starts, windows.ends)
    return tuple(
        StepComm(step=int(n), dur_ns=int(e - s), comm_ns=int(cn), exposed_ns=int(xn))
        for n, s, e, cn, xn in zip(windows.numbers, windows.starts, windows.ends, c, x, strict=True)
    )


def host_compute(view: TraceView, collectives: np.ndarray):
    """What counts as compute next to host-side collectives: ``cpu_op`` ranges on any thread
    (not ``c10d::`` calls or collectives, nor ops run inside a collective range on that
    collective's own thread) and every non-collective kernel on any device."""
    names = view.names
    ops = view.is_cpu_op & ~view.host_is(names.host_collective)
    if len(view.tl.names):
        c10d = np.fromiter((n.startswith("c10d::") for n in view.tl.names), bool, len(view.tl.names))
        ops &= ~c10d[view.h_name]
    for t in np.unique(view.h_thread[collectives]).tolist():
        on_t = collectives[view.h_thread[collectives] == t]
        cov = iv.Coverage(*iv.union(view.h_ts[on_t], view.h_end[on_t]))
        mine = np.flatnonzero(ops & (view.h_thread == t))
        if len(mine):
            inside = cov.covered(view.h_ts[mine], view.h_ts[mine] + 1) > 0
            ops[mine[inside]] = False
    idx = np.flatnonzero(ops)
    k = np.flatnonzero(view.is_kernel & ~view.dev_is(names.comm_kernel))
    return iv.union(
        np.concatenate((view.h_ts[idx], view.d_ts[k])), np.concatenate((view.h_end[idx], view.d_end[k]))
    )


def host_collectives(view: TraceView, windows: Windows):
    """The host-side collective ranges in the windows: (their indices, their union clipped to
    the windows)."""
    ws, we = iv.union(windows.starts, windows.ends)
    host = np.flatnonzero((view.is_annotation | view.is_cpu_op) & view.host_is(view.names.host_collective))
    if windows.from_steps and len(host):
        host = host[windows.index_of(view.h_ts[host]) >= 0]
    return host, iv.intersect(*iv.union(view.h_ts[host], view.h_end[host]), ws, we)


def host_exposed(view: TraceView, host: np.ndarray, host_set):
    """The part of the host collectives' union (``host_collectives``) that no compute hides
    (see ``host_compute``: a union over every cpu_op and kernel, so computed only where a
    figure uses it)."""
    return iv.subtract(*host_set, *host_compute(view, host)) if len(host) else iv.EMPTY


def comm_stats(view: TraceView, windows: Windows | None = None) -> tuple[CommStats, ...]:
    windows = windows or view.windows
    ws, we = iv.union(windows.starts, windows.ends)
    names = view.names
    host, host_set = host_collectives(view, windows)
    host_ns = iv.total(*host_set)
    comm_k = view.is_kernel & view.dev_is(names.comm_kernel)
    out = []
    for d in view.devices:
        on = view.d_device == d
        ck = np.flatnonzero(comm_k & on)
        if windows.from_steps and len(ck):
            ck = ck[windows.index_of(view.d_ts[ck]) >= 0]
        if not len(ck):
            continue
        comm = iv.intersect(*iv.union(view.d_ts[ck], view.d_end[ck]), ws, we)
        other = np.flatnonzero(view.is_activity & on & ~comm_k)
        compute = iv.union(view.d_ts[other], view.d_end[other])
        exposed = iv.subtract(*comm, *compute)
        busy_idx = np.flatnonzero(view.is_activity & on)
        busy = iv.intersect(*iv.union(view.d_ts[busy_idx], view.d_end[busy_idx]), ws, we)
        comm_ns, exposed_ns, busy_ns = iv.total(*comm), iv.total(*exposed), iv.total(*busy)
        out.append(
            CommStats(
                device=d,
                kernel_count=len(ck),
                comm_ns=comm_ns,
                exposed_ns=exposed_ns,
                exposed_pct=round(100.0 * exposed_ns / comm_ns, 3) if comm_ns else None,
                share_of_busy_pct=round(100.0 * comm_ns / busy_ns, 3) if busy_ns else None,
                host_ops=len(host),
                host_ns=host_ns,
                top=name_stats(view.tl.names, view.d_name[ck], view.d_dur[ck], TOP),
                per_step=per_step(windows, comm, exposed),
            )
        )
    if not out and len(host):  # no collective kernels: the host ranges are the communication
        exposed = host_exposed(view, host, host_set)
        exposed_ns = iv.total(*exposed)
        out.append(
            CommStats(
                device=-1,
                comm_ns=host_ns,
                exposed_ns=exposed_ns,
                exposed_pct=round(100.0 * exposed_ns / host_ns, 3) if host_ns else None,
                host_ops=len(host),
                host_ns=host_ns,
                top=name_stats(view.tl.names, view.h_name[host], view.h_dur[host], TOP),
                per_step=per_step(windows, host_set, exposed),
            )
        )
    return tuple(out)
