"""Host synchronizations: where the host blocked on the GPU, and the Python line that asked.

A sync is a runtime/driver call that blocks the host: ``cudaStreamSynchronize``,
``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a synchronous copy
(``cudaMemcpy``, ``hipMemcpyWithStream`` …) and their ROCm/driver spellings. Each is
tagged with the outermost op around it on its thread (``aten::item``, ``aten::nonzero``,
``aten::copy_`` …) and, when the trace has stacks, with the innermost Python frame of
the user's code around it (frames under ``torch/``, site-packages and the standard
library are skipped).
"""

from __future__ import annotations

import numpy as np

from gpudoctor.analysis.kernels import name_stats
from gpudoctor.analysis.names import is_user_frame
from gpudoctor.analysis.view import Lookup, TraceView, Windows
from gpudoctor.model.metrics import HostSync, NameStat, SyncSummary

TOP_SYNCS = 20
MAX_ATTRIBUTED = 5000  # syncs (the longest) given an op and a frame


def sync_summary(view: TraceView, windows: Windows | None = None, top: int = TOP_SYNCS) -> SyncSummary | None:
    windows = windows or view.windows
    idx = np.flatnonzero(view.is_blocking_call)
    if not view.is_runtime.any():
        return None  # no runtime calls recorded (CPU-only trace): nothing to say
    if windows.from_steps and len(idx):
        w = windows.index_of(view.h_ts[idx])
        idx = idx[w >= 0]
    dur = view.h_dur[idx]
    total = int(dur.sum())
    share = round(100.0 * total / windows.total_ns, 3) if windows.total_ns else None
    # attribute the longest ones to an op and a frame
    order = idx[np.argsort(-dur, kind="stable")][:MAX_ATTRIBUTED]
    ops = Lookup(view, view.is_cpu_op)
    py = Lookup(view, view.is_python) if view.is_python.any() else None
    frame_cache: dict[int, str] = {}
    records: list[HostSync] = []
    wins = windows.index_of(view.h_ts[order]).tolist()
    outer = ops.outermost(view.h_ts[order], view.h_end[order], view.h_thread[order]).tolist()
    for i, w, pos in zip(order.tolist(), wins, outer, strict=True):
        ts, end, thread = int(view.h_ts[i]), int(view.h_end[i]), int(view.h_thread[i])
        op = ops.name(pos) if pos >= 0 else ""
        frame = ""
        if py is not None:
            fpos = py.enclosing(ts, end, thread)
            for p in fpos[::-1].tolist():  # innermost first
                key = int(view.h_name[py.idx[p]])
                ok = frame_cache.get(key)
                name = view.tl.names[key]
                if ok is None:
                    ok = frame_cache[key] = name if is_user_frame(name) else ""
                if ok:
                    frame = ok
                    break
        records.append(
            HostSync(
                name=view.tl.names[view.h_name[i]],
                ts_ns=ts,
                dur_ns=int(view.h_dur[i]),
                frame=frame,
                step=int(windows.numbers[w]) if windows.from_steps and w >= 0 else None,
                op=op,
            )
        )
    return SyncSummary(
        count=len(idx),
        total_ns=total,
        share_of_steps_pct=share,
        by_name=name_stats(view.tl.names, view.h_name[idx], dur, top),
        by_frame=_group(records, lambda r: r.frame, total, top),
        top=tuple(records[:top]),
        by_op=_group(records, lambda r: r.op, total, top),
    )


def _group(records: list[HostSync], key, grand: int, top: int) -> tuple[NameStat, ...]:
    acc: dict[str, list[int]] = {}
    for r in records:
        k = key(r)
        if not k:
            continue
        a = acc.setdefault(k, [0, 0, 0])
        a[0] += 1
        a[1] += r.dur_ns
        a[2] = max(a[2], r.dur_ns)
    rows = sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]
    return tuple(
        NameStat(name=k, count=c, total_ns=t, max_ns=m, share_pct=round(100.0 * t / grand, 3) if grand else 0.0)
        for k, (c, t, m) in rows
    )
