# Why this file is long: RuleContext is the one object every rule reads its figures through, so that one
# figure has one value in every finding: the steps, the trace windows, the ledger a finding claims from and
# the accounting window that ledger is charged on (which traces, which steps, the profiler's weight: docs/
# account.md) live together. Split the accounting window into its own module if it grows again.
"""What a rule reads (``RuleContext``) and what it returns (``RuleResult``).

A rule's ``check(ctx)`` returns a ``RuleResult``: its findings and a verdict for
the checklist. The verdict is one of

- ``FIRED``: it found something; the findings say what;
- ``FINE``: it looked at the evidence and found nothing to fix (the reason says
  what it looked at, with the numbers); ``applied=True`` when what it looked at is
  positive evidence that the technique is in use (the setting was read, the trace
  shows it), so the checklist may say "applied" rather than "no problem seen";
- ``NOT_APPLICABLE``: the technique does not apply to this run (a CPU run for a
  GPU-only setting, one epoch for a per-epoch cost, …);
- ``CANNOT_JUDGE``: the evidence it needs is missing ("no GPU in this run",
  "no stacks recorded", "no per-step records: analyse a run directory"); a rule
  never guesses silently.

``RuleContext`` bundles the run, one ``TraceMetrics`` per trace (rank), the
thresholds, the run's figures (``figures``: the step populations and the step time,
computed once per diagnosis by ``analysis.figures``), and the helpers every rule shares:
"share of step time", the severity scale, locations and setting references, and merging
the per-rank results of a multi-trace run into one finding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from gpudoctor.analysis.figures import RunFigures, run_figures
from gpudoctor.analysis.ledger import combine, steps_ledger
from gpudoctor.analysis.weight import reweigh, split_like
from gpudoctor.config import Thresholds
from gpudoctor.model import steady
from gpudoctor.model.findings import (
    Claim,
    Confidence,
    Evidence,
    Finding,
    Fix,
    Gain,
    Location,
    Metric,
    RunData,
    SettingRef,
    Severity,
    TimeRange,
)
from gpudoctor.model.metrics import (
    Component,
    DeviceUtilization,
    GapCause,
    Ledger,
    LedgerBasis,
    TraceMetrics,
    Window,
    WindowKind,
)
from gpudoctor.model.run import CallSite, DataLoaderSetting, StepRecord
from gpudoctor.model.selectors import busiest_device, primary_trace
from gpudoctor.model.settle import Settling
from gpudoctor.model.steady import median_int  # noqa: F401 - re-exported to the rules
from gpudoctor.model.units import duration_text, pct_text, size_text


class Verdict(str, Enum):
    FIRED = "fired"
    FINE = "fine"
    NOT_APPLICABLE = "not_applicable"
    CANNOT_JUDGE = "cannot_judge"


# When several traces (ranks) give different verdicts, the combined verdict is the
# most informative one: something fired > looked and fine > does not apply > cannot judge.
_VERDICT_ORDER = {Verdict.FIRED: 0, Verdict.FINE: 1, Verdict.NOT_APPLICABLE: 2, Verdict.CANNOT_JUDGE: 3}


@dataclass(frozen=True, slots=True)
class RuleResult:
    verdict: Verdict
    reason: str  # one line: what was looked at and what it showed, or what is missing
    findings: tuple[Finding, ...] = ()
    applied: bool = False  # FINE, and the evidence shows the technique in use (checklist: "applied")

    @staticmethod
    def fired(findings: Finding | Sequence[Finding], reason: str = "") -> RuleResult:
        fs = (findings,) if isinstance(findings, Finding) else tuple(findings)
        if not fs:
            raise ValueError("a fired result needs at least one finding")
        return RuleResult(Verdict.FIRED, reason or fs[0].message, fs)

    @staticmethod
    def fine(reason: str, *, applied: bool = False) -> RuleResult:
        """Looked and found nothing to fix; ``applied``: the evidence shows the technique in use."""
        return RuleResult(Verdict.FINE, reason, applied=applied)

    @staticmethod
    def not_applicable(reason: str) -> RuleResult:
        return RuleResult(Verdict.NOT_APPLICABLE, reason)

    @staticmethod
    def cannot_judge(reason: str) -> RuleResult:
        return RuleResult(Verdict.CANNOT_JUDGE, reason)


# --------------------------------------------------------------------------- formatting


def fmt_ns(ns: float | int | None) -> str:
    """A duration for a message: 850 ns, 12.3 µs, 4.56 ms, 1.23 s (``gpudoctor.model.units``)."""
    return duration_text(ns, "?", precise=True)


def fmt_bytes(n: float | int | None) -> str:
    """Bytes in binary units, as every report prints them (``gpudoctor.model.units``)."""
    return size_text(n, missing="?")


def fmt_pct(p: float | None) -> str:
    """A share for a message: 38.0% (``gpudoctor.model.units``)."""
    return pct_text(p, "?")


def location_of(site: CallSite | None) -> Location | None:
    return None if site is None else Location(file=site.file, line=site.line, function=site.function)


def trace_label(m: TraceMetrics) -> str:
    """How a message names a trace: "rank 3" in multi-rank jobs, else the file name."""
    if m.rank is not None:
        return f"rank {m.rank}"
    return m.path.replace("\\", "/").rsplit("/", 1)[-1]


# --------------------------------------------------------------------------- the context


@dataclass(frozen=True, slots=True)
class RuleContext:
    run: RunData
    thresholds: Thresholds = field(default_factory=Thresholds)
    code: str = ""  # the rule being run (set by the engine through ``for_rule``)
    name: str = ""
    # the accounting ledgers, made once per run (``trace_ledger``): every rule's copy (``for_rule``) shares it
    _ledgers: dict = field(default_factory=dict, compare=False, repr=False)
    # the run's figures (``analysis.figures.run_figures``), made once per run on first use and shared likewise
    _figures: list = field(default_factory=list, compare=False, repr=False)
    # what the script's source says of the DataLoader at a call site (``engine.loader_source_of``: the loop
    # that changes its dataset in place, and whether at every step); None: the source is not read
    loader_source: Callable[[CallSite], tuple[str, bool] | None] | None = field(default=None, compare=False,
                                                                              repr=False)

    # ---------------------------------------------------------------- basics

    def for_rule(self, code: str, name: str) -> RuleContext:
        return replace(self, code=code, name=name)

    @property
    def figures(self) -> RunFigures:
        """The run's figures (step populations, the step time, the data wait, phases), computed once per
        diagnosis: every rule, the summary and the account read them here, none recomputes them."""
        if not self._figures:
            self._figures.append(run_figures(self.run, self.thresholds))
        return self._figures[0]

    @property
    def metrics(self) -> tuple[TraceMetrics, ...]:
        return self.run.metrics

    @property
    def settings(self):
        return self.run.settings

    @property
    def manifest(self):
        return self.run.manifest

    def workers_caveat(self, dl: DataLoaderSetting | None) -> tuple[str, bool] | None:
        """Why a DataLoader fix must not keep workers alive across epochs (``persistent_workers=True``):
        (the reason, and whether workers themselves would break the script). The script passed
        persistent_workers itself (its choice, never overridden); its loop changes the dataset in place
        (a worker holds its own copy: a persistent one never sees an epoch's change, none sees a change made
        at every step), as its source says where the source is at hand. None: nothing against it."""
        if dl is None:
            return None
        if dl.passed_args is not None and "persistent_workers" in dl.passed_args:
            return (f"the DataLoader passes persistent_workers itself ({dl.persistent_workers}): the script's "
                    "choice, left to its author"), False
        if self.loader_source is None or dl.call_site is None:
            return None
        changed = self.loader_source(dl.call_site)
        if changed is None:
            return None
        where, per_step = changed
        if per_step:
            return f"{where}: a worker holds its own copy of the dataset and would not see the change", True
        return f"{where}: persistent workers would keep their first copy of the dataset and load stale data", False

    def gpu_traces(self) -> tuple[TraceMetrics, ...]:
        return tuple(m for m in self.metrics if m.has_gpu_activity)

    def has_gpu(self) -> bool:
        """GPU work seen in a trace, or the run used a CUDA device."""
        if self.gpu_traces():
            return True
        s = self.settings
        if s is not None and s.device_type not in ("cpu", ""):
            return True
        return any(g.util_pct is not None for g in self.samples_gpu())

    def no_gpu_reason(self) -> str:
        """Why there is no GPU evidence, in the user's terms."""
        if self.manifest is not None:
            r = self.manifest.not_collected_reason("cuda")
            if r:
                return r
            if not self.manifest.devices:
                return "no GPU in this run"
        if self.metrics:
            return "no GPU activity in the trace"
        return "no GPU in this run"

    def samples_gpu(self):
        return self.run.samples.gpu if self.run.samples else ()

    def samples_process(self, role: str | None = None):
        ps = self.run.samples.process if self.run.samples else ()
        return tuple(p for p in ps if role is None or p.role == role)

    def main_cpu_pct(self) -> tuple[float | None, int, str]:
        """The training process's CPU (% of one core), median of its psutil samples taken while
        the steps ran (every sample when none did, or the run has no steps), how many samples, and
        which ("while the steps ran" or "over the run"): the one figure the summary and every rule
        print as the training process's CPU."""
        host = self.figures.host
        return host.main_cpu_pct, host.main_cpu_samples, host.main_cpu_when

    def cpu_count(self) -> int | None:
        """Cores available to the training process (settings, then manifest, then samples: the run's figures)."""
        return self.figures.host.cpu_count

    def device_cc(self) -> tuple[str, float | None]:
        """Name and compute capability of the (first) GPU, from the trace or the manifest."""
        for m in self.metrics:
            for d in m.devices:
                if d.compute_capability:
                    return d.name, _cc(d.compute_capability)
        if self.manifest is not None:
            for d in self.manifest.devices:
                if d.compute_capability:
                    return d.name, _cc(d.compute_capability)
        for m in self.metrics:
            for d in m.devices:
                return d.name, None
        return "", None

    def device_total_bytes(self) -> int | None:
        for m in self.metrics:
            for mem in m.memory:
                if mem.total_bytes:
                    return mem.total_bytes
            for d in m.devices:
                if d.total_memory_bytes:
                    return d.total_memory_bytes
        if self.manifest is not None:
            for d in self.manifest.devices:
                if d.total_memory_bytes:
                    return d.total_memory_bytes
        for g in self.samples_gpu():
            if g.mem_total_bytes:
                return g.mem_total_bytes
        return None

    # ---------------------------------------------------------------- steps (run directory)

    def steps(self) -> tuple[StepRecord, ...]:
        return self.run.steps

    def marked_steps(self) -> tuple[StepRecord, ...]:
        """The steps of the marker that defines the run (``RunFigures``: ``model.steady.marked_steps``)."""
        return self.figures.job.marked

    def steady_steps(self) -> tuple[StepRecord, ...]:
        """The steady steps of every rank (``RunFigures``: ``model.steady.steady_steps``, the one definition
        the report and the stderr line of ``gpudoctor profile`` share)."""
        return self.figures.job.steady

    def settling(self) -> Settling | None:
        """Where the run's step time changed beyond noise (``RunFigures.settling``): the steady steps
        are the settled part's, and the summary and the account say so. None where it held steady."""
        return self.figures.settling

    def share_of_steps(self, ns: int, steps: Sequence[StepRecord] | None = None) -> float | None:
        """``ns`` as a percentage of the total wall time of ``steps`` (default: steady steps)."""
        steps = self.steady_steps() if steps is None else steps
        total = sum(s.wall_ns for s in steps)
        return 100.0 * ns / total if total > 0 else None

    def phase_shares_pct(self) -> dict[str, float | None] | None:
        """Share of step time (steady steps) in each phase gpudoctor's hooks timed on the host
        (``RunFigures``); None when the steps carry no phase times (a run recorded before they existed)."""
        return self.figures.job.phases

    def micro_batches(self) -> int | None:
        """Micro-batches (backward() calls) per optimizer step, median over the steady steps;
        None when the steps are not optimizer steps or do not say (``RunFigures``)."""
        return self.figures.job.micro_batches

    def data_wait_share_pct(self) -> float | None:
        """Time the loop waited for the next batch, % of the wall time of the steps the run's figures are
        of (``account_steps``: the unprofiled steady steps where there are enough; the figure the summary
        prints as "waiting for data")."""
        return self.figures.job.step.data_wait_pct

    # ---------------------------------------------------------------- trace windows

    @staticmethod
    def util(m: TraceMetrics) -> DeviceUtilization | None:
        """The utilization of the busiest device of a trace (the one the rule judges:
        ``model.selectors.busiest_device``)."""
        return busiest_device(m)

    @staticmethod
    def window(m: TraceMetrics) -> Window | None:
        """The window step-time percentages of this trace are of: the ProfilerStep windows when
        present, else the first-to-last GPU activity span, else the whole trace."""
        u = RuleContext.util(m)
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

    @staticmethod
    def window_label(w: Window | None) -> str:
        if w is None:
            return "?"
        if w.kind == WindowKind.STEPS:
            return "steps"
        if w.kind == WindowKind.SPAN:
            return "span (first to last GPU activity)"
        return w.kind.value

    @staticmethod
    def idle(m: TraceMetrics) -> tuple[float | None, str]:
        """GPU idle % of a trace and the window it is of (steps when present, else span)."""
        u = RuleContext.util(m)
        if u is None:
            return None, ""
        if u.idle_pct_steps is not None:
            return u.idle_pct_steps, "steps"
        return u.idle_pct_span, "span"

    def account_idle(self, m: TraceMetrics) -> tuple[float | None, str]:
        """GPU idle % of a trace (``idle``), or, where the account of its process is not its own windows
        alone (``account_of``: another window, or scaled to the unprofiled step), the account's."""
        led = self.account_of(m) if RuleContext.util(m) is not None else None
        if led is not None:
            return led.idle_pct, "steps"
        return RuleContext.idle(m)

    @staticmethod
    def gap_cause_ns(m: TraceMetrics, *causes: GapCause) -> int:
        u = RuleContext.util(m)
        if u is None:
            return 0
        return sum(c.total_ns for c in u.gap_causes if c.cause in causes)

    def account_of(self, m: TraceMetrics) -> Ledger | None:
        """The GPU account of ``m``'s process where it is not ``m``'s own windows as recorded (another
        trace is the accounting window, several are, or the account is scaled to the unprofiled step);
        None where it is (a figure of ``m`` is then a figure of the account)."""
        if m.ledger is None or m.ledger.basis != LedgerBasis.GPU:
            return None
        led = self.trace_ledger(m)
        if led is None or led.total_ns <= 0:
            return None
        if led.key != m.ledger.key or (led.weight is not None and led.weight.scaled):
            return led
        return None

    def trace_share(self, m: TraceMetrics, ns: int) -> float | None:
        """``ns`` measured over ``m``'s windows as a share of step time: of ``m``'s own window, or, where
        the account of its process is not ``m``'s windows alone (``account_of``), of the account's step,
        per window (``ns_on_ledger``)."""
        led = self.account_of(m)
        if led is not None:
            return 100.0 * self.ns_on_ledger(m, ns, led) / led.total_ns
        w = self.window(m)
        return 100.0 * ns / w.dur_ns if w is not None and w.dur_ns > 0 else None

    @staticmethod
    def gap_ranges(m: TraceMetrics, *causes: GapCause, limit: int = 5) -> tuple[TimeRange, ...]:
        u = RuleContext.util(m)
        if u is None:
            return ()
        gaps = [g for g in u.top_gaps if not causes or g.cause in causes]
        gaps.sort(key=lambda g: (g.start_ns - g.end_ns, g.start_ns))
        return tuple(
            TimeRange(g.start_ns, g.end_ns, f"idle gap ({g.cause.value}{': ' + g.detail if g.detail else ''})")
            for g in gaps[:limit]
        )

    # ---------------------------------------------------------------- the ledger (docs/account.md)

    def steady_steps_of(self, rank: int | None) -> tuple[StepRecord, ...]:
        """The steady steps of one rank (of the lowest rank when ``rank`` is None; all of them when
        the records carry no rank)."""
        return self.figures.of(rank).steady

    def primary_trace(self, rank: int | None = None) -> TraceMetrics | None:
        """The trace a rank's account comes from: its first trace with GPU activity, else its first
        (rank 0, or the lowest, when ``rank`` is None), of the accounting traces with a ledger
        (``accounting_traces``, ``model.selectors.primary_trace``)."""
        return primary_trace(self.accounting_traces(), rank, with_ledger=True)

    # ---------------------------------------------------------------- the accounting window (docs/account.md)

    def unprofiled_steps(self, rank: int | None = None, *, every_rank: bool = False) -> tuple[StepRecord, ...]:
        """The steady steps (of ``rank``: ``steady_steps_of``; of every rank with ``every_rank``) that ran
        without an instrument, nor right after one (``model.steady.unprofiled_steps``): the steps a
        ``--verify`` trial run resembles."""
        fig = self.figures
        return (fig.job if every_rank else fig.of(rank)).unprofiled

    def account_steps(self, rank: int | None = None, *, every_rank: bool = False) -> tuple[StepRecord, ...]:
        """The steps the account's step-time figures are of: the unprofiled steady steps where the run has
        ``model.steady.MIN_BARE_STEPS`` of them (what ``--verify`` measures: time per step over a run that
        carries no instrument), else every steady step."""
        fig = self.figures
        return (fig.job if every_rank else fig.of(rank)).account

    def accounting_traces(self) -> tuple[TraceMetrics, ...]:
        """The traces the account is charged on: of each process (rank), those recorded without stacks
        or shapes where it has one (the profiler weighs least there: DESIGN.md, "One account of the
        step"), else all of its traces. The others are the detailed windows, which the findings that
        need shapes or stacks read (``detail_traces``)."""
        out: list[TraceMetrics] = []
        for rank in dict.fromkeys(m.rank for m in self.metrics):
            mine = [m for m in self.metrics if m.rank == rank]
            plain = [m for m in mine if m.ledger is not None and not (m.has_stacks or m.has_shapes)]
            out.extend(plain or mine)
        return tuple(out)

    def detail_traces(self, need: str) -> tuple[TraceMetrics, ...]:
        """Of each process (rank), its traces recorded with ``need`` ("shapes": the ops' input types and
        sizes; "stacks": Python frames) where it has one, else its accounting traces."""
        out: list[TraceMetrics] = []
        plain = self.accounting_traces()
        for rank in dict.fromkeys(m.rank for m in self.metrics):
            mine = [m for m in self.metrics if m.rank == rank]
            have = [m for m in mine if (m.has_shapes if need == "shapes" else m.has_stacks)]
            out.extend(have or [m for m in plain if m.rank == rank])
        return tuple(out)

    def detail_of(self, m: TraceMetrics, need: str) -> TraceMetrics | None:
        """The trace of ``m``'s process recorded with ``need`` ("shapes", "stacks"): ``m`` itself when it has
        it, else the first such trace of the same rank (None: none has)."""
        has = (lambda x: x.has_shapes) if need == "shapes" else (lambda x: x.has_stacks)
        if has(m):
            return m
        return next((x for x in self.metrics if x.rank == m.rank and has(x)), None)

    def recorded_steps(self, traces: Sequence[TraceMetrics]) -> tuple[StepRecord, ...]:
        """The run's step records of the steps ``traces`` recorded (their ``ProfilerStep#N`` = the
        record's index, of the same rank); none where the numbers do not match gpudoctor's own windows
        (a record outside torch.profiler's active steps: a profiler of the script's own numbers its steps)."""
        nums = {(m.rank, w.step) for m in traces for w in m.steps}
        out = tuple(s for s in self.run.steps
                    if (s.rank, s.index) in nums or (s.rank is None and (None, s.index) in nums)
                    or (s.rank is not None and any(r is None and n == s.index for r, n in nums)))
        return out if out and all(s.window == "active" for s in out) else ()

    def trace_ledger(self, m: TraceMetrics) -> Ledger | None:
        """The account of ``m``'s process, whichever of its traces ``m`` is: its accounting traces of the
        same kind (GPU or CPU-only) together, since a profiler schedule that repeats writes one trace per
        cycle (``accounting_traces``); their kernel time split as a detailed window's shapes split it
        (``analysis.weight.split_like``); with the weight of their recorded steps against the unprofiled
        ones, the host-side work scaled to the unprofiled step above ``profiler_weight_max_ratio``
        (``analysis.weight.reweigh``)."""
        if m.ledger is None:
            return None
        key = (m.rank, m.ledger.basis)
        if key in self._ledgers:
            return self._ledgers[key]
        pool = [x for x in self.accounting_traces()
                if x.ledger is not None and x.rank == m.rank and x.ledger.basis == m.ledger.basis]
        pool = pool or [m]
        led = combine([x.ledger for x in pool if x.ledger is not None]) if len(pool) > 1 else pool[0].ledger
        assert led is not None
        others = [x for x in self.metrics if x.rank == m.rank and x.ledger is not None and all(x is not y for y in pool)]
        if others:
            shaped = next((x for x in others if x.has_shapes and x.ledger is not None
                           and x.ledger.basis == led.basis), None)
            if shaped is not None and shaped.ledger is not None:
                led = split_like(led, shaped.ledger, trace_label(shaped))
            if not any(x.has_stacks or x.has_shapes for x in pool):  # the timings-only window(s)
                led = replace(led, window=f"{led.window}, timings only (shapes and stacks: "
                                          f"{', '.join(trace_label(x) for x in others)})")
        weight = steady.window_weight(self.recorded_steps(pool), self.unprofiled_steps(m.rank))
        led = reweigh(led, weight, self.thresholds.profiler_weight_max_ratio)
        self._ledgers[key] = led
        return led

    def ledger(self, m: TraceMetrics | None = None) -> Ledger | None:
        """The ledger a finding claims its share of step time from: a GPU trace's (what the GPU
        waited on is only in the trace), its process's accounting traces together (``trace_ledger``);
        a CPU trace's, with the data wait of the account's steps (``account_steps``) when the run has
        per-step records; without a trace (``m`` None and no trace), those steps' own."""
        if m is None:
            m = self.primary_trace()
            if m is None:
                steps = self.account_steps(None)
                return steps_ledger(steps, label_steps=self._steps_label(None)) if steps else None
        led = self.trace_ledger(m)
        if led is None or led.basis == LedgerBasis.GPU:
            return led
        steps = self.account_steps(m.rank)
        if steps:
            return replace(steps_ledger(steps, led, rank=m.rank, label_steps=self._steps_label(m.rank)),
                           weight=led.weight)
        return led

    def _steps_label(self, rank: int | None) -> str:
        """What the account's steps are, as a ledger's window names them: "unprofiled" where instrumented
        steps were left out."""
        return "unprofiled steady step" if self.figures.of(rank).account_is_unprofiled else "steady step"

    def ns_on_ledger(self, m: TraceMetrics, ns: int, ledger: Ledger | None) -> int:
        """``ns`` measured over ``m``'s windows, in the terms of ``ledger`` (its process's account, which
        may hold other windows, or be scaled to the unprofiled step): as much per window on a GPU ledger
        (the device's work per step does not depend on the window), the same share of the windows' time on
        a ledger of steps. ``ns`` itself where ``ledger`` is ``m``'s own, unscaled."""
        if ledger is None or m.ledger is None or not m.ledger.windows or not m.ledger.total_ns:
            return ns
        if ledger.key == m.ledger.key and not (ledger.weight is not None and ledger.weight.scaled):
            return ns
        if ledger.basis == LedgerBasis.GPU:
            return int(round(ns * ledger.windows / m.ledger.windows))
        return int(round(ns * ledger.total_ns / m.ledger.total_ns))

    def part_pct(self, ledger: Ledger | None, *components: Component) -> float | None:
        """The share of step time of some parts of a ledger (None without one)."""
        return ledger.pct(*components) if ledger is not None else None

    # ---------------------------------------------------------------- settings

    def main_dataloader(self) -> DataLoaderSetting | None:
        """The DataLoader the training loop iterates: most iterations started, first on ties."""
        return steady.main_dataloader(self.settings)

    # ---------------------------------------------------------------- findings

    def severity(self, share_pct: float | None) -> Severity:
        """The one severity scale: share of step time at stake (``Thresholds``)."""
        t = self.thresholds
        if share_pct is None:
            return Severity(t.unquantified_severity)
        if share_pct >= t.error_share_pct:
            return Severity.ERROR
        if share_pct >= t.warning_share_pct:
            return Severity.WARNING
        return Severity.INFO

    def severity_of(self, share_pct: float | None, gain: Gain) -> Severity:
        """The severity of a finding with this gain: by its share at stake, and at most info where its
        rule's own model expects the fix to win nothing (``expected_fraction`` 0), or less of the step
        than the warning threshold (``expected_share_pct``): the time is at stake, and the finding says
        so, but what it recommends is not expected to pay more than an info's share (tuned_baseline on
        2 cores: GD201 at 6.0% of step time, its model expecting 1.9%, read as a warning)."""
        if gain.expected_fraction is not None and gain.expected_fraction <= 0.0:
            return Severity.INFO
        # (as printed, to a tenth of a percent: an expected "−5.0%" is not under a 5% threshold)
        if gain.expected_share_pct is not None and round(gain.expected_share_pct, 1) < self.thresholds.warning_share_pct:
            return Severity.INFO
        return self.severity(share_pct)

    @staticmethod
    def gain(share_pct: float | None, note: str = "", expected: float | None = None,
             expected_note: str = "") -> Gain:
        """The gain of a share of step time at stake (the bound) and, with ``expected`` (the
        fraction of it the rule's model expects the fix to win, 0..1), the expected gain."""
        if share_pct is None:
            return Gain(None, None, note, expected_note=expected_note)
        share = max(0.0, min(share_pct, 99.9))
        exp_share = exp_speedup = fraction = None
        if expected is not None and math.isfinite(expected):
            fraction = round(max(0.0, min(float(expected), 1.0)), 4)
            exp_share = round(share * fraction, 4)
            exp_speedup = round(1.0 / (1.0 - exp_share / 100.0), 6)
        # 4 decimals, as the ledger's parts: one quantity shows one value in every table. The speed-ups keep 6:
        # rounded to 3 and then printed to 3 figures, 1/(1 - 21.0%) = 1.2650 read "up to 1.26× faster"
        return Gain(round(share, 4), round(1.0 / (1.0 - share / 100.0), 6), note,
                    expected_share_pct=exp_share, expected_speedup=exp_speedup, expected_fraction=fraction,
                    expected_note=expected_note if fraction is not None else "")

    def finding(
        self,
        message: str,
        fix: Fix,
        *,
        share_pct: float | None,
        confidence: Confidence = Confidence.MEASURED,
        metrics: Sequence[Metric] = (),
        time_ranges: Sequence[TimeRange] = (),
        settings: Sequence[SettingRef] = (),
        notes: Sequence[str] = (),
        location: Location | None = None,
        gain_note: str = "",
        rank: int | None = None,
        claims: Sequence[tuple[Component, int | None]] = (),
        ledger: Ledger | None = None,
        severity_pct: float | None = None,
        expected: float | None = None,
        expected_note: str = "",
        source: TraceMetrics | None = None,
    ) -> Finding:
        """A finding of the rule being run. With ``claims`` (parts of ``ledger``, each whole
        (None) or up to a measured ns), the share of step time at stake is what they amount to,
        and the engine later grants each part to one finding only (docs/account.md); without,
        ``share_pct`` is the share of step time at stake where no ledger splits it (or None).
        ``severity_pct``: a figure that is not a share of step time (CPU demand, system CPU, the
        other ranks' wait) but sets the severity on the same scale; the gain note says what it is.
        ``expected``: the fraction (0..1) of the share at stake that the rule's model (stated in its
        documentation) expects the fix to win, ``expected_note`` that model with its factors.
        ``source``: the trace the claims' ns were measured over, when it is not the ledger's windows
        alone (``ns_on_ledger`` puts them in the ledger's terms)."""
        claimed: tuple[Claim, ...] = ()
        if claims and ledger is not None and ledger.total_ns > 0:
            out = []
            for comp, ns in claims:
                if ns is not None and source is not None:
                    ns = self.ns_on_ledger(source, ns, ledger)
                part = ledger.ns(comp)
                want = part if ns is None else max(0, min(int(ns), part))
                out.append(Claim(comp.value, ledger.key, want, want, part, ledger.total_ns))
            claimed = tuple(out)
            share_pct = 100.0 * sum(c.requested_ns for c in claimed) / ledger.total_ns
        gain = self.gain(share_pct, gain_note, expected, expected_note)
        return Finding(
            code=self.code,
            name=self.name,
            severity=self.severity_of(share_pct if share_pct is not None else severity_pct, gain),
            confidence=confidence,
            message=message,
            fix=fix,
            evidence=Evidence(tuple(metrics), tuple(time_ranges), tuple(settings), tuple(notes)),
            gain=replace(gain, claims=claimed),
            location=location,
            rank=rank,
        )

    # ---------------------------------------------------------------- multi-trace

    def per_trace(self, judge: Callable[[TraceMetrics], RuleResult], use: str = "account") -> RuleResult:
        """Judge the traces; keep the worst finding and name the other ranks where it also fired.
        ``use``: which of each process's traces: "account" (the accounting ones: a figure of time
        judged where the profiler weighs least), "shapes" or "stacks" (the detailed ones, for a rule
        that reads the ops' shapes or Python frames), "all"."""
        if not self.metrics:
            return RuleResult.cannot_judge("no trace in this run")
        traces = (self.metrics if use == "all" else self.accounting_traces() if use == "account"
                  else self.detail_traces(use))
        results = [(m, judge(m)) for m in traces]
        return merge_results(results)


