"""Numpy views on a ``Timeline`` plus the lookups every metric shares (built once per trace).

``TraceView(timeline)`` wraps the columns without copying (``numpy.frombuffer``) and
adds: end times, the GPU activity mask, correlation lookups between runtime calls and
GPU activity, per-name classes (``NameClasses``), and the time windows (steps, span,
whole trace). Metric functions take a ``TraceView`` and return model objects.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.names import NameClasses, profiler_step_number
from gpudoctor.model.metrics import StepWindow
from gpudoctor.model.trace import CLOSURE_RANGE, NO_VALUE, DeviceKind, HostKind, Timeline


def _np(a: array, dtype) -> np.ndarray:
    if len(a) == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(a, dtype=dtype)


def _non_negative(a: np.ndarray) -> np.ndarray:
    """Durations clipped at 0 (a copy only when some are negative)."""
    return np.maximum(a, 0) if len(a) and a.min() < 0 else a


@dataclass(frozen=True)
class Windows:
    """Where to measure: the ProfilerStep windows, or the whole trace as one window."""

    steps: tuple[StepWindow, ...]  # empty without ProfilerStep markers
    starts: np.ndarray  # analysis windows (the steps, or the whole trace), sorted
    ends: np.ndarray
    numbers: np.ndarray  # step number of each window (0 for the whole trace)
    from_steps: bool
    trace_start: int
    trace_end: int
    what: str = "ProfilerStep window"  # what one window is, as reports name it ("step on the device's timeline" …)
    what_plural: str = "ProfilerStep windows"

    def describe(self, numbers: bool = True) -> str:
        """"5 ProfilerStep windows (#10..#14)": how many windows of what kind (and their step numbers)."""
        n = len(self.starts)
        text = f"{n} {self.what if n == 1 else self.what_plural}"
        if numbers and self.from_steps and n:
            text += f" (#{int(self.numbers[0])}..#{int(self.numbers[-1])})"
        return text

    @property
    def total_ns(self) -> int:
        s, e = iv.union(self.starts, self.ends)
        return iv.total(s, e)

    def index_of(self, t: np.ndarray) -> np.ndarray:
        """Index of the window containing each time (-1 outside every window)."""
        t = np.asarray(t, dtype=np.int64)
        if len(self.starts) == 0:
            return np.full(np.shape(t), -1, np.int64)
        k = np.searchsorted(self.starts, t, side="right") - 1
        kk = np.maximum(k, 0)
        inside = (k >= 0) & (t < self.ends[kk])
        return np.where(inside, k, -1)


class TraceView:
    def __init__(self, timeline: Timeline) -> None:
        self.tl = timeline
        h, d, m = timeline.host, timeline.device, timeline.memory
        self.h_kind = _np(h.kind, np.int8)
        self.h_name = _np(h.name, np.int32)
        self.h_ts = _np(h.ts_ns, np.int64)
        self.h_dur = _non_negative(_np(h.dur_ns, np.int64))
        self.h_end = self.h_ts + self.h_dur
        self.h_thread = _np(h.thread, np.int32)
        self.h_corr = _np(h.correlation, np.int64)
        self.h_ext = _np(h.external_id, np.int64)
        self.h_dims = _np(h.input_dims, np.int32)
        self.h_types = _np(h.input_types, np.int32)
        self.h_concrete = _np(h.concrete_inputs, np.int32)
        self.h_flags = _np(h.flags, np.int8)
        self.d_kind = _np(d.kind, np.int8)
        self.d_name = _np(d.name, np.int32)
        self.d_ts = _np(d.ts_ns, np.int64)
        self.d_dur = _non_negative(_np(d.dur_ns, np.int64))
        self.d_end = self.d_ts + self.d_dur
        self.d_device = _np(d.device, np.int32)
        self.d_stream = _np(d.stream, np.int64)
        self.d_corr = _np(d.correlation, np.int64)
        self.d_ext = _np(d.external_id, np.int64)
        self.d_bytes = _np(d.bytes, np.int64)
        self.m_ts = _np(m.ts_ns, np.int64)
        self.m_device = _np(m.device, np.int32)
        self.m_alloc = _np(m.allocated_bytes, np.int64)
        self.m_reserved = _np(m.reserved_bytes, np.int64)
        self._busy_sets: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    # --- names ------------------------------------------------------------------------------
    @cached_property
    def names(self) -> NameClasses:
        return NameClasses(self.tl.names)

    # ``take`` gathers by an integer index about twice as fast as ``table[index]`` (1.3 against
    # 3.0 ms per million host events here); the result is the same
    def host_is(self, table: np.ndarray) -> np.ndarray:
        return table.take(self.h_name) if len(table) else np.zeros(len(self.h_name), bool)

    def dev_is(self, table: np.ndarray) -> np.ndarray:
        return table.take(self.d_name) if len(table) else np.zeros(len(self.d_name), bool)

    # --- host masks ---------------------------------------------------------------------------
    @cached_property
    def is_runtime(self) -> np.ndarray:
        return (self.h_kind == HostKind.RUNTIME) | (self.h_kind == HostKind.DRIVER)

    @cached_property
    def is_cpu_op(self) -> np.ndarray:
        return self.h_kind == HostKind.CPU_OP

    @cached_property
    def is_annotation(self) -> np.ndarray:
        return self.h_kind == HostKind.USER_ANNOTATION

    @cached_property
    def is_python(self) -> np.ndarray:
        return self.h_kind == HostKind.PYTHON_FUNCTION

    @cached_property
    def is_dataloader(self) -> np.ndarray:
        return (self.is_annotation | self.is_cpu_op) & self.host_is(self.names.dataloader)

    @cached_property
    def is_optimizer_step(self) -> np.ndarray:
        return (self.is_annotation | self.is_cpu_op) & self.host_is(self.names.optimizer_step)

    @cached_property
    def closure_intervals(self) -> tuple[np.ndarray, np.ndarray]:
        """The model's work run inside ``Optimizer.step(closure)`` (Lightning's automatic optimization,
        LBFGS, a closure loop): its forward, loss and backward are the model's, not the optimizer's.

        Where the collector marked the closure (``CLOSURE_RANGE`` ranges inside a step: exact, one per
        call, LBFGS's several included), those ranges; in a step without them (a trace from elsewhere),
        from the step's start to the end of the last backward node (``autograd::engine::evaluate_function``,
        on any thread) that started inside it: what a closure runs before the update. Empty when no step
        runs backward inside it."""
        steps = np.flatnonzero(self.is_optimizer_step)
        if not len(steps):
            return iv.EMPTY
        s_s, s_e = iv.union(self.h_ts[steps], self.h_end[steps])
        ids = [i for i, n in enumerate(self.tl.names) if n == CLOSURE_RANGE]
        marked = np.flatnonzero(np.isin(self.h_name, ids) & ~self.is_runtime) if ids else np.zeros(0, np.int64)
        starts, ends = [self.h_ts[marked]], [self.h_end[marked]]
        # the steps with no marked closure: from the step's start to its last backward node's end
        has_mark = iv.Coverage(*iv.union(self.h_ts[marked], self.h_end[marked])).covered(s_s, s_e) > 0
        node = np.flatnonzero(self.is_cpu_op & self.host_is(self.names.backward_node))
        if len(node) and not has_mark.all():
            k = np.searchsorted(s_s, self.h_ts[node], side="right") - 1
            kk = np.maximum(k, 0)
            inside = (k >= 0) & (self.h_ts[node] < s_e[kk])
            inside &= ~has_mark[kk]
            if inside.any():
                last = np.full(len(s_s), np.iinfo(np.int64).min, np.int64)
                np.maximum.at(last, kk[inside], self.h_end[node[inside]])
                got = np.zeros(len(s_s), bool)
                got[kk[inside]] = True
                starts.append(s_s[got])
                ends.append(np.minimum(last[got], s_e[got]))
        c_s, c_e = iv.union(np.concatenate(starts), np.concatenate(ends))
        return iv.intersect(c_s, c_e, s_s, s_e)

    @cached_property
    def optimizer_intervals(self) -> tuple[np.ndarray, np.ndarray]:
        """The optimizer's own time on the host: ``Optimizer.step`` ranges (all threads merged) less the
        closure they ran (``closure_intervals``)."""
        opt = self.is_optimizer_step
        s, e = iv.union(self.h_ts[opt], self.h_end[opt])
        return iv.subtract(s, e, *self.closure_intervals)

    @cached_property
    def is_blocking_call(self) -> np.ndarray:
        """Runtime calls that block the host: stream/device/event syncs, synchronous copies,
        and async copies to or from pageable memory (CUDA stages them through a pinned
        buffer and returns only when the host side is done)."""
        m = self.is_runtime & self.host_is(self.names.blocking_call)
        pageable = self.is_activity & self.dev_is(self.names.pageable_copy)
        calls = self.dev_launch[pageable]
        m[calls[calls >= 0]] = True
        return m

    @cached_property
    def is_launch_call(self) -> np.ndarray:
        return self.is_runtime & self.host_is(self.names.launch_call)

    @cached_property
    def is_enqueue_call(self) -> np.ndarray:
        """Runtime calls that put work on a stream (launches, async copies and sets)."""
        n = self.names
        return self.is_runtime & self.host_is(n.launch_call | n.async_copy_call)

    # --- device masks -------------------------------------------------------------------------
    @cached_property
    def is_activity(self) -> np.ndarray:
        """Kernels, memcpys and memsets: what makes a GPU busy."""
        return self.d_kind != DeviceKind.ANNOTATION

    @cached_property
    def is_kernel(self) -> np.ndarray:
        return self.d_kind == DeviceKind.KERNEL

    @cached_property
    def devices(self) -> list[int]:
        """Devices with GPU activity, sorted."""
        return sorted(int(x) for x in np.unique(self.d_device[self.is_activity]))

    @cached_property
    def primary_device(self) -> int | None:
        """The device busiest over its span: the most time with GPU activity (the union of its
        kernels, memcpys and memsets, ``DeviceUtilization.busy_ns_span``), the lowest index on
        ties; the one a single-GPU trace is about, and the one ``model.selectors.busiest_device``
        picks once the utilization is measured."""
        totals = {d: iv.total(*self.busy_set(d)[:2]) for d in self.devices}
        return max(totals, key=lambda k: totals[k]) if totals else None

    def busy_set(self, device: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The union of the kernel/memcpy/memset intervals of ``device`` (starts, ends) and the
        device-event index that starts each merged interval (the earliest); computed once per
        device, as several passes read it."""
        got = self._busy_sets.get(device)
        if got is None:
            idx = self.activity(device)
            s, e, first = iv.union(self.d_ts[idx], self.d_end[idx], with_first=True)
            got = self._busy_sets[device] = (s, e, idx[first])
        return got

    # --- correlation ----------------------------------------------------------------------------
    @cached_property
    def _runtime_by_corr(self) -> tuple[np.ndarray, np.ndarray]:
        return _sorted_keys(self.h_corr, self.is_runtime)

    def runtime_of(self, corr: np.ndarray) -> np.ndarray:
        """Host index of the runtime call with each correlation id (-1 when absent)."""
        return _lookup(*self._runtime_by_corr, corr)

    @cached_property
    def dev_launch(self) -> np.ndarray:
        """For each device event, the host index of its runtime call (-1 when unknown)."""
        return self.runtime_of(self.d_corr)

    @cached_property
    def _ops_by_ext(self) -> tuple[np.ndarray, np.ndarray]:
        return _sorted_keys(self.h_ext, self.is_cpu_op)

    def op_of_external(self, ext: np.ndarray) -> np.ndarray:
        """Host index of the cpu_op with each external id (-1 when absent)."""
        return _lookup(*self._ops_by_ext, ext)

    @cached_property
    def _eligible_ops(self) -> Lookup:
        return Lookup(self, self.is_cpu_op & self.host_is(self.names.fp32_eligible_op))

    def eligible_op_of(self, didx: np.ndarray) -> np.ndarray:
        """For device events ``didx``: the host index of the Tensor-Core-eligible op (matmul, linear,
        convolution, attention) that launched each, -1 where none did. By the kernel's external id;
        else (PyTorch 1.x traces, whose kernels carry only their correlation id) the outermost eligible
        op enclosing its launch call on the launch's thread."""
        op = self.op_of_external(self.d_ext[didx]) if len(didx) else np.zeros(0, np.int64)
        ok = op >= 0
        op = np.where(ok, op, -1)
        if len(op):
            op[ok] = np.where(self.host_is(self.names.fp32_eligible_op)[op[ok]], op[ok], -1)
        miss = np.flatnonzero(~ok)
        look = self._eligible_ops
        if len(miss) and len(look):
            launch = self.dev_launch[didx[miss]]
            has = launch >= 0
            q = miss[has]
            li = launch[has]
            pos = look.outermost(self.h_ts[li], self.h_end[li], self.h_thread[li].astype(np.int64))
            found = pos >= 0
            op[q[found]] = look.idx[pos[found]]
        return op

    # --- windows --------------------------------------------------------------------------------
    @cached_property
    def trace_bounds(self) -> tuple[int, int]:
        """First start and last end over every host and device event."""
        lo, hi = [], []
        if len(self.h_ts):
            lo.append(int(self.h_ts.min()))
            hi.append(int(self.h_end.max()))
        if len(self.d_ts):
            lo.append(int(self.d_ts.min()))
            hi.append(int(self.d_end.max()))
        if not lo:
            return 0, 0
        return min(lo), max(hi)

    @cached_property
    def step_events(self) -> np.ndarray:
        """Host indices of ProfilerStep#N ranges (CPU side), sorted by start."""
        m = (self.is_annotation | self.is_cpu_op) & self.host_is(self.names.profiler_step)
        idx = np.flatnonzero(m)
        return idx[np.argsort(self.h_ts[idx], kind="stable")]

    @cached_property
    def windows(self) -> Windows:
        return step_windows(self)

    def activity(self, device: int | None = None, kinds: tuple[int, ...] | None = None) -> np.ndarray:
        m = self.is_activity.copy()
        if device is not None:
            m &= self.d_device == device
        if kinds is not None:
            km = np.zeros(len(m), bool)
            for k in kinds:
                km |= self.d_kind == k
            m &= km
        return np.flatnonzero(m)


