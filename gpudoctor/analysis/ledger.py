"""The ledger: each step's time split into exclusive parts that sum to it (docs/account.md).

``trace_ledger`` splits the windows of one trace (each ProfilerStep window; without step
markers the span of GPU activity, or the whole trace when there is none):

- **GPU trace**, on the busiest device (the one ``RuleContext.util`` judges). Busy time is
  charged by what ran, first match wins where streams overlap: ``gpu_fp32_conv``,
  ``gpu_fp32_matmul`` (kernels of float32 conv / matmul / linear / attention ops, found
  through the op that launched them; needs recorded shapes), ``gpu_conv`` (other
  convolution kernels), ``gpu_matmul`` (kernels of matmul / linear / attention ops in
  another precision), ``gpu_optimizer`` (kernels launched inside ``Optimizer.step``),
  ``gpu_compute`` (every other kernel, memset, device-to-device copy), ``h2d``, ``d2h``
  (copies with no kernel beside them), ``comm_exposed`` (NCCL/RCCL kernels with nothing
  beside them, as ``analysis.comm`` measures it). Idle time is charged gap by gap from the
  ``GapTable`` of ``analysis.utilization`` (the classification GD101 reports):
  ``dataloader`` → ``data_loading``, ``sync`` → ``sync_wait``, ``launch_bound`` and
  ``short`` → ``launch_overhead``, ``other`` → ``other_cpu``, ``dependency`` →
  ``dependency_wait``; a launch-bound, short or other gap that the host spent at least
  half inside ``Optimizer.step`` (less its closure: ``TraceView.optimizer_intervals``) is ``optimizer``.
- **CPU-only trace**: exposed host-side communication, then ``DataLoader.__next__``, then
  ``Optimizer.step`` (each where no earlier part is); the rest of each window is split in the
  proportions the dispatching thread measured there (``dispatch.window_parts``): per-op
  overhead → ``launch_overhead``, the self time of longer ops → ``cpu_compute``, Python gaps
  of 1 ms or more → ``other_cpu``; what the thread does not account for is ``unexplained``.

``steps_ledger`` is the ledger of a run's steady steps from ``steps.jsonl``: the data wait
measured on every step, the rest split by a trace's ledger when one is given (scaled) or by
the steps' phase times when they carry them, else ``unexplained``.

``sum(parts) == window duration`` for every window, in integer nanoseconds.

``analysis.weight`` adjusts a ledger to its accounting window (docs/account.md, "The accounting
window"): the shape split of a detailed window, the profiler's weight.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.comm import host_collectives, host_exposed
from gpudoctor.analysis.dispatch import window_parts
from gpudoctor.analysis.kernels import is_fp32_types
from gpudoctor.analysis.names import memcpy_kind
from gpudoctor.analysis.nesting import top_level
from gpudoctor.analysis.utilization import CAUSES, GapTable
from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.kinds import LedgerBasis, SliceSource
from gpudoctor.model.metrics import (
    Component,
    DeviceUtilization,
    GapCause,
    Ledger,
    LedgerSlice,
    StepBreakdown,
)
from gpudoctor.model.run import StepRecord
from gpudoctor.model.timelines import Timelines
from gpudoctor.model.trace import DeviceKind

C = Component

#: The device-side parts of a GPU ledger, in the order that takes an instant where they overlap.
GPU_BUSY_ORDER: tuple[Component, ...] = (
    C.GPU_FP32_CONV,
    C.GPU_FP32_MATMUL,
    C.GPU_CONV,
    C.GPU_MATMUL,
    C.GPU_OPTIMIZER,
    C.GPU_COMPUTE,
    C.H2D,
    C.D2H,
    C.COMM_EXPOSED,
)

#: The part each GPU-idle gap cause is charged to.
GAP_COMPONENT: dict[GapCause, Component] = {
    GapCause.DATALOADER: C.DATA_LOADING,
    GapCause.SYNC: C.SYNC_WAIT,
    GapCause.LAUNCH_BOUND: C.LAUNCH_OVERHEAD,
    GapCause.SHORT: C.LAUNCH_OVERHEAD,
    GapCause.OTHER: C.OTHER_CPU,
    GapCause.DEPENDENCY: C.DEPENDENCY_WAIT,
}
_HALF = 0.5  # a queued gap the host spent half inside Optimizer.step is the optimizer's

ORDER: tuple[Component, ...] = tuple(Component)


def _copy_direction(view: TraceView) -> np.ndarray:
    """Per device event: 1 host→device copy, 2 device→host copy, 0 otherwise."""
    table = np.zeros(len(view.tl.names), np.int8)
    for i, name in enumerate(view.tl.names):
        if name.startswith("Memcpy"):
            d, _ = memcpy_kind(name)
            table[i] = 1 if d == "HtoD" else 2 if d == "DtoH" else 0
    out = table[view.d_name] if len(table) else np.zeros(len(view.d_name), np.int8)
    return np.where(view.d_kind == DeviceKind.MEMCPY, out, 0)


def _eligible_kernels(view: TraceView, kidx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel of ``kidx``: launched by a Tensor-Core-eligible op with float32 inputs (as ``analysis.kernels``
    counts them); by a matmul / linear / attention op with inputs of another precision; by a convolution op
    (whatever the kernel's name: cuDNN's layout kernels are its work). All False without recorded shapes."""
    fp32, other, conv = (np.zeros(len(kidx), bool) for _ in range(3))
    if not (view.tl.info.record_shapes and (view.h_types >= 0).any()) or not len(kidx):
        return fp32, other, conv
    op = view.eligible_op_of(kidx)
    eligible = op >= 0
    conv[eligible] = view.host_is(view.names.conv_family_op)[op[eligible]]
    cache: dict[int, bool] = {}
    for j in np.flatnonzero(eligible).tolist():
        t = int(view.h_types[op[j]])
        ok = cache.get(t)
        if ok is None:
            ok = cache[t] = is_fp32_types(view.tl.string_of(t))
        fp32[j] = ok
        other[j] = not ok and t >= 0 and not conv[j]
    return fp32, other, conv


