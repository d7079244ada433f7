"""The accounting window and the ledgers the findings claim from, computed once per diagnosis (docs/account.md,
"The accounting window"; DESIGN.md, "One account of the step" and "The run's figures").

A process (rank) may have several traces: a profiler schedule that repeats writes one per cycle, and the first
window records stacks and shapes, which weigh on the steps. The account is charged on the windows recorded
without them (``accounting_traces``); the findings that need the ops' shapes or Python frames read the detailed
ones (``detail_traces``, ``detail_of``). ``run_accounting`` makes, per (rank, ``LedgerBasis``):

- the process's account (``Accounting.trace_ledger``): its accounting traces' ledgers together, their kernel
  time split as a detailed window's shapes split it (``analysis.weight.split_like``), weighed against the
  unprofiled steps (``analysis.weight.reweigh``);
- the ledger a finding claims its share of step time from (``Accounting.ledger``): that account on a GPU
  trace, the data wait of the account's steps with the rest split as the trace splits it on a CPU-only one.

The rules read them through ``RuleContext``, the engine's summary and the account through the same. Nothing is
computed later: the ledgers are plain values of a frozen object.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from gpudoctor.analysis.figures import RunFigures
from gpudoctor.analysis.ledger import combine, steps_ledger
from gpudoctor.analysis.weight import reweigh, split_like
from gpudoctor.model import steady
from gpudoctor.model.findings import RunData, TimeRange
from gpudoctor.model.metrics import GapCause, Ledger, LedgerBasis, TraceMetrics, Window, WindowKind
from gpudoctor.model.run import StepRecord
from gpudoctor.model.selectors import busiest_device, primary_trace, trace_label

__all__ = ["Accounting", "accounting_traces", "detail_of", "detail_traces", "gap_ranges", "ns_on_ledger",
           "recorded_steps", "run_accounting", "trace_idle", "trace_window", "window_label"]

LedgerKey = tuple[int | None, LedgerBasis]  # (rank, the basis of its trace's ledger)


# --------------------------------------------------------------------------- which traces

def accounting_traces(metrics: Sequence[TraceMetrics]) -> tuple[TraceMetrics, ...]:
    """The traces the account is charged on: of each process (rank), those recorded without stacks or shapes
    where it has one (the profiler weighs least there: DESIGN.md, "One account of the step"), else all of its
    traces. The others are the detailed windows, which the findings that need shapes or stacks read."""
    out: list[TraceMetrics] = []
    for rank in dict.fromkeys(m.rank for m in metrics):
        mine = [m for m in metrics if m.rank == rank]
        plain = [m for m in mine if m.ledger is not None and not (m.has_stacks or m.has_shapes)]
        out.extend(plain or mine)
    return tuple(out)


def detail_traces(metrics: Sequence[TraceMetrics], need: str) -> tuple[TraceMetrics, ...]:
    """Of each process (rank), its traces recorded with ``need`` ("shapes": the ops' input types and sizes;
    "stacks": Python frames) where it has one, else its accounting traces."""
    out: list[TraceMetrics] = []
    plain = accounting_traces(metrics)
    for rank in dict.fromkeys(m.rank for m in metrics):
        mine = [m for m in metrics if m.rank == rank]
        have = [m for m in mine if (m.has_shapes if need == "shapes" else m.has_stacks)]
        out.extend(have or [m for m in plain if m.rank == rank])
    return tuple(out)


def detail_of(metrics: Sequence[TraceMetrics], m: TraceMetrics, need: str) -> TraceMetrics | None:
    """The trace of ``m``'s process recorded with ``need`` ("shapes", "stacks"): ``m`` itself when it has it,
    else the first such trace of the same rank (None: none has)."""
    has = (lambda x: x.has_shapes) if need == "shapes" else (lambda x: x.has_stacks)
    if has(m):
        return m
    return next((x for x in metrics if x.rank == m.rank and has(x)), None)


def recorded_steps(steps: Sequence[StepRecord], traces: Sequence[TraceMetrics]) -> tuple[StepRecord, ...]:
    """The step records of the steps ``traces`` recorded (their ``ProfilerStep#N`` = the record's index, of the
    same rank); none where the numbers do not match gpudoctor's own windows (a record outside torch.profiler's
    active steps: a profiler of the script's own numbers its steps)."""
    nums = {(m.rank, w.step) for m in traces for w in m.steps}
    out = tuple(s for s in steps
                if (s.rank, s.index) in nums or (s.rank is None and (None, s.index) in nums)
                or (s.rank is not None and any(r is None and n == s.index for r, n in nums)))
    return out if out and all(s.window == "active" for s in out) else ()


# --------------------------------------------------------------------------- a trace's windows