def step_windows(view: TraceView) -> Windows:
    """ProfilerStep#N windows (one per marker, deduplicated), or the whole trace."""
    lo, hi = view.trace_bounds
    steps: list[StepWindow] = []
    seen: set[tuple[int, int]] = set()
    for i in view.step_events.tolist():
        n = profiler_step_number(view.tl.names[view.h_name[i]])
        if n is None:
            continue
        s, e = int(view.h_ts[i]), int(view.h_end[i])
        if (n, s) in seen or e <= s:
            continue
        seen.add((n, s))
        steps.append(StepWindow(step=n, start_ns=s, end_ns=e))
    # ProfilerStep ranges never overlap in a real trace; if they do, clip each to the next start
    for k in range(len(steps) - 1):
        if steps[k].end_ns > steps[k + 1].start_ns:
            steps[k] = StepWindow(steps[k].step, steps[k].start_ns, max(steps[k].start_ns, steps[k + 1].start_ns))
    steps = [s for s in steps if s.end_ns > s.start_ns]
    if steps:
        return Windows(
            steps=tuple(steps),
            starts=np.array([s.start_ns for s in steps], np.int64),
            ends=np.array([s.end_ns for s in steps], np.int64),
            numbers=np.array([s.step for s in steps], np.int64),
            from_steps=True,
            trace_start=lo,
            trace_end=hi,
        )
    return Windows(
        steps=(),
        starts=np.array([lo], np.int64),
        ends=np.array([hi], np.int64),
        numbers=np.array([0], np.int64),
        from_steps=False,
        trace_start=lo,
        trace_end=hi,
    )