def _device_sets(view: TraceView, device: int) -> dict[Component, tuple[np.ndarray, np.ndarray]]:
    """The interval set of each device-side part on one device (before the order is applied)."""
    names = view.names
    on = view.is_activity & (view.d_device == device)
    direction = _copy_direction(view)
    comm = on & view.is_kernel & view.dev_is(names.comm_kernel)
    h2d = on & (direction == 1)
    d2h = on & (direction == 2)
    compute = on & ~comm & ~h2d & ~d2h
    kidx = np.flatnonzero(compute & view.is_kernel)
    fp32 = np.zeros(len(on), bool)
    matmul = np.zeros(len(on), bool)
    conv_op = np.zeros(len(on), bool)
    fp32[kidx], matmul[kidx], conv_op[kidx] = _eligible_kernels(view, kidx)
    conv = compute & view.is_kernel & (view.dev_is(names.conv_kernel) | conv_op)
    opt = np.zeros(len(on), bool)
    o_s, o_e = view.optimizer_intervals  # a closure's forward and backward are the model's (view.closure_intervals)
    if len(o_s) and len(kidx):
        cov = iv.Coverage(o_s, o_e)
        launch = view.dev_launch[kidx]
        known = launch >= 0
        lts = view.h_ts[np.maximum(launch, 0)]
        opt[kidx] = known & (cov.covered(lts, lts + 1) > 0)
    masks = {
        C.GPU_FP32_CONV: fp32 & conv,
        C.GPU_FP32_MATMUL: fp32 & ~conv,
        C.GPU_CONV: conv & ~fp32,
        C.GPU_MATMUL: matmul & ~conv,
        C.GPU_OPTIMIZER: compute & opt,
        C.GPU_COMPUTE: compute,
        C.H2D: h2d,
        C.D2H: d2h,
        C.COMM_EXPOSED: comm,
    }
    return {k: iv.union(view.d_ts[m], view.d_end[m]) for k, m in masks.items()}