def trace_window(m: TraceMetrics) -> Window | None:
    """The window step-time percentages of a trace are of: the ProfilerStep windows when present, else the
    first-to-last GPU activity span, else the whole trace."""
    u = busiest_device(m)
    if u is not None and u.steps_window is not None and u.steps_window.dur_ns > 0:
        return u.steps_window
    for w in m.windows:
        if w.kind == WindowKind.STEPS and w.dur_ns > 0:
            return w
    if u is not None and u.span.dur_ns > 0:
        return u.span
    for kind in (WindowKind.SPAN, WindowKind.TRACE):
        for w in m.windows:
            if w.kind == kind and w.dur_ns > 0:
                return w
    if m.cpu is not None and m.cpu.window.dur_ns > 0:
        return m.cpu.window
    return None


def window_label(w: Window | None) -> str:
    if w is None:
        return "?"
    if w.kind == WindowKind.STEPS:
        return "steps"
    if w.kind == WindowKind.SPAN:
        return "span (first to last GPU activity)"
    return w.kind.value


def trace_idle(m: TraceMetrics) -> tuple[float | None, str]:
    """GPU idle % of a trace's busiest device and the window it is of (steps when present, else span)."""
    u = busiest_device(m)
    if u is None:
        return None, ""
    if u.idle_pct_steps is not None:
        return u.idle_pct_steps, "steps"
    return u.idle_pct_span, "span"


def gap_ranges(m: TraceMetrics, *causes: GapCause, limit: int = 5) -> tuple[TimeRange, ...]:
    """The longest idle gaps of a trace's busiest device (of ``causes``; any without), as time ranges."""
    u = busiest_device(m)
    if u is None:
        return ()
    gaps = [g for g in u.top_gaps if not causes or g.cause in causes]
    gaps.sort(key=lambda g: (g.start_ns - g.end_ns, g.start_ns))
    return tuple(
        TimeRange(g.start_ns, g.end_ns, f"idle gap ({g.cause.value}{': ' + g.detail if g.detail else ''})")
        for g in gaps[:limit]
    )


def ns_on_ledger(m: TraceMetrics, ns: int, ledger: Ledger | None) -> int:
    """``ns`` measured over ``m``'s windows, in the terms of ``ledger`` (its process's account, which may hold
    other windows, or be scaled to the unprofiled step): as much per window on a GPU ledger (the device's work
    per step does not depend on the window), the same share of the windows' time on a ledger of steps. ``ns``
    itself where ``ledger`` is ``m``'s own, unscaled."""
    if ledger is None or m.ledger is None or not m.ledger.windows or not m.ledger.total_ns:
        return ns
    if ledger.key == m.ledger.key and not (ledger.weight is not None and ledger.weight.scaled):
        return ns
    if ledger.basis == LedgerBasis.GPU:
        return int(round(ns * ledger.windows / m.ledger.windows))
    return int(round(ns * ledger.total_ns / m.ledger.total_ns))


# --------------------------------------------------------------------------- the account

@dataclass(frozen=True, slots=True)
class Accounting:
    """The accounting traces and the ledgers of a run, by (rank, basis), made once by ``run_accounting``."""

    traces: tuple[TraceMetrics, ...]  # the accounting traces, process by process (``accounting_traces``)
    accounts: Mapping[LedgerKey, Ledger]  # each process's account, its traces' ledger of that basis together
    claimed: Mapping[LedgerKey, Ledger]  # the ledger a finding of a trace claims from (``ledger``)
    steps_only: Ledger | None  # without a trace with a ledger: the account's steps' own (None: no steps either)

    def primary_trace(self, rank: int | None = None) -> TraceMetrics | None:
        """The trace a rank's account comes from: its first accounting trace with GPU activity, else its first
        (rank 0, or the lowest, when ``rank`` is None), of those with a ledger (``model.selectors.primary_trace``)."""
        return primary_trace(self.traces, rank, with_ledger=True)

    def trace_ledger(self, m: TraceMetrics) -> Ledger | None:
        """The account of ``m``'s process, whichever of its traces ``m`` is (None: ``m`` has no ledger)."""
        return None if m.ledger is None else self.accounts.get((m.rank, m.ledger.basis))

    def ledger(self, m: TraceMetrics | None = None) -> Ledger | None:
        """The ledger a finding claims its share of step time from: a GPU trace's (what the GPU waited on is
        only in the trace), its process's account (``trace_ledger``); a CPU trace's, with the data wait of the
        account's steps where the run has per-step records; ``m`` None: the primary trace's, and without a
        trace, the account's steps' own."""
        if m is None:
            m = self.primary_trace()
            if m is None:
                return self.steps_only
        return None if m.ledger is None else self.claimed.get((m.rank, m.ledger.basis))

    def account_of(self, m: TraceMetrics) -> Ledger | None:
        """The GPU account of ``m``'s process where it is not ``m``'s own windows as recorded (another trace is
        the accounting window, several are, or the account is scaled to the unprofiled step); None where it is
        (a figure of ``m`` is then a figure of the account)."""
        if m.ledger is None or m.ledger.basis != LedgerBasis.GPU:
            return None
        led = self.trace_ledger(m)
        if led is None or led.total_ns <= 0:
            return None
        if led.key != m.ledger.key or (led.weight is not None and led.weight.scaled):
            return led
        return None

    def trace_share(self, m: TraceMetrics, ns: int) -> float | None:
        """``ns`` measured over ``m``'s windows as a share of step time: of ``m``'s own window, or, where the
        account of its process is not ``m``'s windows alone (``account_of``), of the account's step, per window
        (``ns_on_ledger``)."""
        led = self.account_of(m)
        if led is not None:
            return 100.0 * ns_on_ledger(m, ns, led) / led.total_ns
        w = trace_window(m)
        return 100.0 * ns / w.dur_ns if w is not None and w.dur_ns > 0 else None

    def account_idle(self, m: TraceMetrics) -> tuple[float | None, str]:
        """GPU idle % of a trace (``trace_idle``), or, where the account of its process is not its own windows
        alone (``account_of``), the account's."""
        led = self.account_of(m) if busiest_device(m) is not None else None
        if led is not None:
            return led.idle_pct, "steps"
        return trace_idle(m)


