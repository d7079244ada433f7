"""What a rule reads: ``RuleContext``, the rule's view of a run.

A rule's ``check(ctx)`` returns a ``RuleResult`` (``rules.results``). ``RuleContext`` bundles the run, one
``TraceMetrics`` per trace (rank), the thresholds, the run's figures (``figures``: the step populations and the
step time, ``analysis.figures``) and its accounting window and ledgers (``accounting``: which traces the account
is charged on and the ledger a finding claims from, ``analysis.accounting``), both computed once per diagnosis
when the context is made and shared by every rule's copy (``for_rule``), and what every rule shares on top: the
severity scale and the gain of a share of step time, ``finding``, and merging the per-rank results of a
multi-trace run into one (``per_trace``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from gpudoctor.analysis.accounting import (
    Accounting,
    detail_of,
    detail_traces,
    gap_ranges,
    ns_on_ledger,
    recorded_steps,
    run_accounting,
    trace_idle,
    trace_window,
    window_label,
)
from gpudoctor.analysis.figures import RunFigures, run_figures
from gpudoctor.analysis.loader import uses_gpu
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
from gpudoctor.model.metrics import Component, Ledger, TraceMetrics
from gpudoctor.model.run import CallSite, DataLoaderSetting, StepRecord
from gpudoctor.model.selectors import busiest_device, device_cc
from gpudoctor.model.settle import Settling
from gpudoctor.rules.results import RuleResult, merge_results


@dataclass(frozen=True, slots=True)
class RuleContext:
    run: RunData
    thresholds: Thresholds = field(default_factory=Thresholds)
    code: str = ""  # the rule being run (set by the engine through ``for_rule``)
    name: str = ""
    # what the script's source says of the DataLoader at a call site (``engine.loader_source_of``: the loop
    # that changes its dataset in place, and whether at every step); None: the source is not read
    loader_source: Callable[[CallSite], tuple[str, bool] | None] | None = field(default=None, compare=False,
                                                                              repr=False)
    # the run's figures and its accounting, computed from ``run`` when the context is made (None: compute them);
    # every rule's copy (``for_rule``) shares them: nothing downstream recomputes them
    figures: RunFigures = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    accounting: Accounting = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.figures is None:
            object.__setattr__(self, "figures", run_figures(self.run, self.thresholds))
        if self.accounting is None:
            object.__setattr__(self, "accounting", run_accounting(self.run, self.figures,
                                                                  self.thresholds.profiler_weight_max_ratio))

    # ---------------------------------------------------------------- basics

    def for_rule(self, code: str, name: str) -> RuleContext:
        return replace(self, code=code, name=name)

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
        """GPU work seen in a trace, or the run used a CUDA device (``analysis.loader.uses_gpu``)."""
        return uses_gpu(self.run)

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
        """Name and compute capability of the (first) GPU, from the trace or the manifest (``model.selectors``)."""
        return device_cc(self.run)

    # ---------------------------------------------------------------- steps (the run's figures)

    def steps(self) -> tuple[StepRecord, ...]:
        return self.run.steps

    def steady_steps(self) -> tuple[StepRecord, ...]:
        """The steady steps of every rank (``RunFigures``: the steps ``model.steady.steady_steps`` defines)."""
        return self.figures.job.steady

    def settling(self) -> Settling | None:
        """Where the run's step time changed beyond noise, the steady steps its settled part (None: it held)."""
        return self.figures.settling

    def phase_shares_pct(self) -> dict[str, float | None] | None:
        """Share of the steady steps' time in each phase the hooks timed (None: the steps carry no phase times)."""
        return self.figures.job.phases

    def micro_batches(self) -> int | None:
        """Micro-batches (backward() calls) per optimizer step, median over the steady steps (None: unknown)."""
        return self.figures.job.micro_batches

    def main_dataloader(self) -> DataLoaderSetting | None:
        """The DataLoader the training loop iterates: most iterations started, first on ties."""
        return steady.main_dataloader(self.settings)

    # ---------------------------------------------------------------- a trace's windows (``analysis.accounting``)

    util = staticmethod(busiest_device)  # the device of a trace a rule judges (``model.selectors``)
    window = staticmethod(trace_window)  # the window a trace's step-time percentages are of
    window_label = staticmethod(window_label)
    idle = staticmethod(trace_idle)  # GPU idle % of a trace and the window it is of
    gap_ranges = staticmethod(gap_ranges)  # a trace's longest idle gaps, as time ranges
    ns_on_ledger = staticmethod(ns_on_ledger)  # a figure of a trace's windows, in a ledger's terms

    def trace_share(self, m: TraceMetrics, ns: int) -> float | None:
        """``ns`` measured over ``m``'s windows as a share of step time (of its process's account)."""
        return self.accounting.trace_share(m, ns)

    # ---------------------------------------------------------------- the accounting window (docs/account.md)

    def accounting_traces(self) -> tuple[TraceMetrics, ...]:
        """The traces the account is charged on: of each process, those recorded without stacks or shapes."""
        return self.accounting.traces

    def detail_traces(self, need: str) -> tuple[TraceMetrics, ...]:
        """Of each process, its traces recorded with ``need`` ("shapes", "stacks"), else its accounting ones."""
        return detail_traces(self.metrics, need)

    def detail_of(self, m: TraceMetrics, need: str) -> TraceMetrics | None:
        """The trace of ``m``'s process recorded with ``need`` (``m`` itself when it has it; None: none has)."""
        return detail_of(self.metrics, m, need)

    def recorded_steps(self, traces: Sequence[TraceMetrics]) -> tuple[StepRecord, ...]:
        """The run's step records of the steps ``traces`` recorded (``analysis.accounting.recorded_steps``)."""
        return recorded_steps(self.run.steps, traces)

    def primary_trace(self, rank: int | None = None) -> TraceMetrics | None:
        """The trace a rank's account comes from (``analysis.accounting.Accounting.primary_trace``)."""
        return self.accounting.primary_trace(rank)

    def ledger(self, m: TraceMetrics | None = None) -> Ledger | None:
        """The ledger a finding of ``m`` claims its share of step time from (``Accounting.ledger``; ``m`` None:
        the primary trace's, else the account's steps' own)."""
        return self.accounting.ledger(m)

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
                    ns = ns_on_ledger(source, ns, ledger)
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
        traces = (self.metrics if use == "all" else self.accounting.traces if use == "account"
                  else detail_traces(self.metrics, use))
        results = [(m, judge(m)) for m in traces]
        return merge_results(results)

