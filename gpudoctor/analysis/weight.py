"""A ledger adjusted to its accounting window (docs/account.md, "The accounting window").

``gpudoctor profile`` records a detailed window (shapes and stacks) and later timings-only ones; the
account is charged on the timings-only window, where the profiler weighs least. ``split_like`` gives
its kernel time the split a detailed window's shapes give (FP32 or not, matmul or not), and
``reweigh`` attaches the window's weight (its recorded steps' median over the unprofiled steps',
``model.steady.window_weight``) and, above a threshold, scales its host-side work to the unprofiled
step. Both keep ``sum(parts) == total`` exactly.
"""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.analysis.ledger import GPU_BUSY_ORDER, ORDER, _scale
from gpudoctor.model.metrics import (
    Component,
    Ledger,
    LedgerBasis,
    LedgerSlice,
    SliceSource,
    WindowWeight,
)

C = Component


#: Kernel time a trace without shapes files in its convolution part (by the kernel's name) and its other
#: kernels, and the parts a trace with shapes splits the two into (``_device_sets``: the FP32 and matmul
#: masks need the ops' input types, and so does a convolution known by the op that launched it, whose
#: layout kernels' names say no convolution). Optimizer kernels are known by the ``Optimizer.step`` range
#: that launched them, with or without shapes, and are left as they are.
_SHAPE_SPLIT: tuple[tuple[tuple[Component, ...], tuple[Component, ...]], ...] = (
    ((C.GPU_CONV, C.GPU_COMPUTE), (C.GPU_FP32_CONV, C.GPU_CONV, C.GPU_FP32_MATMUL, C.GPU_MATMUL, C.GPU_COMPUTE)),
)
_NEEDS_SHAPES = frozenset({C.GPU_FP32_CONV.value, C.GPU_FP32_MATMUL.value, C.GPU_MATMUL.value})


def split_like(ledger: Ledger, detail: Ledger, detail_label: str = "") -> Ledger:
    """``ledger`` (a GPU trace recorded without shapes) with its kernel time split as ``detail`` (a trace
    of the same process recorded with them) splits its own: its convolution and other kernels' time
    together into FP32 and other convolutions (by the op that launched them: cuDNN's layout kernels
    too), FP32 and other matmuls and the rest, in ``detail``'s proportions. The same kernels run in every step, and the profiler's weight is on the host: what a
    kernel computes does not depend on the window. Unchanged when ``ledger`` has parts that need shapes
    already, or ``detail`` has none."""
    have = {s.component for s in ledger.slices}
    if ledger.basis != LedgerBasis.GPU or detail.basis != LedgerBasis.GPU or have & _NEEDS_SHAPES:
        return ledger
    if not {s.component for s in detail.slices} & _NEEDS_SHAPES:
        return ledger
    ns = {s.component: s.ns for s in ledger.slices}
    by = {s.component: s for s in ledger.slices}
    for wholes, parts in _SHAPE_SPLIT:
        total = sum(ns.pop(w.value, 0) for w in wholes)
        weights = [detail.ns(p) for p in parts]
        if total <= 0:
            continue
        if sum(weights) <= 0:
            ns.update({w.value: v for w in wholes if (v := ledger.ns(w)) > 0})
            continue
        for p, v in zip(parts, _scale(total, weights), strict=True):
            if v > 0:
                ns[p.value] = v
    slices = []
    for c in ORDER:
        v = ns.get(c.value, 0)
        if v <= 0:
            continue
        old = by.get(c.value)
        slices.append(LedgerSlice(
            component=c.value, ns=v, pct=round(100.0 * v / ledger.total_ns, 4) if ledger.total_ns else 0.0,
            side="device", detail=old.detail if old is not None else (detail.get(c).detail if detail.get(c) else ""),
            source=old.source if old is not None else SliceSource.TRACE,
        ) if c in GPU_BUSY_ORDER else by[c.value])
    what = f" of {detail_label}" if detail_label else ""
    note = (f"kernel time split into FP32 or not, matmul or not, in the proportions the shapes{what} give "
            "(this window recorded none)")
    return replace(ledger, slices=tuple(slices), notes=(*ledger.notes, note))


#: The host-side parts the profiler's own cost lands in: its callbacks run on the host's thread at each op it
#: records (and, with stacks, at each Python call), so they lengthen the host's work between the device's
#: kernels; the time the host spends blocked (for a batch, a synchronization, another stream) is not its
#: cost. The scaling takes the excess from these first (docs/account.md, "The accounting window").
WEIGHED_PARTS: frozenset[str] = frozenset(
    c.value for c in (C.LAUNCH_OVERHEAD, C.OPTIMIZER, C.CPU_COMPUTE, C.FORWARD, C.BACKWARD, C.OTHER_CPU)
)


def reweigh(ledger: Ledger, weight: WindowWeight | None, max_ratio: float) -> Ledger:
    """``ledger`` with the weight of its window (``weight``: its recorded steps' median over the unprofiled
    steps', ``model.steady.window_weight``). Where the ratio exceeds ``max_ratio``, the ledger is scaled to
    the unprofiled step: its total divided by the ratio, the time taken out of its host-side work
    (``WEIGHED_PARTS``) in proportion, and only what that cannot hold out of its other host-side parts;
    the device's busy time stays (the profiler's cost is on the host). ``sum(parts) == total`` still holds,
    exactly. Without a weight (a bare trace, a run with too few unprofiled steps) the ledger is as it was."""
    if weight is None:
        return ledger
    if weight.ratio <= max_ratio or ledger.total_ns <= 0:
        return replace(ledger, weight=replace(weight, scaled=False, removed_ns=0))
    cut = ledger.total_ns - int(round(ledger.total_ns / weight.ratio))
    ns = {s.component: s.ns for s in ledger.slices}
    host = [s for s in ledger.slices if s.side == "host" and s.component != C.UNEXPLAINED.value]
    groups = ([s for s in host if s.component in WEIGHED_PARTS], [s for s in host if s.component not in WEIGHED_PARTS])
    taken = []
    for group in groups:
        have = sum(s.ns for s in group)
        take = min(cut, have)
        if take <= 0:
            taken.append(0)
            continue
        for s, v in zip(group, _scale(have - take, [s.ns for s in group]), strict=True):
            ns[s.component] = v
        taken.append(sum(s.ns - ns[s.component] for s in group))
        cut -= take
    total = sum(ns.values())
    removed = ledger.total_ns - total
    slices = tuple(
        replace(s, ns=ns[s.component], pct=round(100.0 * ns[s.component] / total, 4) if total else 0.0,
                after_sync_ns=(s.after_sync_ns * ns[s.component]) // s.ns if s.ns else 0)
        for s in ledger.slices if ns[s.component] > 0
    )
    return replace(ledger, total_ns=total, slices=slices,
                   weight=replace(weight, scaled=True, removed_ns=removed, waits_removed_ns=taken[1],
                                  scaled_windows=ledger.windows))
