"""``--verify``: a finding's fix applied in trial runs and its measured speed-up.

``gpudoctor.verify`` runs the script in interleaved trials, with the fix injected
and without it, and attaches a ``Verification`` to each finding it could judge.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gpudoctor.model._serde import Serde
from gpudoctor.model.run import Injection


class VerifyStatus(str, Enum):
    """What the trial runs showed about a finding's fix."""

    CONFIRMED = "confirmed"  # faster with the fix: the interval excludes 1 and the speed-up clears the minimum effect
    REFUTED = "refuted"  # slower with the fix, or the whole interval under the minimum effect: no measurable gain
    INCONCLUSIVE = "inconclusive"  # a trial crashed, too few steps, or the interval straddles the minimum effect
    NOT_TRIED = "not_tried"  # the fix needs a source edit or changes numerics, or no time was left (the reason says)


@dataclass(frozen=True, slots=True)
class Verification(Serde):
    """A finding's fix measured: trial runs with it against interleaved baseline runs without it.

    Each run is the script stopped after ``steps`` steps, with step timing only (no
    torch.profiler, no cProfile). The steady steps of all runs of a side are pooled;
    ``speedup`` is the baseline median step over the trial median step, ``ci`` its
    bootstrap interval and ``p_value`` the Mann–Whitney U test (``analysis.stats``, the
    statistics ``gpudoctor compare`` uses). A fix whose gain falls on a few steps (worker
    start-up at each epoch, GD202) is judged on every step after the warm-up instead:
    epoch starts and the other steps each by their median, weighted by how often they
    occur (``statistic`` "epoch"; the interval alone decides, ``p_value`` is None).
    """

    status: VerifyStatus
    reason: str  # one line with the numbers filled in, or why it was not tried
    changes: tuple[Injection, ...] = ()  # exactly what the trials changed
    speedup: float | None = None  # baseline median step ÷ trial median step (per sample when the batch size changed)
    statistic: str = "median"  # "median" of the steady steps, or "epoch": epoch starts and other steps weighted
    ci: tuple[float, float] | None = None  # bootstrap confidence interval of ``speedup``
    confidence_pct: float = 95.0
    p_value: float | None = None  # Mann–Whitney U, two-sided (None with statistic "epoch")
    min_speedup: float = 1.0  # the minimum effect a confirmed fix must clear (Thresholds.verify_min_speedup_ratio)
    trials: int = 0  # trial runs with the fix that were measured (each interleaved with a baseline run)
    baseline_runs: int = 0  # baseline runs (without the fix) the trial runs are compared with
    steps: int = 0  # steps each run was stopped after (--verify-steps)
    steps_baseline: int = 0  # steps compared: baseline side (warm-up left out)
    steps_trial: int = 0  # steps compared: trial side
    baseline_step_ns: int | None = None  # median step (see statistic) without the fix; per sample when per_sample
    trial_step_ns: int | None = None  # with the fix
    per_sample: bool = False  # the batch size differed: times are per sample
    runs: tuple[str, ...] = ()  # the trial run directories, relative to the run directory
    errors: tuple[str, ...] = ()  # trial runs that crashed or were interrupted, and how
