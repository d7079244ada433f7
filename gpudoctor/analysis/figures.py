"""The run's figures, computed once per diagnosis (DESIGN.md, "The run's figures"; docs/account.md).

Per rank, and for the job (every rank's steps together): the step populations, one definition each
(``model.steady``: the records, the marker's steps, the steady steps, the unprofiled ones, the account's
window), **the step time** (one statistic: the mean over the account's window, the unprofiled steady steps
where there are ``model.steady.MIN_BARE_STEPS``: total ÷ count, the throughput ``--verify`` measures), what
timed it (``StepSource``), its spread (median, p90: named as what they are, never "the step"), the data
wait, the phases the hooks timed and the micro-batches per step; the host's: the training process's CPU,
the cores and the machine's load over the steps; with the diagnosis's thresholds, the DataLoader's load and
its kind (``analysis.loader``: per batch, over the job's account steps); memory (``analysis.memory``: the
GPU's size and each trace's peak, the machine's memory). Without per-step records (a bare trace),
the step time is the mean of the trace's ProfilerStep windows.

``model.steady`` holds the definitions (pure functions of the records, which the stderr line of ``gpudoctor
profile`` shares without this layer); this module applies them once to a run, and the rules (through
``RuleContext.figures``), the engine's summary, the account, ``--verify``'s judging, ``compare`` and so every
renderer read the result. Nothing downstream computes a step time or a step population of its own (a test
greps for it: tests/analysis/test_analysis_figures.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpudoctor.analysis.load import host_load
from gpudoctor.analysis.loader import LoaderFigures, LoaderLimits, loader_figures
from gpudoctor.analysis.memory import MemoryFigures, memory_figures
from gpudoctor.model import HostLoad, steady
from gpudoctor.model.findings import RunData
from gpudoctor.model.metrics import Ledger, TraceMetrics
from gpudoctor.model.run import StepRecord
from gpudoctor.model.settle import Settling
from gpudoctor.model.steady import StepFigures, StepSource, median_int

__all__ = ["HostFigures", "RankSteps", "RunFigures", "StepFigures", "StepSource", "run_figures", "steps_span"]


@dataclass(frozen=True, slots=True)
class RankSteps:
    """The figures of one rank's steps (or of every rank's: ``RunFigures.job``)."""

    rank: int | None  # None: the job's (every rank together), or a run whose records carry no rank
    records: tuple[StepRecord, ...]  # every step record (steps.jsonl)
    marked: tuple[StepRecord, ...]  # the steps of the run's marker (``model.steady.marked_steps``)
    steady: tuple[StepRecord, ...]  # without one-off costs (``model.steady.steady_steps``)
    unprofiled: tuple[StepRecord, ...]  # steady, no instrument in them or just before (``unprofiled_steps``)
    account: tuple[StepRecord, ...]  # the account's window: ``unprofiled`` where there are enough, else ``steady``
    step: StepFigures  # the step time (the mean over ``account``), its spread and the data wait
    phases: dict[str, float | None] | None  # share of the steady steps' wall time in each phase the hooks timed
    micro_batches: int | None  # backward() calls per optimizer step (median over the steady steps)

    @property
    def step_ns(self) -> int | None:
        """THE step time: the mean over the account's window."""
        return self.step.step_ns

    @property
    def account_is_unprofiled(self) -> bool:
        """The account's window leaves instrumented steady steps out."""
        return len(self.account) < len(self.steady)

    @property
    def account_label(self) -> str:
        """What the account's window is, in words: "62 unprofiled steady steps", "30 steady steps"."""
        n = len(self.account)
        return f"{n} {'unprofiled ' if self.account_is_unprofiled else ''}steady step{'' if n == 1 else 's'}"

    @property
    def marked_wall_ns(self) -> int:
        """Wall time of every step of the marker: the run's step time in all (one-off costs included)."""
        return sum(s.wall_ns for s in self.marked)


@dataclass(frozen=True, slots=True)
class HostFigures:
    """The host the steps ran on: the training process's CPU, the cores, the machine's load."""

    main_cpu_pct: float | None  # the training process's CPU (% of one core): median of its samples while the steps ran
    main_cpu_samples: int  # how many samples
    main_cpu_when: str  # "while the steps ran" or "over the run" (no sample in the steps' span, or no steps)
    cpu_count: int | None  # cores available to the training process (settings, then manifest, then samples)
    load: HostLoad | None  # the machine's load over the steps' span (``analysis.load.host_load``)


