"""``--verify``: a finding's fix applied in trial runs and its measured speed-up.

``gpudoctor.verify`` runs the script in interleaved trials, with the fix injected
and without it, and attaches a ``Verification`` to each finding it could judge.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gpudoctor.model._serde import Serde
from gpudoctor.model.run import HostLoad, Injection


class VerifyStatus(str, Enum):
    """What the trial runs showed about a finding's fix."""

    CONFIRMED = "confirmed"  # faster with the fix: the interval excludes 1 and the speed-up clears the minimum effect
    REFUTED = "refuted"  # slower with the fix, or the whole interval under the minimum effect: it did not help
    # a trial crashed, too few runs or steps, the interval straddles the minimum effect, or the machine's
    # load differed between the two sides (or the trials ran far slower than the profiled run)
    INCONCLUSIVE = "inconclusive"
    NOT_TRIED = "not_tried"  # the fix needs a source edit or changes numerics, or no time was left (the reason says)


@dataclass(frozen=True, slots=True)
class RunFigure(Serde):
    """One trial run's own figures: the run, not the step, is the unit a verdict rests on."""

    run: str  # its directory, relative to the run directory ("verify/baseline/2")
    arm: str  # "baseline" or "trial"
    round: int  # the round it ran in (1-based): the baseline and trial runs of a round ran side by side
    ok: bool  # it ran to its last step (a failed run is listed, not judged)
    steps: int = 0  # steps judged (warm-up left out)
    step_ns: int | None = None  # its time per step: the judged steps' total wall time ÷ their count
    median_step_ns: int | None = None  # its median judged step, shown beside
    load: HostLoad | None = None  # how busy the machine was during its steps


@dataclass(frozen=True, slots=True)
class LadderRung(Serde):
    """One setting of a sized knob (num_workers, batch_size) tried by ``--verify``'s ladder."""

    knob: str  # "num_workers", "batch_size"
    value: int
    status: VerifyStatus
    speedup: float | None = None  # time per step (per sample when the batch size changed) as in Verification
    ci: tuple[float, float] | None = None
    confidence_pct: float = 95.0  # the level of ``ci`` (the ladder's share of the error rate, Bonferroni)
    trials: int = 0  # runs with this setting
    reason: str = ""  # one line: the verdict with its numbers, or why the climb stopped here


@dataclass(frozen=True, slots=True)
class Verification(Serde):
    """A finding's fix measured: trial runs with it against interleaved baseline runs without it.

    Each run is the script stopped after ``steps`` steps, with step timing only (no
    torch.profiler, no cProfile). The *run* is the unit: each run gives one figure, its
    time per step over its judged steps (their total wall time ÷ their count: what an
    epoch costs, throughput), and ``speedup`` is the ratio of the two sides' geometric
    means of those figures, with ``ci`` from Welch's t-test on their logarithms
    (``analysis.stats.run_speedup_stats``). Judged steps: after each run's warm-up and,
    for ``statistic`` "throughput", without the first step of each epoch (a one-off cost);
    a fix whose gain falls on epoch starts (worker start-up, GD202) is judged with them
    (``statistic`` "epoch"). The pooled median step of each side is shown beside.
    Undecided after the first look, more rounds run and the interval is looked at again:
    each of ``max_looks`` looks uses ``look_confidence_pct`` = 1 − (1 − ``confidence_pct``)
    / ``max_looks`` (Bonferroni), so the interval covers the true ratio with at least
    ``confidence_pct`` whichever look stops. ``per_run`` lists every run's figures and
    the machine's load; a verdict the load or a far slower machine makes unfair is
    inconclusive with that reason (``load_reason``).
    """

    status: VerifyStatus
    reason: str  # one line with the numbers filled in, or why it was not tried
    changes: tuple[Injection, ...] = ()  # exactly what the trials changed (the best setting, after a ladder)
    speedup: float | None = None  # baseline time per step ÷ trial time per step (per sample when the batch size changed)
    statistic: str = "throughput"  # "throughput": steady steps; "epoch": epoch starts kept (the gain is there)
    ci: tuple[float, float] | None = None  # interval of ``speedup`` (level ``confidence_pct`` over every look)
    confidence_pct: float = 95.0
    p_value: float | None = None  # Welch's t-test on log time per step of the runs, two-sided
    min_speedup: float = 1.0  # the minimum effect a confirmed fix must clear (Thresholds.verify_min_speedup_ratio)
    trials: int = 0  # trial runs with the fix that were measured (each interleaved with a baseline run)
    baseline_runs: int = 0  # baseline runs (without the fix) the trial runs are compared with
    steps: int = 0  # steps each run was stopped after (--verify-steps)
    steps_baseline: int = 0  # steps judged: baseline side, all runs (warm-up left out)
    steps_trial: int = 0  # steps judged: trial side
    baseline_step_ns: int | None = None  # time per step without the fix (geometric mean of the runs'); per sample when per_sample
    trial_step_ns: int | None = None  # with the fix
    per_sample: bool = False  # the batch size differed: times are per sample
    runs: tuple[str, ...] = ()  # the trial run directories, relative to the run directory
    errors: tuple[str, ...] = ()  # trial runs that crashed or were interrupted, and how
    median_baseline_step_ns: int | None = None  # median judged step, all baseline runs pooled (shown beside)
    median_trial_step_ns: int | None = None
    median_speedup: float | None = None  # the ratio of those medians (no interval: steps are not independent)
    looks: int = 0  # times the interval was looked at (1, or 2 after more rounds)
    max_looks: int = 1  # looks planned (--verify-trials, then up to --verify-max-trials)
    look_confidence_pct: float | None = None  # the level of each look: the error rate shared over max_looks
    test: str = ""  # the test behind ``p_value`` and ``ci``
    per_run: tuple[RunFigure, ...] = ()  # every run judged (or failed), baseline and trial, in the order they ran
    load_baseline: HostLoad | None = None  # the machine's load, mean over the baseline runs
    load_trial: HostLoad | None = None  # over the trial runs
    load_reason: str = ""  # why the load (or a far slower machine) makes the comparison unfair; "" when it does not
    profiled_step_ns: int | None = None  # the profiled run's median steady step, for comparison with the trials'
    ladder: tuple[LadderRung, ...] = ()  # the settings of a sized knob tried after the first one (see LadderRung)
    measured_best: str = ""  # "num_workers=8": the best setting the ladder measured, when it climbed
