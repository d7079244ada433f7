"""Host↔device transfers: per direction and memory kind, with bandwidth and blocking counts.

Direction and memory kind come from the copy's name ("Memcpy HtoD (Pageable -> Device)":
direction ``HtoD``, kind ``pageable``, the host side). A copy is *blocking* when its
runtime call is synchronous (``cudaMemcpy``, ``hipMemcpyWithStream`` …) or when the same
host thread calls a stream/device/event sync after it before enqueuing any other work
(PyTorch's ``copy_`` does that for ``non_blocking=False`` and for pageable memory).
``blocking_dur_ns`` is the host time those copies blocked: the synchronous call, or the
async call plus the sync that followed it.

Counted over the analysis windows: copies that start inside a ProfilerStep window, or
all copies when the trace has no steps.
"""

from __future__ import annotations

import numpy as np

from gpudoctor.analysis.names import memcpy_kind
from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.metrics import TransferStat
from gpudoctor.model.trace import DeviceKind


def blocking_copies(view: TraceView, dev_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For device copy events ``dev_idx``: whether each one blocked its host thread, and
    for how long (the synchronous call, or the async call plus the sync that followed)."""
    launch = view.dev_launch[dev_idx] if len(dev_idx) else np.zeros(0, np.int64)
    out = np.zeros(len(dev_idx), bool)
    blocked_ns = np.zeros(len(dev_idx), np.int64)
    known = launch >= 0
    if not known.any():
        return out, blocked_ns
    names = view.names
    safe = np.maximum(launch, 0)
    sync_copy = names.sync_copy_call[view.h_name[safe]] & known
    out |= sync_copy
    blocked_ns[sync_copy] = view.h_dur[safe[sync_copy]]
    # an async copy followed by a sync on the same thread before the next enqueue
    sync = view.is_runtime & view.host_is(names.sync_call)
    enq = view.is_enqueue_call | (view.is_runtime & view.host_is(names.sync_copy_call))
    big = np.iinfo(np.int64).max
    for t in np.unique(view.h_thread[safe[known]]):
        s_idx = np.flatnonzero(sync & (view.h_thread == t))
        if not len(s_idx):
            continue
        s_idx = s_idx[np.argsort(view.h_ts[s_idx], kind="stable")]
        s_ts = view.h_ts[s_idx]
        e_ts = np.sort(view.h_ts[np.flatnonzero(enq & (view.h_thread == t))])
        sel = np.flatnonzero(known & ~sync_copy & (view.h_thread[safe] == t))
        if not len(sel):
            continue
        call = launch[sel]
        k = np.searchsorted(s_ts, view.h_ts[call], side="right")  # first sync starting after the call
        has_sync = k < len(s_ts)
        kk = np.minimum(k, len(s_ts) - 1)
        next_sync = np.where(has_sync, s_ts[kk], big)
        j = np.searchsorted(e_ts, view.h_end[call], side="left")  # next enqueue after the call ends
        next_enq = np.where(j < len(e_ts), e_ts[np.minimum(j, max(len(e_ts) - 1, 0))], big)
        hit = has_sync & (next_sync < next_enq)
        out[sel] |= hit
        blocked_ns[sel] = np.where(hit, view.h_dur[call] + view.h_dur[s_idx[kk]], blocked_ns[sel])
    return out, blocked_ns


def transfer_stats(view: TraceView, windows: Windows | None = None) -> tuple[TransferStat, ...]:
    windows = windows or view.windows
    m = (view.d_kind == DeviceKind.MEMCPY) | (view.d_kind == DeviceKind.MEMSET)
    idx = np.flatnonzero(m)
    if windows.from_steps and len(idx):
        w = windows.index_of(view.d_ts[idx])
        idx, win = idx[w >= 0], w[w >= 0]
    else:
        win = np.zeros(len(idx), np.int64)
    if not len(idx):
        return ()
    blocking, blocked_ns = blocking_copies(view, idx)
    # each distinct name's (direction, memory kind) once, then the positions of each kind (in order)
    uniq, inv = np.unique(view.d_name[idx], return_inverse=True)
    kinds: dict[tuple[str, str], int] = {}
    code = np.array([kinds.setdefault(memcpy_kind(view.tl.names[n]), len(kinds)) for n in uniq.tolist()], np.int64)
    group = code[inv.reshape(-1)]
    n_steps = len(windows.steps) if windows.from_steps else 0
    out = []
    for (direction, kind), k in kinds.items():
        p = np.flatnonzero(group == k)
        ii = idx[p]
        nbytes = view.d_bytes[ii]
        nbytes = np.where(nbytes > 0, nbytes, 0)
        dur = view.d_dur[ii]
        total_bytes = int(nbytes.sum())
        total_dur = int(dur.sum())
        blk = blocking[p]
        out.append(
            TransferStat(
                direction=direction,
                memory_kind=kind,
                count=len(p),
                bytes=total_bytes,
                dur_ns=total_dur,
                bandwidth_gbps=round(total_bytes / total_dur, 3) if total_dur > 0 and total_bytes > 0 else None,
                blocking_count=int(blk.sum()),
                max_bytes=int(nbytes.max()) if len(nbytes) else 0,
                per_step_count=round(len(p) / n_steps, 3) if n_steps else None,
                blocking_dur_ns=int(blocked_ns[p][blk].sum()),
                steps_with=int(len(np.unique(win[p]))) if n_steps else None,
            )
        )
    order = {"HtoD": 0, "DtoH": 1, "DtoD": 2, "memset": 4}
    out.sort(key=lambda t: (order.get(t.direction, 3), t.direction, t.memory_kind))
    return tuple(out)