@dataclass(frozen=True, slots=True)
class RunFigures:
    """The run's figures: the job's, each rank's, each trace's ProfilerStep windows, and the host's."""

    job: RankSteps
    ranks: tuple[RankSteps, ...]  # by rank; empty where the records carry no rank
    traces: tuple[tuple[str, StepFigures], ...]  # (trace path, its ProfilerStep windows' figures)
    host: HostFigures
    settling: Settling | None = None  # where the step time changed beyond noise (``steady.run_settling``): the
    # steady steps are the settled part's; None where it held steady
    loader: LoaderFigures | None = None  # the DataLoader's load and its kind, over the job's account steps, per
    # batch (``analysis.loader``); None where run_figures had no thresholds to judge it by (``limits``)
    memory: MemoryFigures = field(default_factory=MemoryFigures)  # the GPU's size and peaks, the machine's memory

    def of(self, rank: int | None) -> RankSteps:
        """One rank's figures (the lowest rank's for None; the job's where the records carry no rank)."""
        if not self.ranks:
            return self.job
        if rank is None:
            return self.ranks[0]
        return next((r for r in self.ranks if r.rank == rank), self.job)

    def trace_step(self, m: TraceMetrics | None) -> StepFigures | None:
        """The figures of a trace's ProfilerStep windows (None: no such trace, or no windows)."""
        if m is None:
            return None
        got = next((f for path, f in self.traces if path == m.path), None)
        return got if got is not None and got.steps else None

    def step_of(self, rank: int | None, m: TraceMetrics | None = None) -> StepFigures | None:
        """The step figures of a rank: its steps' where it has records, else its trace's windows (``m``)."""
        figs = self.of(rank).step
        return figs if figs.steps else self.trace_step(m)

    def account_step(self, ledger: Ledger, m: TraceMetrics | None = None) -> tuple[int | None, str, bool]:
        """The step time the account of ``ledger`` projects, what it is ("mean of 62 unprofiled steady steps,
        CUDA events"), and whether it is of the steps (not of the ledger's own windows): the run's step time
        where it has records (a job's of several ranks: every rank's steps, as the summary prints it; in
        synchronous training the slowest rank, whose ledger this is, sets every rank's pace), else the mean of
        the trace's windows (``m``: the ledger's trace), else the ledger's mean window."""
        rank = self.job
        if rank.step.step_ns:
            ranks = f" of {len(self.ranks)} ranks" if len(self.ranks) > 1 else ""
            what = f"mean of {rank.account_label}{ranks}" + _by(rank.step.source)
            return rank.step.step_ns, what, True
        tr = self.trace_step(m)
        if tr is not None and tr.step_ns:
            return tr.step_ns, f"mean of {tr.steps} ProfilerStep windows", False
        if ledger.windows:
            return int(round(ledger.step_ns)), f"mean of {ledger.window}", False
        return None, "", False


def _by(source: StepSource) -> str:
    return "" if source == StepSource.WALL else f", {source.value}"


def _phases(steps: Sequence[StepRecord]) -> dict[str, float | None] | None:
    """Share of the steps' wall time in each phase gpudoctor's hooks timed on the host: ``data_wait``,
    ``forward`` (None where no root module was watched: it is then in ``other``), ``backward``,
    ``optimizer``, ``other`` (the loop's own work); None when the steps carry no phase times."""
    steps = [s for s in steps if s.backward_ns is not None and s.optimizer_ns is not None]
    total = sum(s.wall_ns for s in steps)
    if not steps or total <= 0:
        return None
    forward = None if any(s.forward_ns is None for s in steps) else sum(s.forward_ns or 0 for s in steps)
    parts: dict[str, float | None] = {
        "data_wait": sum(min(s.data_wait_ns, s.wall_ns) for s in steps),
        "forward": forward,
        "backward": sum(s.backward_ns or 0 for s in steps),
        "optimizer": sum(s.optimizer_ns or 0 for s in steps),
        "other": sum(s.other_ns() or 0 for s in steps),
    }
    return {k: (None if v is None else 100.0 * v / total) for k, v in parts.items()}


