"""Per-op overhead on the host: how much of a step goes to issuing ops rather than to their work.

Every op costs the host a fixed amount whatever its size: the Python call (module
``__call__``, hooks), the dispatcher, autograd's bookkeeping, the allocator. When the
ops are tiny (a batch of 4 through narrow layers) that fixed cost is most of the
step, and a faster core or more threads do not help: the step is *dispatch-bound*.
On a GPU this shows as launch-bound kernels (``kernels``); on a CPU-only run the
same question is answered from the host side of the trace, which is what this
module measures.

On the *dispatching thread* (the thread with the most ``cpu_op`` events in the steps:
the training loop; on a CPU the autograd engine runs the backward there too):

- the **ops** are its ``cpu_op`` events in the step windows, without ProfilerStep and
  ``Optimizer.step`` ranges and without the ops inside DataLoader ranges (collate is
  the input pipeline's, GD201's);
- an op's **self time** is its duration minus that of the ops nested directly in it
  (``self_times``): the work of ``aten::addmm`` is its self time, not that of the
  ``aten::linear`` around it;
- a **short op** runs under ``SHORT_OP_NS`` (10 µs, the cut the GPU side uses for
  kernels): a few times the fixed cost of an op on a CPU (2–6 µs: a median self time
  of 0.5–1.3 µs plus a median glue gap of 1.5–4.5 µs, measured on the sample
  scripts), so most of its time is that cost;
- **glue** is a gap between consecutive top-level ops (and from the step's start to
  its first op, from its last op to the step's end), DataLoader time taken out,
  shorter than ``GLUE_GAP_MAX_NS`` (1 ms): the Python and framework code that issues
  the next op. Longer gaps are Python work of their own (tokenization measured at
  5–100 ms per step in ``sample_scripts/cpu_preprocessing_in_loop.py``), not
  per-op overhead; the longest glue gap measured in the planted dispatch-bound
  sample (``tiny_batch_launch_bound.py``) is 0.43 ms, the optimizer's per-tensor setup.

The **typical step** takes every op's self time and every gap at its median over the
steps: per position when every step runs the same op sequence (a training loop
does), else each op name at its median self time and the gaps at their median
per-step total. A process that another process keeps off the CPU stalls for
milliseconds in a few random ops or gaps of a step; on a shared 2-core machine such
stalls made profiled steps up to 12× longer than the same step undisturbed. The medians
drop them, and a stall can only make a short op or gap look long (never the
reverse), so the overhead share is not inflated by them.

``dispatch_pct`` is the per-op overhead, short ops plus glue, as a share of the
typical step; ``short_op_time_pct`` says whether the ops carry work of their own.
"""

from __future__ import annotations

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.nesting import self_times, top_level
from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.metrics import DispatchStats, NameStat, WindowKind

SHORT_OP_NS = 10_000  # an op whose typical self time is under this is mostly fixed cost
GLUE_GAP_MAX_NS = 1_000_000  # a gap between ops under this is the glue that issues the next op
TOP_SHORT_OPS = 5


def _median_int(a: np.ndarray, axis: int | None = None):
    return np.rint(np.median(a, axis=axis)).astype(np.int64)


