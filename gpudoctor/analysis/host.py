"""The CPU side: time in the DataLoader, ops and Python; what the ops say about the model.

- ``cpu_summary``: the CPU-side breakdown over the analysis windows (for CPU-only traces
  the whole story): DataLoader ``__next__`` time, op time (the union of ``cpu_op``
  intervals on every thread, so nested ops are not counted twice), Python time outside
  ops (needs stacks), ``Optimizer.step`` time, the top ops by inclusive time.
- ``op_facts``: convolution shapes (``cudnn.benchmark`` pays off only with fixed
  shapes), autograd (top-level forward ops, outside the DataLoader, that carry a
  "Sequence number": the profiler
  records one only while grad mode is on — none under ``torch.no_grad`` or
  ``torch.inference_mode``, checked on torch 2.13 — and backward ops), optimizer steps,
  and loss functions computed on the host in a GPU run (after a device→host copy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.kernels import name_stats
from gpudoctor.analysis.names import memcpy_kind
from gpudoctor.analysis.nesting import self_times, top_level
from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.metrics import CpuSummary, NameStat, Window, WindowKind
from gpudoctor.model.trace import HOST_FLAG_SEQUENCE, DeviceKind

TOP_OPS = 20


def analysis_window(windows: Windows) -> Window:
    if windows.from_steps:
        first, last = int(windows.numbers[0]), int(windows.numbers[-1])
        return Window(
            WindowKind.STEPS, int(windows.starts[0]), int(windows.ends[-1]),
            f"{len(windows.steps)} ProfilerStep windows (#{first}..#{last})",
        )
    return Window(WindowKind.TRACE, windows.trace_start, windows.trace_end, "the whole trace (no ProfilerStep markers)")


def _in_windows(view: TraceView, windows: Windows, mask: np.ndarray):
    """Union of the masked host intervals, clipped to the analysis windows."""
    s, e = iv.union(view.h_ts[mask], view.h_end[mask])
    ws, we = iv.union(windows.starts, windows.ends)
    return iv.intersect(s, e, ws, we)


def cpu_summary(view: TraceView, windows: Windows | None = None, top: int = TOP_OPS) -> CpuSummary:
    windows = windows or view.windows
    w_total = windows.total_ns
    dl = _in_windows(view, windows, view.is_dataloader)
    ops = _in_windows(view, windows, view.is_cpu_op)
    ws, we = iv.union(windows.starts, windows.ends)
    opt = iv.intersect(*view.optimizer_intervals, ws, we)  # less a closure's forward and backward
    has_stacks = bool(view.is_python.any())
    python_ns = 0
    if has_stacks:
        py = _in_windows(view, windows, view.is_python)
        busy = _in_windows(view, windows, view.is_cpu_op | view.is_runtime | view.is_dataloader)
        python_ns = iv.total(*iv.subtract(*py, *busy))
    op_idx = np.flatnonzero(view.is_cpu_op)
    if windows.from_steps and len(op_idx):
        op_idx = op_idx[windows.index_of(view.h_ts[op_idx]) >= 0]

    def p(x: int) -> float:
        return round(100.0 * x / w_total, 3) if w_total else 0.0

    dl_ns, op_ns, opt_ns = iv.total(*dl), iv.total(*ops), iv.total(*opt)
    return CpuSummary(
        window=analysis_window(windows),
        dataloader_ns=dl_ns,
        dataloader_pct=p(dl_ns),
        op_ns=op_ns,
        op_pct=p(op_ns),
        python_ns=python_ns,
        python_pct=p(python_ns) if has_stacks else None,
        optimizer_ns=opt_ns,
        # by self time: a conv2d → convolution → cudnn_convolution chain is one cost, not three rows
        top_ops=name_stats(view.tl.names, view.h_name[op_idx], self_times(view, op_idx), top),
    )


@dataclass(frozen=True)
class OpFacts:
    conv_shapes_total: int | None
    conv_shapes_max_per_step: int | None
    autograd_forward_ops: int | None
    backward_ops: int | None
    optimizer_steps: int | None
    host_loss_ops: tuple[NameStat, ...]
    host_loss_after_d2h: int | None
    forward_ops: int | None = None  # top-level ops outside the DataLoader, backward and optimizer (with or without autograd)
    loss_ops: int | None = None  # loss ops (top-level) in the windows, on the host or the GPU


def op_facts(view: TraceView, windows: Windows | None = None) -> OpFacts:
    windows = windows or view.windows
    names = view.names
    ops = view.is_cpu_op
    in_win = np.ones(len(view.h_ts), bool)
    win_of = np.zeros(len(view.h_ts), np.int64)
    if windows.from_steps and len(view.h_ts):
        win_of = windows.index_of(view.h_ts)
        in_win = win_of >= 0
    has_ops = bool(ops.any())
    shapes = bool(view.tl.info.record_shapes and (view.h_dims >= 0).any())
    # convolutions and their input shapes
    conv_total = conv_max = None
    if shapes:
        conv = np.flatnonzero(ops & in_win & view.host_is(names.conv_op))
        # the outermost conv op of each call (aten::conv2d > convolution > _convolution)
        conv = conv[top_level(view, conv)] if len(conv) else conv
        keys = {(int(view.h_name[i]), int(view.h_dims[i])) for i in conv.tolist()}
        conv_total = len(keys)
        per_step: dict[int, set[tuple[int, int]]] = {}
        for i in conv.tolist():
            per_step.setdefault(int(win_of[i]), set()).add((int(view.h_name[i]), int(view.h_dims[i])))
        conv_max = max((len(v) for v in per_step.values()), default=0)
    # autograd
    fwd = bwd = n_top = None
    if has_ops:
        back = view.host_is(names.backward)
        eval_fn = np.array([n.startswith("autograd::engine::evaluate_function") for n in view.tl.names], bool)
        ef = ops & in_win & view.host_is(eval_fn) if len(eval_fn) else np.zeros(len(ops), bool)
        bwd = int(ef.sum()) if ef.any() else int((ops & in_win & back).sum())
        cand = np.flatnonzero(ops & in_win & ~back & ~view.host_is(names.optimizer_step))
        top = cand[top_level(view, cand)] if len(cand) else cand
        # the DataLoader's own ops (collate: stack, select …) run with grad mode on; not the model's
        dl = iv.Coverage(*iv.union(view.h_ts[view.is_dataloader], view.h_end[view.is_dataloader]))
        top = top[dl.covered(view.h_ts[top], view.h_ts[top] + 1) == 0] if len(top) else top
        fwd = int(((view.h_flags[top] & HOST_FLAG_SEQUENCE) != 0).sum())
        n_top = len(top)
    # optimizer steps
    opt_idx = np.flatnonzero(view.is_optimizer_step & in_win)
    opt_steps = len({(int(view.h_name[i]), int(view.h_ts[i])) for i in opt_idx.tolist()}) if has_ops else None
    # loss computed on the host in a GPU run
    loss_stats: tuple[NameStat, ...] = ()
    after_d2h = None
    n_loss = None
    if has_ops:
        all_loss = np.flatnonzero(ops & in_win & view.host_is(names.loss_op))
        n_loss = int(top_level(view, all_loss).sum()) if len(all_loss) else 0
    if view.is_activity.any() and has_ops:
        loss = np.flatnonzero(ops & in_win & view.host_is(names.loss_op))
        if len(loss):
            loss = loss[top_level(view, loss)]
        enq = np.flatnonzero(view.is_enqueue_call)
        launched = np.zeros(len(loss), bool)
        for th in np.unique(view.h_thread[loss]).tolist():
            e_ts = np.sort(view.h_ts[enq[view.h_thread[enq] == th]])
            sel = np.flatnonzero(view.h_thread[loss] == th)
            if not len(e_ts):
                continue
            k = np.searchsorted(e_ts, view.h_ts[loss[sel]], side="left")
            launched[sel] = (k < len(e_ts)) & (e_ts[np.minimum(k, len(e_ts) - 1)] <= view.h_end[loss[sel]])
        hl = loss[~launched]
        loss_stats = name_stats(view.tl.names, view.h_name[hl], view.h_dur[hl], 10) if len(hl) else ()
        d2h_names = np.array([memcpy_kind(n)[0] == "DtoH" if n.startswith("Memcpy") else False
                              for n in view.tl.names], bool)
        d2h = np.flatnonzero((view.d_kind == DeviceKind.MEMCPY) & view.dev_is(d2h_names))
        after_d2h = 0
        if len(hl) and len(d2h):
            d2h_end = np.sort(view.d_end[d2h])
            for i in hl.tolist():
                k = np.searchsorted(d2h_end, view.h_ts[i], side="right")
                if k == 0:
                    continue
                last = d2h_end[k - 1]
                if not windows.from_steps or windows.index_of(np.array([last]))[0] == win_of[i]:
                    after_d2h += 1
    return OpFacts(
        conv_shapes_total=conv_total,
        conv_shapes_max_per_step=conv_max,
        autograd_forward_ops=fwd,
        backward_ops=bwd,
        optimizer_steps=opt_steps,
        host_loss_ops=loss_stats,
        host_loss_after_d2h=after_d2h,
        forward_ops=n_top,
        loss_ops=n_loss,
    )