def _rank(rank: int | None, records: Sequence[StepRecord], marked: Sequence[StepRecord],
          stead: Sequence[StepRecord]) -> RankSteps:
    account = steady.figure_steps(stead)
    micro = [s.micro_batches or 0 for s in stead if s.marker == "optimizer" and s.micro_batches]
    return RankSteps(
        rank=rank,
        records=tuple(records),
        marked=tuple(marked),
        steady=tuple(stead),
        unprofiled=steady.unprofiled_steps(stead),
        account=account,
        step=steady.step_figures(stead),
        phases=_phases(stead),
        micro_batches=median_int(micro) if micro else None,
    )


def _trace_figures(m: TraceMetrics) -> StepFigures:
    return steady.times_figures([w.end_ns - w.start_ns for w in m.steps], StepSource.TRACE)


def _host(run: RunData) -> HostFigures:
    span = (run.steps[0].start_ns, max(s.start_ns + s.wall_ns for s in run.steps)) if run.steps else (None, None)
    samples = tuple(p for p in (run.samples.process if run.samples else ()) if p.role == "main")
    when = "over the run"
    if run.steps:
        inside = tuple(p for p in samples if span[0] <= p.t_ns <= span[1])
        if inside:
            samples, when = inside, "while the steps ran"
    # rounded as the summary keeps its figures (3 decimals), so that a rule prints what it prints
    cpu = round(statistics.median(p.cpu_pct for p in samples), 3) if samples else None
    s, mf = run.settings, run.manifest
    cores = ((s.cpu_count if s is not None and s.cpu_count else None)
             or (mf.cpu_count if mf is not None and mf.cpu_count else None)
             or (run.samples.system_cpu_count if run.samples is not None and run.samples.system_cpu_count else None))
    return HostFigures(cpu, len(samples), when, cores, host_load(run.samples, *span))


def run_figures(run: RunData, limits: LoaderLimits | None = None) -> RunFigures:
    """The figures of ``run``, computed once (``RuleContext.figures`` keeps them for the diagnosis); with
    ``limits`` (the diagnosis's thresholds, ``config.Thresholds``), the DataLoader's load too."""
    mf = run.manifest
    source = mf.step_source if mf is not None else None
    loader = steady.main_dataloader(run.settings)
    marked = steady.marked_steps(run.steps, source)
    compiled = steady.compile_steps(run.settings, run.steps)
    stead = steady.steady_steps(run.steps, source, loader, compiled)
    job = _rank(None, run.steps, marked, stead)
    ranked = sorted({s.rank for s in stead if s.rank is not None})
    ranks = tuple(
        _rank(r, [s for s in run.steps if s.rank == r], [s for s in marked if s.rank == r],
              [s for s in stead if s.rank == r])
        for r in ranked
    )
    traces = tuple((m.path, _trace_figures(m)) for m in run.metrics if m.steps)
    host = _host(run)
    return RunFigures(job, ranks, traces, host, steady.run_settling(run.steps, source, loader, compiled),
                      loader_figures(run, job, host.load, host.cpu_count, limits) if limits is not None else None,
                      memory_figures(run))


def steps_span(steps: Sequence[StepRecord]) -> tuple[int, int] | None:
    """When ``steps`` ran, from the run's start (ns): from the first one's start to the later of the last
    one's end on the host and the end of their time at the rate the loop sustains (``model.steady.loop_times``:
    a GPU-bound loop's device runs its steps long after the host enqueued them); None without steps. The ranks
    of a job run their steps side by side: each rank's steps are timed apart, and the span ends at the latest
    of theirs (summed over every rank's steps, a job of 8 ranks ran 8 times as long)."""
    if not steps:
        return None
    lo = min(s.start_ns for s in steps)
    end = max(s.start_ns + s.wall_ns for s in steps)
    for rank in dict.fromkeys(s.rank for s in steps):
        mine = [s for s in steps if s.rank == rank]
        times, _ = steady.loop_times(mine)
        end = max(end, min(s.start_ns for s in mine) + sum(times))
    return lo, end

