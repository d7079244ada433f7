"""How host events nest on their thread: the self time of each, and which are top-level.

Shared by ``dispatch`` (per-op overhead), ``host`` (the CPU side's top ops, what the ops say
about the model) and ``ledger``; its own module so that neither of the first two imports
the other.
"""

from __future__ import annotations

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.view import TraceView


def self_times(view: TraceView, idx: np.ndarray) -> np.ndarray:
    """Self time of each host event ``idx``: its duration minus the durations of the events of
    ``idx`` nested directly inside it on its thread (clipped at 0 where events overlap without
    nesting). Vectorized: a sort, one ``searchsorted`` per thread, one pass per nesting level."""
    n = len(idx)
    if n == 0:
        return np.zeros(0, np.int64)
    thread = view.h_thread[idx].astype(np.int64)
    ts, end = view.h_ts[idx], view.h_end[idx]
    order = iv.nesting_order(ts, end, thread)
    th_s, ts_s, end_s = thread[order], ts[order], end[order]
    dur = end_s - ts_s
    # each event's subtree: the following events of its thread that start before it ends
    sub_end = np.empty(n, np.int64)
    cuts = np.r_[np.flatnonzero(np.r_[True, th_s[1:] != th_s[:-1]]), n]
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        sub_end[a:b] = a + np.searchsorted(ts_s[a:b], end_s[a:b], side="left")
    pos = np.arange(n, dtype=np.int64)
    sub_end = np.maximum(sub_end, pos + 1)
    # depth = how many subtrees contain the event
    diff = np.zeros(n + 1, np.int64)
    diff[1:] += 1
    np.add.at(diff, sub_end, -1)
    depth = np.cumsum(diff)[:n]
    child = np.zeros(n, np.int64)
    for d in range(int(depth.max())):
        parents = np.flatnonzero(depth == d)
        csum = np.r_[0, np.cumsum(np.where(depth == d + 1, dur, 0))]
        child[parents] = csum[sub_end[parents]] - csum[parents + 1]
    out = np.empty(n, np.int64)
    out[order] = np.maximum(dur - child, 0)
    return out


def top_level(view: TraceView, idx: np.ndarray) -> np.ndarray:
    """Which of the host events ``idx`` are not nested in another of them on their thread."""
    if not len(idx):
        return np.zeros(0, bool)
    thread = view.h_thread[idx].astype(np.int64)
    ts, end = view.h_ts[idx], view.h_end[idx]
    order = iv.nesting_order(ts, end, thread)
    t_s, e_s, th_s = ts[order], end[order], thread[order]
    out_sorted = np.ones(len(idx), bool)
    # running max of end within each thread, excluding the event itself
    starts = np.flatnonzero(np.r_[True, th_s[1:] != th_s[:-1]])
    bounds = np.r_[starts, len(idx)]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        run = np.maximum.accumulate(e_s[a:b])
        prev = np.r_[np.iinfo(np.int64).min, run[:-1]]
        out_sorted[a:b] = t_s[a:b] >= prev
    out = np.empty(len(idx), bool)
    out[order] = out_sorted
    return out