def _process_ledger(run: RunData, figures: RunFigures, traces: Sequence[TraceMetrics], m: TraceMetrics,
                    max_ratio: float) -> Ledger:
    """The account of ``m``'s process: its accounting traces of ``m``'s kind (GPU or CPU-only) together, since a
    profiler schedule that repeats writes one trace per cycle; their kernel time split as a detailed window's
    shapes split it; with the weight of their recorded steps against the unprofiled ones, the host-side work
    scaled to the unprofiled step above ``max_ratio`` (``Thresholds.profiler_weight_max_ratio``)."""
    assert m.ledger is not None
    pool = [x for x in traces if x.ledger is not None and x.rank == m.rank and x.ledger.basis == m.ledger.basis]
    pool = pool or [m]
    led = combine([x.ledger for x in pool if x.ledger is not None]) if len(pool) > 1 else pool[0].ledger
    assert led is not None
    others = [x for x in run.metrics if x.rank == m.rank and x.ledger is not None and all(x is not y for y in pool)]
    if others:
        shaped = next((x for x in others if x.has_shapes and x.ledger is not None
                       and x.ledger.basis == led.basis), None)
        if shaped is not None and shaped.ledger is not None:
            led = split_like(led, shaped.ledger, trace_label(shaped))
        if not any(x.has_stacks or x.has_shapes for x in pool):  # the timings-only window(s)
            led = replace(led, window=f"{led.window}, timings only (shapes and stacks: "
                                      f"{', '.join(trace_label(x) for x in others)})")
    weight = steady.window_weight(recorded_steps(run.steps, pool), figures.of(m.rank).unprofiled)
    return reweigh(led, weight, max_ratio)


def _steps_label(figures: RunFigures, rank: int | None) -> str:
    """What the account's steps are, as a ledger's window names them: "unprofiled" where instrumented steps were
    left out."""
    return "unprofiled steady step" if figures.of(rank).account_is_unprofiled else "steady step"


def _claimed(figures: RunFigures, rank: int | None, account: Ledger) -> Ledger:
    """The ledger a finding claims from, of a process whose account is ``account``: the account itself on a GPU
    trace; on a CPU-only one, the data wait of the account's steps, the rest split as the trace splits it."""
    if account.basis == LedgerBasis.GPU:
        return account
    steps = figures.of(rank).account
    if steps:
        got = steps_ledger(steps, account, rank=rank, label_steps=_steps_label(figures, rank))
        if got is not None:
            return replace(got, weight=account.weight)
    return account


def run_accounting(run: RunData, figures: RunFigures, max_ratio: float) -> Accounting:
    """The accounting window and the ledgers of ``run``, computed once (``RuleContext`` keeps them for the
    diagnosis). A process without an accounting trace of some basis is accounted on its first trace of it."""
    traces = accounting_traces(run.metrics)
    accounts: dict[LedgerKey, Ledger] = {}
    claimed: dict[LedgerKey, Ledger] = {}
    for m in run.metrics:
        if m.ledger is None or (m.rank, m.ledger.basis) in accounts:
            continue
        key = (m.rank, m.ledger.basis)
        accounts[key] = _process_ledger(run, figures, traces, m, max_ratio)
        claimed[key] = _claimed(figures, m.rank, accounts[key])
    steps_only = None
    if primary_trace(traces, None, with_ledger=True) is None:
        steps = figures.of(None).account
        steps_only = steps_ledger(steps, label_steps=_steps_label(figures, None)) if steps else None
    return Accounting(traces, MappingProxyType(accounts), MappingProxyType(claimed), steps_only)