class Lookup:
    """Host events of one kind, sorted by start, for "which ones overlap / enclose [a, b]"
    queries that stay cheap on large traces (a window on the start times, plus the few
    long events checked directly)."""

    LONG_NS = 5_000_000

    def __init__(self, view: TraceView, mask: np.ndarray) -> None:
        idx = np.flatnonzero(mask)
        order = np.argsort(view.h_ts[idx], kind="stable")
        self.view = view
        self.idx = idx[order]
        self.ts = view.h_ts[self.idx]
        self.end = view.h_end[self.idx]
        self.long = np.flatnonzero((self.end - self.ts) > self.LONG_NS)

    def __len__(self) -> int:
        return len(self.idx)

    def _candidates(self, a: int, b: int) -> np.ndarray:
        lo = int(np.searchsorted(self.ts, a - self.LONG_NS, side="left"))
        hi = int(np.searchsorted(self.ts, b, side="right"))
        cand = np.arange(lo, hi)
        if len(self.long):
            extra = self.long[(self.long < lo) & (self.ts[self.long] <= b)]
            if len(extra):
                cand = np.concatenate((extra, cand))
        return cand

    def overlapping(self, a: int, b: int) -> np.ndarray:
        """Positions (into this lookup) of events meeting ``[a, b]``."""
        c = self._candidates(a, b)
        return c[(self.end[c] >= a) & (self.ts[c] <= b)]

    def enclosing(self, a: int, b: int, thread: int | None = None) -> np.ndarray:
        """Positions of events that contain ``[a, b]``, outermost first."""
        c = self._candidates(a, b)
        c = c[(self.ts[c] <= a) & (self.end[c] >= b)]
        if thread is not None and len(c):
            c = c[self.view.h_thread[self.idx[c]] == thread]
        return c[np.lexsort((-self.end[c], self.ts[c]))] if len(c) else c

    def outermost(self, a: np.ndarray, b: np.ndarray, thread: np.ndarray) -> np.ndarray:
        """For each ``[a_i, b_i]`` on ``thread_i``: the position of the event that
        ``enclosing(a_i, b_i, thread_i)`` lists first (the earliest start, then the longest),
        -1 where none encloses it. Vectorized: per thread, in nesting order, the first event
        whose running maximum of ends reaches ``b_i`` is the only candidate."""
        out = np.full(len(a), -1, np.int64)
        if not len(self.idx) or not len(a):
            return out
        th = self.view.h_thread[self.idx]
        order = iv.nesting_order(self.ts, self.end, th)
        th_s, ts_s, end_s = th[order], self.ts[order], self.end[order]
        cuts = np.r_[np.flatnonzero(np.r_[True, th_s[1:] != th_s[:-1]]), len(order)]
        for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
            q = np.flatnonzero(thread == th_s[lo])
            if not len(q):
                continue
            k = np.searchsorted(np.maximum.accumulate(end_s[lo:hi]), b[q], side="left")
            kk = np.minimum(k, hi - lo - 1)
            ok = (k < hi - lo) & (ts_s[lo:hi][kk] <= a[q])
            out[q[ok]] = order[lo + kk[ok]]
        return out

    def name(self, pos: int) -> str:
        return self.view.tl.names[self.view.h_name[self.idx[pos]]]


def _sorted_keys(column: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The set values of ``column`` where ``mask`` holds, sorted, with their host indices."""
    idx = np.flatnonzero(mask & (column != NO_VALUE))
    keys = column[idx]
    order = np.argsort(keys, kind="stable")
    return keys[order], idx[order]


def _lookup(keys: np.ndarray, idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each value, the index stored with the equal key (-1 when there is none)."""
    values = np.asarray(values, dtype=np.int64)
    if len(keys) == 0:
        return np.full(np.shape(values), -1, np.int64)
    pos = np.searchsorted(keys, values)
    pos_c = np.minimum(pos, len(keys) - 1)
    hit = (pos < len(keys)) & (keys[pos_c] == values) & (values != NO_VALUE)
    return np.where(hit, idx[pos_c], -1)
