"""Interval arithmetic on numpy arrays of integer nanoseconds (half-open ``[start, end)``).

A "set" is two sorted arrays ``(starts, ends)`` of disjoint, non-touching intervals, as
``union`` returns it. Everything here is vectorized; nothing loops over events.
"""

from __future__ import annotations

import numpy as np

I64 = np.int64
EMPTY = (np.zeros(0, I64), np.zeros(0, I64))


def as_i64(a) -> np.ndarray:
    return np.asarray(a, dtype=I64)


def union(starts: np.ndarray, ends: np.ndarray, *, with_first: bool = False):
    """Merge intervals into a set. With ``with_first``, also the index (into the inputs)
    of the interval that starts each merged one (the earliest; ties by input order)."""
    starts = as_i64(starts)
    ends = as_i64(ends)
    if len(starts) == 0:
        return (*EMPTY, np.zeros(0, np.int64)) if with_first else EMPTY
    ends = np.maximum(ends, starts)
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    us = s[idx]
    ue = np.maximum.reduceat(e, idx)
    if with_first:
        return us, ue, order[idx]
    return us, ue


def nesting_order(ts: np.ndarray, end: np.ndarray, thread: np.ndarray | None = None) -> np.ndarray:
    """The order of events by thread, then start, the longer first among equal starts (an
    enclosing event before what it encloses): ``np.lexsort((-end, ts, thread))``.

    Computed as stable sorts that suit a trace: its start times are nearly sorted already
    (numpy's stable sort merges runs), only the events that share a start are sorted by
    their end, and in start order an event's thread comes in long runs: about half of
    ``lexsort``'s time on a trace's ops (9 against 19 ms for 355,000 ops here)."""
    ts = as_i64(ts)
    order = np.argsort(ts, kind="stable")
    s = ts[order]
    same = s[1:] == s[:-1]
    if same.any():  # the events in runs of equal starts: by start, then the longer first
        tied = np.zeros(len(s), bool)
        tied[1:] |= same
        tied[:-1] |= same
        pos = np.flatnonzero(tied)
        sub = order[pos]
        order[pos] = sub[np.lexsort((-as_i64(end)[sub], s[pos]))]
    if thread is not None and len(order):  # long runs of one thread: a fast merge too
        order = order[np.argsort(np.asarray(thread)[order], kind="stable")]
    return order


def total(s: np.ndarray, e: np.ndarray) -> int:
    return int((e - s).sum()) if len(s) else 0


def clip(s: np.ndarray, e: np.ndarray, lo: int, hi: int):
    """The part of a set inside ``[lo, hi)``."""
    if len(s) == 0 or hi <= lo:
        return EMPTY
    keep = (e > lo) & (s < hi)
    s2 = np.maximum(s[keep], lo)
    e2 = np.minimum(e[keep], hi)
    return s2, e2


class Coverage:
    """``covered(a, b)``: how much of ``[a, b)`` a set covers, vectorized over a and b."""

    def __init__(self, s: np.ndarray, e: np.ndarray) -> None:
        self.s = as_i64(s)
        self.e = as_i64(e)
        self.cum = np.concatenate(([0], np.cumsum(self.e - self.s))).astype(I64)

    def upto(self, t) -> np.ndarray:
        t = as_i64(t)
        if len(self.s) == 0:
            return np.zeros(np.shape(t), I64)
        k = np.searchsorted(self.s, t, side="right")  # intervals starting at or before t
        base = np.where(k > 0, self.cum[np.maximum(k - 1, 0)], 0)
        last = np.maximum(k - 1, 0)
        part = np.where(k > 0, np.clip(t - self.s[last], 0, self.e[last] - self.s[last]), 0)
        return base + part

    def covered(self, a, b) -> np.ndarray:
        a = as_i64(a)
        b = as_i64(b)
        return np.maximum(self.upto(np.maximum(b, a)) - self.upto(a), 0)

    def any_overlap(self, a, b) -> np.ndarray:
        """Whether some interval of the set meets ``[a, b]`` (closed, so touching counts)."""
        a = as_i64(a)
        b = as_i64(b)
        if len(self.s) == 0:
            return np.zeros(np.shape(a), bool)
        k = np.searchsorted(self.e, a, side="left")  # first interval ending at or after a
        ok = k < len(self.s)
        kk = np.minimum(k, len(self.s) - 1)
        return ok & (self.s[kk] <= b)


def intersect(a_s, a_e, b_s, b_e):
    """Intersection of two sets (each sorted and disjoint)."""
    if len(a_s) == 0 or len(b_s) == 0:
        return EMPTY
    return _combine(a_s, a_e, b_s, b_e, keep_b=True)


def subtract(a_s, a_e, b_s, b_e):
    """``a`` minus ``b`` (each sorted and disjoint)."""
    if len(a_s) == 0:
        return EMPTY
    if len(b_s) == 0:
        return as_i64(a_s), as_i64(a_e)
    return _combine(a_s, a_e, b_s, b_e, keep_b=False)


def _combine(a_s, a_e, b_s, b_e, keep_b: bool):
    pts = np.concatenate((as_i64(a_s), as_i64(a_e), as_i64(b_s), as_i64(b_e)))
    na, nb = len(a_s), len(b_s)
    da = np.concatenate((np.ones(na, np.int32), -np.ones(na, np.int32), np.zeros(2 * nb, np.int32)))
    db = np.concatenate((np.zeros(2 * na, np.int32), np.ones(nb, np.int32), -np.ones(nb, np.int32)))
    order = np.argsort(pts, kind="stable")
    pts = pts[order]
    ca = np.cumsum(da[order])
    cb = np.cumsum(db[order])
    inside = (ca > 0) & ((cb > 0) if keep_b else (cb == 0))
    seg_s = pts[:-1]
    seg_e = pts[1:]
    m = inside[:-1] & (seg_e > seg_s)
    return union(seg_s[m], seg_e[m])


def gaps(s: np.ndarray, e: np.ndarray, lo: int, hi: int):
    """Complement of a set inside ``[lo, hi)``: the idle gaps."""
    if hi <= lo:
        return EMPTY
    cs, ce = clip(s, e, lo, hi)
    if len(cs) == 0:
        return np.array([lo], I64), np.array([hi], I64)
    gs = np.concatenate(([lo], ce))
    ge = np.concatenate((cs, [hi]))
    m = ge > gs
    return gs[m], ge[m]


def gaps_in_windows(s: np.ndarray, e: np.ndarray, w_s: np.ndarray, w_e: np.ndarray):
    """Complement of a set inside each window (windows sorted and disjoint, possibly
    touching); also the index of the window each gap lies in. A gap never spans two
    windows: it is cut where one window ends and the next begins."""
    none = (*EMPTY, np.zeros(0, np.int64))
    if len(w_s) == 0:
        return none
    g_s, g_e = subtract(w_s, w_e, s, e)
    if len(g_s) == 0:
        return none
    inner = as_i64(w_s)
    inner = inner[(inner > g_s[0]) & (inner < g_e[-1])]
    if len(inner):
        k = np.searchsorted(g_s, inner, side="right") - 1
        cuts = inner[(k >= 0) & (inner > g_s[np.maximum(k, 0)]) & (inner < g_e[np.maximum(k, 0)])]
        if len(cuts):
            g_s = np.sort(np.concatenate((g_s, cuts)))
            g_e = np.sort(np.concatenate((g_e, cuts)))
    win = np.searchsorted(w_s, g_s, side="right") - 1
    return g_s, g_e, win.astype(np.int64)