def _typical_by_name(name_ids: np.ndarray, self_ns: np.ndarray, n_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per op name: its ids, the ops per step and its median self time."""
    uniq, inv, counts = np.unique(name_ids, return_inverse=True, return_counts=True)
    order = np.lexsort((self_ns, inv))
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    lo = self_ns[order][starts + (counts - 1) // 2]
    hi = self_ns[order][starts + counts // 2]
    med = np.rint((lo + hi) / 2).astype(np.int64)
    return uniq, counts / n_steps, med


def dispatch_stats(view: TraceView, windows: Windows | None = None, top: int = TOP_SHORT_OPS) -> DispatchStats | None:
    """The per-op overhead of the typical step (see the module docstring); None when the steps
    hold no ``cpu_op``."""
    windows = windows or view.windows
    n_steps = len(windows.starts)
    ranges = view.is_dataloader | view.is_optimizer_step | view.host_is(view.names.profiler_step)
    idx = np.flatnonzero(view.is_cpu_op & ~ranges)
    if not len(idx) or n_steps == 0:
        return None
    win = windows.index_of(view.h_ts[idx])
    idx = idx[win >= 0]
    if not len(idx):
        return None
    threads, counts = np.unique(view.h_thread[idx], return_counts=True)
    main = int(threads[np.argmax(counts)])
    idx = idx[view.h_thread[idx] == main]
    dl_mask = view.is_dataloader & (view.h_thread == main)
    dl = iv.Coverage(*iv.union(view.h_ts[dl_mask], view.h_end[dl_mask]))
    idx = idx[dl.covered(view.h_ts[idx], view.h_ts[idx] + 1) == 0]
    if not len(idx):
        return None
    idx = idx[iv.nesting_order(view.h_ts[idx], view.h_end[idx])]  # time order (outer op first)
    self_ns = self_times(view, idx)
    is_top = top_level(view, idx)
    win = windows.index_of(view.h_ts[idx])

    per_step_names: list[np.ndarray] = []
    per_step_self: list[np.ndarray] = []
    per_step_gaps: list[np.ndarray] = []
    dl_ns = np.zeros(n_steps, np.int64)
    for k in range(n_steps):
        a, b = int(windows.starts[k]), int(windows.ends[k])
        in_step = win == k
        per_step_names.append(view.h_name[idx[in_step]])
        per_step_self.append(self_ns[in_step])
        tops = idx[in_step & is_top]
        gap_s = np.maximum.accumulate(np.r_[a, view.h_end[tops]])
        gap_e = np.maximum(np.r_[view.h_ts[tops], b], gap_s)
        per_step_gaps.append(gap_e - gap_s - dl.covered(gap_s, gap_e))
        dl_ns[k] = iv.total(*iv.clip(dl.s, dl.e, a, b))

    first = per_step_names[0]
    aligned = all(len(x) == len(first) and np.array_equal(x, first) for x in per_step_names[1:])
    aligned = aligned and all(len(g) == len(per_step_gaps[0]) for g in per_step_gaps[1:])
    if aligned:
        typ_self = _median_int(np.vstack(per_step_self), axis=0)
        short = typ_self < SHORT_OP_NS
        op_ns, short_ns = int(typ_self.sum()), int(typ_self[short].sum())
        typ_gaps = _median_int(np.vstack(per_step_gaps), axis=0)
        glue_ns = int(typ_gaps[typ_gaps < GLUE_GAP_MAX_NS].sum())
        long_ns = int(typ_gaps[typ_gaps >= GLUE_GAP_MAX_NS].sum())
        short_names, short_self = first[short], typ_self[short]
        short_count = np.ones(len(short_names))
    else:
        uniq, per_step, med = _typical_by_name(view.h_name[idx], self_ns, n_steps)
        short = med < SHORT_OP_NS
        op_ns = int(round(float((per_step * med).sum())))
        short_ns = int(round(float((per_step[short] * med[short]).sum())))
        glue_ns = int(_median_int(np.array([g[g < GLUE_GAP_MAX_NS].sum() for g in per_step_gaps])))
        long_ns = int(_median_int(np.array([g[g >= GLUE_GAP_MAX_NS].sum() for g in per_step_gaps])))
        short_names, short_self, short_count = uniq[short], med[short] * per_step[short], per_step[short]
    dataloader_ns = int(_median_int(dl_ns))
    typical = op_ns + glue_ns + long_ns + dataloader_ns
    dispatch = short_ns + glue_ns
    durations = (windows.ends - windows.starts).astype(np.int64)
    return DispatchStats(
        window=WindowKind.STEPS if windows.from_steps else WindowKind.TRACE,
        steps=n_steps,
        thread=view.tl.threads[main] if 0 <= main < len(view.tl.threads) else str(main),
        aligned=bool(aligned),
        ops_per_step=round(len(idx) / n_steps, 2),
        top_level_ops_per_step=round(int(is_top.sum()) / n_steps, 2),
        op_self_median_ns=int(_median_int(self_ns)),
        op_ns=op_ns,
        short_op_ns=short_ns,
        short_op_time_pct=round(100.0 * short_ns / op_ns, 3) if op_ns else 0.0,
        glue_ns=glue_ns,
        long_gap_ns=long_ns,
        dataloader_ns=dataloader_ns,
        typical_step_ns=typical,
        dispatch_ns=dispatch,
        dispatch_pct=round(100.0 * dispatch / typical, 3) if typical else 0.0,
        step_median_ns=int(_median_int(durations)),
        short_op_max_ns=SHORT_OP_NS,
        glue_gap_max_ns=GLUE_GAP_MAX_NS,
        top_short_ops=_top_short(view.tl.names, short_names, short_self, short_count, op_ns, top),
    )


def _top_short(names: tuple[str, ...], name_ids: np.ndarray, self_ns: np.ndarray, count: np.ndarray,
               op_ns: int, top: int) -> tuple[NameStat, ...]:
    """The short ops with the most self time in the typical step, one entry per name."""
    if not len(name_ids):
        return ()
    uniq, inv = np.unique(name_ids, return_inverse=True)
    totals = np.bincount(inv, weights=self_ns)
    counts = np.bincount(inv, weights=count)
    maxes = np.zeros(len(uniq), np.int64)
    np.maximum.at(maxes, inv, np.rint(self_ns / np.maximum(count, 1e-9)).astype(np.int64))
    order = np.lexsort((uniq, -totals))[:top]
    return tuple(
        NameStat(
            name=names[int(uniq[k])],
            count=int(np.floor(counts[k] + 0.5)),  # ops per typical step (half a call rounds up)
            total_ns=int(round(float(totals[k]))),
            max_ns=int(maxes[k]),
            share_pct=round(100.0 * float(totals[k]) / op_ns, 3) if op_ns else 0.0,
        )
        for k in order
    )


def window_parts(view: TraceView, windows: Windows, taken: iv.Coverage) -> np.ndarray | None:
    """The dispatching thread's time in each window, outside ``taken`` (the DataLoader, the
    optimizer, exposed communication: what the ledger charged first), in four columns: self time
    of ops under ``SHORT_OP_NS``, self time of longer ops, glue gaps under ``GLUE_GAP_MAX_NS``
    between top-level ops, longer gaps. Measured, not typical: every op and gap of every step.
    None when the windows hold no ``cpu_op``."""
    n = len(windows.starts)
    ranges = view.is_dataloader | view.is_optimizer_step | view.host_is(view.names.profiler_step)
    idx = np.flatnonzero(view.is_cpu_op & ~ranges)
    if not len(idx) or n == 0:
        return None
    idx = idx[windows.index_of(view.h_ts[idx]) >= 0]
    if not len(idx):
        return None
    threads, counts = np.unique(view.h_thread[idx], return_counts=True)
    main = int(threads[np.argmax(counts)])
    idx = idx[view.h_thread[idx] == main]
    idx = idx[taken.covered(view.h_ts[idx], view.h_ts[idx] + 1) == 0]
    out = np.zeros((n, 4), np.int64)
    if not len(idx):
        return out
    idx = idx[iv.nesting_order(view.h_ts[idx], view.h_end[idx])]
    self_ns = self_times(view, idx)
    is_top = top_level(view, idx)
    win = windows.index_of(view.h_ts[idx])
    short = self_ns < SHORT_OP_NS
    out[:, 0] = np.bincount(win, weights=np.where(short, self_ns, 0), minlength=n).astype(np.int64)
    out[:, 1] = np.bincount(win, weights=np.where(short, 0, self_ns), minlength=n).astype(np.int64)
    for k in range(n):
        a, b = int(windows.starts[k]), int(windows.ends[k])
        tops = idx[(win == k) & is_top]
        gap_s = np.minimum(np.maximum.accumulate(np.r_[a, np.minimum(view.h_end[tops], b)]), b)
        gap_e = np.maximum(np.r_[view.h_ts[tops], b], gap_s)
        gap = gap_e - gap_s - taken.covered(gap_s, gap_e)
        glue = gap < GLUE_GAP_MAX_NS
        out[k, 2] = int(gap[glue].sum())
        out[k, 3] = int(gap[~glue].sum())
    return out