def merge_results(results: Sequence[tuple[TraceMetrics, RuleResult]]) -> RuleResult:
    if len(results) == 1:
        return results[0][1]
    fired = [(m, r) for m, r in results if r.verdict == Verdict.FIRED]
    if fired:
        fired.sort(key=lambda mr: -max(_figure(f) for f in mr[1].findings))
        best_m, best = fired[0]
        others = [trace_label(m) for m, _ in fired[1:]]
        if others:
            note = f"also on {len(others)} other trace(s): {', '.join(others[:12])}" + (
                " …" if len(others) > 12 else ""
            )
            findings = tuple(
                replace(f, evidence=replace(f.evidence, notes=(*f.evidence.notes, note)))
                for f in best.findings
            )
            return RuleResult(Verdict.FIRED, best.reason, findings)
        return best
    best_verdict = min((r.verdict for _, r in results), key=lambda v: _VERDICT_ORDER[v])
    chosen = [(m, r) for m, r in results if r.verdict == best_verdict]
    reasons = [f"{trace_label(m)}: {r.reason}" for m, r in chosen]
    reason = reasons[0] if len(reasons) == 1 else f"{reasons[0]} (and {len(reasons) - 1} more trace(s))"
    return RuleResult(best_verdict, reason, applied=any(r.applied for _, r in chosen))


def _figure(f: Finding) -> float:
    """How bad a finding is, to keep the worst trace's: its share of step time, else (a headline or a
    figure that is not step time) its first percentage."""
    if f.gain.share_pct is not None:
        return f.gain.share_pct
    pct = next((m.value for m in f.evidence.metrics if m.unit == "%" and isinstance(m.value, (int, float))), 0.0)
    return float(pct)


def _cc(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