def _take_in_order(
    sets: Sequence[tuple[Component, tuple[np.ndarray, np.ndarray]]], w_s: np.ndarray, w_e: np.ndarray
) -> tuple[dict[Component, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Charge each instant of the windows to the first set covering it: per window ns of each
    component, and what no set covers."""
    remaining = iv.union(w_s, w_e)
    parts: dict[Component, np.ndarray] = {}
    for comp, (cs, ce) in sets:
        take = iv.intersect(remaining[0], remaining[1], cs, ce)
        parts[comp] = iv.Coverage(*take).covered(w_s, w_e)
        remaining = iv.subtract(remaining[0], remaining[1], *take)
    return parts, remaining


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _scale(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (integers, largest remainder; sums exactly)."""
    wsum = sum(weights)
    if total <= 0 or wsum <= 0:
        return [0] * len(weights)
    exact = [total * w / wsum for w in weights]
    out = [int(x) for x in exact]
    rest = total - sum(out)
    for i in sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))[:rest]:
        out[i] += 1
    return out


# --------------------------------------------------------------------------- GPU trace


class HostSets:
    """The host-side interval sets an idle instant is charged by, all threads merged, in the order
    that takes an instant where they overlap (``HOST_ORDER``): cumulative unions, so that the
    share of a gap in each is one subtraction of two coverages."""

    def __init__(self, view: TraceView) -> None:
        dl, opt, blk = view.is_dataloader, view.is_optimizer_step, view.is_blocking_call
        names = view.names
        ops = view.is_cpu_op & ~dl & ~opt & ~view.host_is(names.profiler_step)
        oi = np.flatnonzero(ops)
        top = oi[top_level(view, oi)] if len(oi) else oi
        # an op (with what it nests) issuing work: its dispatch, unless it runs a millisecond or more
        # of its own (a CPU op: the loss on the host, a save, cuDNN's autotuning)
        short = top[(view.h_end[top] - view.h_ts[top]) < LONG_OP_NS]
        rt = view.is_enqueue_call  # launches, async copies and sets; not cudaMalloc/cudaFree or device queries
        parts = [
            iv.union(view.h_ts[dl], view.h_end[dl]),
            iv.union(view.h_ts[blk], view.h_end[blk]),
            view.optimizer_intervals,
            iv.union(np.concatenate([view.h_ts[rt], view.h_ts[short]]),
                     np.concatenate([view.h_end[rt], view.h_end[short]])),
        ]
        self.cumulative: list[iv.Coverage] = []
        acc_s, acc_e = iv.EMPTY
        for ps, pe in parts:
            acc_s, acc_e = iv.union(np.concatenate([acc_s, ps]), np.concatenate([acc_e, pe]))
            self.cumulative.append(iv.Coverage(acc_s, acc_e))
        self.optimizer = iv.Coverage(*parts[2])

    def split(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per interval ``[a, b)``: ns in each of ``HOST_ORDER`` and, last, in none (Python between ops)."""
        out = np.zeros((len(HOST_ORDER) + 1, len(a)), np.int64)
        prev = np.zeros(len(a), np.int64)
        for k, cov in enumerate(self.cumulative):
            cur = cov.covered(a, b)
            out[k] = cur - prev
            prev = cur
        out[-1] = np.maximum(b - a, 0) - prev
        return out


#: What the host was doing at an idle instant, first match wins (docs/account.md): inside
#: ``DataLoader.__next__``, blocked in a synchronization or synchronous copy, inside
#: ``Optimizer.step``, launching or dispatching ops (a runtime call that enqueues work, an op
#: under ``LONG_OP_NS``); anything else (Python between ops, a long CPU op, the allocator's
#: cudaMalloc/cudaFree) is ``other_cpu``.
HOST_ORDER: tuple[Component, ...] = (C.DATA_LOADING, C.SYNC_WAIT, C.OPTIMIZER, C.LAUNCH_OVERHEAD)
LONG_OP_NS = 1_000_000  # utilization.LAUNCH_GAP_MAX_NS: an op this long does CPU work of its own
_QUEUED = (CAUSES.index(GapCause.SHORT), CAUSES.index(GapCause.DEPENDENCY))


def gpu_parts(view: TraceView, gaps: GapTable, host: HostSets | None = None) -> tuple[list[dict[Component, int]], dict[Component, int]]:
    """The ledger of each window of ``gaps`` (the steps, or the span of GPU activity), and the part
    of each host-side component that lies in gaps a synchronization began (``GapCause.SYNC``:
    the queue drained; what removing the sync can win beyond the sync itself).

    Busy time is charged by what ran (``GPU_BUSY_ORDER``). Idle time, instant by instant:

    - in a gap whose ending work was already queued when it began (``short``, ``dependency``)
      the host is not the cause: the whole gap is launch latency (``launch_overhead``; the
      optimizer's when the host was in ``Optimizer.step`` for half of it) or ``dependency_wait``;
    - in a gap the host had to fill, each instant before the launch of the work ending the gap
      is charged to what the host was doing (``HOST_ORDER``, else ``other_cpu``), and from that
      launch to the gap's end (the launch call and its latency) to ``launch_overhead``.
    """
    w_s, w_e = gaps.w_starts, gaps.w_ends
    n = len(w_s)
    sets = _device_sets(view, gaps.device)
    busy, _ = _take_in_order([(c, sets[c]) for c in GPU_BUSY_ORDER], w_s, w_e)
    per_comp: dict[Component, np.ndarray] = {}
    after_sync: dict[Component, int] = {}

    def add(comp: Component, mask: np.ndarray, ns: np.ndarray) -> None:
        if not mask.any():
            return
        arr = np.bincount(gaps.window[mask], weights=ns[mask], minlength=n).astype(np.int64)
        per_comp[comp] = per_comp.get(comp, np.zeros(n, np.int64)) + arr

    if len(gaps.start):
        host = host or HostSets(view)
        lengths = gaps.lengths
        cause = gaps.cause.astype(np.int64)
        queued = np.isin(cause, _QUEUED)
        # queued gaps: whole, by cause (launch latency inside Optimizer.step is the optimizer's)
        in_opt = host.optimizer.covered(gaps.start, gaps.end) >= _HALF * lengths
        short = cause == CAUSES.index(GapCause.SHORT)
        add(C.LAUNCH_OVERHEAD, short & ~in_opt, lengths)
        add(C.OPTIMIZER, short & in_opt, lengths)
        add(C.DEPENDENCY_WAIT, cause == CAUSES.index(GapCause.DEPENDENCY), lengths)
        # host-wait gaps: instant by instant up to the launch of the work that ends them
        hw = ~queued
        launch = gaps.launch
        cut = np.where((launch > gaps.start) & (launch < gaps.end), launch, gaps.end)
        split = host.split(gaps.start, cut)
        tail = host.split(cut, gaps.end)  # the launch and its latency, unless inside an earlier part
        split[:-1] += tail[:-1]
        split[HOST_ORDER.index(C.LAUNCH_OVERHEAD)] += tail[-1]
        drained = hw & (cause == CAUSES.index(GapCause.SYNC))
        for k, comp in enumerate(HOST_ORDER):
            ns = split[k]
            add(comp, hw, ns)
            if comp == C.LAUNCH_OVERHEAD and drained.any():
                after_sync[comp] = int(ns[drained].sum())
        add(C.OTHER_CPU, hw, split[-1])
        if drained.any():
            after_sync[C.OTHER_CPU] = int(split[-1][drained].sum())
    out: list[dict[Component, int]] = []
    for w in range(n):
        parts = {c: int(busy[c][w]) for c in GPU_BUSY_ORDER}
        for c, arr in per_comp.items():
            parts[c] = parts.get(c, 0) + int(arr[w])
        dur = int(w_e[w] - w_s[w])
        parts[C.UNEXPLAINED] = dur - sum(parts.values())
        out.append(parts)
    return out, {c: v for c, v in after_sync.items() if v > 0}


# --------------------------------------------------------------------------- CPU-only trace


def cpu_parts(view: TraceView, windows: Windows) -> list[dict[Component, int]]:
    """The ledger of each window of a trace without GPU activity."""
    w_s, w_e = windows.starts, windows.ends
    exposed = host_exposed(view, *host_collectives(view, windows))
    dl = view.is_dataloader
    sets = [
        (C.COMM_EXPOSED, exposed),
        (C.DATA_LOADING, iv.union(view.h_ts[dl], view.h_end[dl])),
        (C.OPTIMIZER, view.optimizer_intervals),
    ]
    taken, remaining = _take_in_order(sets, w_s, w_e)
    done = iv.subtract(*iv.union(w_s, w_e), *remaining)
    rest = iv.Coverage(*remaining).covered(w_s, w_e)
    measured = window_parts(view, windows, iv.Coverage(*done))
    out: list[dict[Component, int]] = []
    for w in range(len(w_s)):
        parts = {c: int(taken[c][w]) for c, _ in sets}
        r = int(rest[w])
        if measured is not None:
            short, long_, glue, gap = (int(x) for x in measured[w])
            want = [short + glue, long_, gap]
            if sum(want) > r:
                want = _scale(r, want)
            parts[C.LAUNCH_OVERHEAD], parts[C.CPU_COMPUTE], parts[C.OTHER_CPU] = want
            r -= sum(want)
        parts[C.UNEXPLAINED] = r
        out.append(parts)
    return out


# --------------------------------------------------------------------------- the ledger


def _slices(total: dict[Component, int], total_ns: int, *, gpu: bool, details: dict[Component, str],
            source: SliceSource, after_sync: dict[Component, int] | None = None) -> tuple[LedgerSlice, ...]:
    out = []
    for c in ORDER:
        ns = total.get(c, 0)
        if ns <= 0:
            continue
        device = gpu and (c in GPU_BUSY_ORDER)
        out.append(
            LedgerSlice(
                component=c.value,
                ns=int(ns),
                pct=round(100.0 * ns / total_ns, 4) if total_ns else 0.0,
                side="device" if device else "host",
                detail=details.get(c, ""),
                source=source,
                after_sync_ns=min(int((after_sync or {}).get(c, 0)), int(ns)),
            )
        )
    return tuple(out)


def _gap_details(u: DeviceUtilization | None) -> dict[Component, str]:
    out: dict[Component, str] = {}
    if u is None:
        return out
    for cause in sorted(u.gap_causes, key=lambda c: -c.total_ns):
        comp = GAP_COMPONENT[cause.cause]
        if cause.top_detail and comp not in out:
            out[comp] = cause.top_detail
    return out


def trace_ledger(
    view: TraceView,
    windows: Windows,
    gaps: GapTable | None,
    utilization: DeviceUtilization | None,
    *,
    key: str,
    label: str,
    rank: int | None = None,
    timelines: Timelines | None = None,
) -> tuple[tuple[StepBreakdown, ...], Ledger | None]:
    """The ledger of each window and of all of them. ``gaps``: the GPU-idle gaps of the busiest
    device (None on a CPU-only trace); ``timelines``: which of the windows are steps on the device's
    timeline (``analysis.timelines``)."""
    gpu = gaps is not None and len(gaps.w_starts) > 0
    if gpu:
        assert gaps is not None
        parts, after_sync = gpu_parts(view, gaps)
        w_s, w_e = gaps.w_starts, gaps.w_ends
        numbers = windows.numbers if windows.from_steps else np.zeros(1, np.int64)
        where = windows.describe(False) if windows.from_steps else "the span of GPU activity (no ProfilerStep markers)"
    else:
        after_sync = {}
        if not len(windows.starts) or windows.total_ns <= 0:
            return (), None
        parts = cpu_parts(view, windows)
        w_s, w_e, numbers = windows.starts, windows.ends, windows.numbers
        where = (
            windows.describe(False) if windows.from_steps else "the whole trace (no ProfilerStep markers, no GPU activity)"
        )
    breakdown = tuple(
        StepBreakdown(
            step=int(numbers[k]),
            start_ns=int(w_s[k]),
            dur_ns=int(w_e[k] - w_s[k]),
            parts_ns={c.value: int(p.get(c, 0)) for c in ORDER if p.get(c, 0)},
        )
        for k, p in enumerate(parts)
    )
    totals: dict[Component, int] = {}
    for p in parts:
        for c, v in p.items():
            totals[c] = totals.get(c, 0) + v
    total_ns = int(sum(b.dur_ns for b in breakdown))
    details = _gap_details(utilization) if gpu else {}
    opt = np.flatnonzero(view.is_optimizer_step)
    if len(opt):
        details[C.OPTIMIZER] = view.tl.names[int(view.h_name[opt[0]])]
    dl = np.flatnonzero(view.is_dataloader)
    if len(dl) and C.DATA_LOADING not in details:
        details[C.DATA_LOADING] = view.tl.names[int(view.h_name[dl[0]])]
    notes = []
    if gpu and totals.get(C.UNEXPLAINED, 0):
        notes.append("time neither busy nor in an idle gap: the windows overlap")
    on_device = timelines.device_bound_steps if gpu and timelines is not None else 0
    if on_device:
        notes.append(f"{on_device} of the {len(breakdown)} windows are steps on the device's timeline (the device "
                     "limits them): busy time is the step's compute, idle instants what the device waited for")
    ledger = Ledger(
        key=key,
        basis=LedgerBasis.GPU if gpu else LedgerBasis.CPU,
        label=label,
        window=where,
        windows=len(breakdown),
        total_ns=total_ns,
        slices=_slices(totals, total_ns, gpu=gpu, details=details, source=SliceSource.TRACE, after_sync=after_sync),
        device=gaps.device if gpu and gaps is not None else None,
        rank=rank,
        notes=tuple(notes),
        device_windows=on_device,
        lead_ns=timelines.lead_ns if on_device and timelines is not None else None,
    )
    return breakdown, ledger


#: The parts a ledger of each basis can have (``mean_pct`` lists them all, zero or not, so that
#: two traces of one basis compare part by part).
BASIS_PARTS: dict[str, tuple[Component, ...]] = {
    "gpu": (*GPU_BUSY_ORDER, C.DATA_LOADING, C.SYNC_WAIT, C.LAUNCH_OVERHEAD, C.OPTIMIZER, C.OTHER_CPU,
            C.DEPENDENCY_WAIT, C.UNEXPLAINED),
    "cpu": (C.COMM_EXPOSED, C.DATA_LOADING, C.OPTIMIZER, C.LAUNCH_OVERHEAD, C.CPU_COMPUTE, C.OTHER_CPU,
            C.UNEXPLAINED),
}


def mean_pct(breakdown: tuple[StepBreakdown, ...], basis: str = "") -> dict[str, float]:
    """Each part's share of all window time (time-weighted), in %: every part of the ``basis``,
    and any other part that is not zero."""
    total = sum(b.dur_ns for b in breakdown)
    if not total:
        return {}
    always = {c.value for c in BASIS_PARTS.get(basis, ())}
    keys = [c.value for c in ORDER if c.value in always or any(b.parts_ns.get(c.value, 0) for b in breakdown)]
    return {k: round(100.0 * sum(b.parts_ns.get(k, 0) for b in breakdown) / total, 3) for k in keys}


def combine(ledgers: Sequence[Ledger], *, label: str = "") -> Ledger:
    """One ledger over the windows of several (one process's traces: a profiler schedule that
    repeats writes one trace per cycle): the parts summed, part by part."""
    if len(ledgers) == 1:
        return ledgers[0]
    first = ledgers[0]
    totals: dict[str, int] = {}
    drained: dict[str, int] = {}
    details: dict[str, str] = {}
    sides: dict[str, str] = {}
    for led in ledgers:
        for s in led.slices:
            totals[s.component] = totals.get(s.component, 0) + s.ns
            drained[s.component] = drained.get(s.component, 0) + s.after_sync_ns
            sides.setdefault(s.component, s.side)
            if s.detail and s.component not in details:
                details[s.component] = s.detail
    total_ns = sum(led.total_ns for led in ledgers)
    windows = sum(led.windows for led in ledgers)
    slices = tuple(
        LedgerSlice(c.value, totals[c.value], round(100.0 * totals[c.value] / total_ns, 4) if total_ns else 0.0,
                    sides[c.value], details.get(c.value, ""), "trace", drained.get(c.value, 0))
        for c in ORDER
        if totals.get(c.value, 0) > 0
    )
    return Ledger(
        key=f"traces({len(ledgers)}):{first.key}",
        basis=first.basis,
        label=label or first.label,
        window=f"{_plural(windows, 'window')} of {len(ledgers)} traces",
        windows=windows,
        total_ns=total_ns,
        slices=slices,
        device=first.device,
        rank=first.rank,
        notes=(f"{len(ledgers)} traces of one process: their windows together",),
        device_windows=sum(led.device_windows for led in ledgers),
        lead_ns=max((led.lead_ns for led in ledgers if led.lead_ns is not None), default=None),
    )


# --------------------------------------------------------------------------- run directory


_PHASES = (C.FORWARD, C.BACKWARD, C.OPTIMIZER)


def _phase_ns(s: StepRecord, comp: Component) -> int | None:
    """A phase time of a step record, when the record carries it (``forward_ns`` …)."""
    value = getattr(s, f"{comp.value}_ns", None)
    return int(value) if isinstance(value, int) else None


def steps_ledger(
    steps: Sequence[StepRecord],
    trace: Ledger | None = None,
    *,
    label: str = "",
    rank: int | None = None,
    label_steps: str = "steady step",
) -> Ledger | None:
    """The ledger of a run's steady steps: the data wait of every step, the rest split by
    ``trace`` (a CPU trace of the same run) in its proportions, else by the steps' phase times,
    else left unexplained. ``label_steps``: what the steps are ("steady step", "unprofiled steady step")."""
    steps = [s for s in steps if s.wall_ns > 0]
    if not steps:
        return None
    total_ns = sum(s.wall_ns for s in steps)
    wait_ns = sum(min(max(s.data_wait_ns, 0), s.wall_ns) for s in steps)
    rest = total_ns - wait_ns
    totals: dict[Component, int] = {C.DATA_LOADING: wait_ns}
    sources: dict[Component, SliceSource] = {C.DATA_LOADING: SliceSource.STEPS}
    details: dict[Component, str] = {}
    notes: list[str] = []
    phases = {c: [_phase_ns(s, c) for s in steps] for c in _PHASES}
    if trace is not None and trace.total_ns > trace.ns(C.DATA_LOADING):
        others = [sl for sl in trace.slices if sl.component != C.DATA_LOADING.value]
        for sl, ns in zip(others, _scale(rest, [sl.ns for sl in others]), strict=True):
            comp = Component(sl.component)
            totals[comp] = totals.get(comp, 0) + ns
            sources[comp] = SliceSource.TRACE_SCALED
            details[comp] = sl.detail
        notes.append(
            f"data wait from every steady step; the rest split in the proportions of {trace.label} "
            f"({trace.windows} profiled window{'s' if trace.windows != 1 else ''})"
        )
    elif all(v is not None for v in phases[C.BACKWARD]) and all(v is not None for v in phases[C.OPTIMIZER]):
        used = 0
        for c in _PHASES:
            ns = sum(v or 0 for v in phases[c])
            ns = min(ns, rest - used)
            totals[c] = ns
            sources[c] = SliceSource.STEPS
            used += ns
        totals[C.OTHER_CPU] = rest - used
        sources[C.OTHER_CPU] = SliceSource.STEPS
        notes.append("phase times of every steady step (host time: forward, backward, optimizer, the rest of the loop)")
    else:
        totals[C.UNEXPLAINED] = rest
        sources[C.UNEXPLAINED] = SliceSource.STEPS
        notes.append("no trace and no phase times: only the data wait is split out of the step")
    slices = tuple(
        LedgerSlice(
            component=c.value,
            ns=int(totals[c]),
            pct=round(100.0 * totals[c] / total_ns, 4),
            side="host",
            detail=details.get(c, ""),
            source=sources.get(c, SliceSource.STEPS),
        )
        for c in ORDER
        if totals.get(c, 0) > 0
    )
    return Ledger(
        key="steps" + (f":{rank}" if rank is not None else "") + (f"+{trace.key}" if trace is not None else ""),
        basis=LedgerBasis.STEPS,
        label=label or "the run",
        window=f"{_plural(len(steps), label_steps)} (steps.jsonl" + ("; the rest split as the trace splits it)" if trace is not None else ")"),
        windows=len(steps),
        total_ns=total_ns,
        slices=slices,
        rank=rank,
        notes=tuple(notes),
    )
