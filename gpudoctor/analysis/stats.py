"""Is B faster than A? The statistics shared by ``compare`` and ``--verify``, on ``scipy.stats``.

Two sets of step times (before and after a change) are judged by one decision on one
statistic, the speed-up: the ratio of the medians A / B. Its percentile bootstrap interval
(``scipy.stats.bootstrap``, the two samples resampled independently, ``resamples``
resamples from a fixed seed, so the same steps always give the same interval; a sample of
more than ``BOOTSTRAP_MAX_STEPS`` steps is resampled from that many spread evenly over it)
decides, and its p-value is the bootstrap test of "no change" from the same resamples
(``interval_and_p``): the interval excludes 1× exactly when p < 1 − confidence. A rank test
(``mann_whitney_p``, Mann–Whitney U) tests another thing, whether a step of one side tends
to be slower, and the two disagree on a sample whose median is unstable (bimodal steps: a
test at p = 0.020 beside an interval of 0.42×–2.17×, a verdict that read as a contradiction);
it is no longer part of the verdict.

A change whose effect falls on a few steps (a worker start-up at the first step of
each epoch) is invisible to a median, and a mean of all steps follows whatever else
slows a shared machine down. ``stratified_speedup_stats`` splits each side's steps
into strata (epoch starts, the other steps) and compares
Σ share × median(stratum): each stratum by its median, weighted by how often it
occurs; its bootstrap resamples within each stratum, and its interval and p come from
those resamples in the same way.

``speedup_stats`` computes both once for ``gpudoctor compare`` (``analysis.compare``),
which has one run a side and so nothing but steps to compare. Step times of one run are
not independent draws (a slow phase, another job on the machine, lasts several steps),
so its interval is optimistic; the caller's minimum effect is the guard.

``gpudoctor verify`` has several runs a side and makes the *run* the unit
(``run_speedup_stats``): each run gives one figure, its time per step (total ÷ count:
throughput), and the two sides' figures are compared by Welch's t-test on their
logarithms (``scipy.stats.ttest_ind(equal_var=False)`` and its confidence interval): the
speed-up is the ratio of the geometric means, its interval the exponential of the
interval of the difference of the mean logs. Why this and not a bootstrap: with the 3
to 6 runs a side a trial budget buys, a bootstrap of the runs has a handful of distinct
resamples (10 for 3 runs) and its percentile interval is too narrow, while a two-level
bootstrap (runs, then steps within them) adds the steps' spread back and still draws
from 3 runs; the t interval is exact when the log run times are normal and is the
classical small-sample answer, and logs make a ratio's interval symmetric (1.25× faster
and 1.25× slower are the same distance from 1). ``benchmarks/verify_aa.py`` checks it:
the false-confirm rate of A/A trials (the same script on both sides) and the coverage of
a planted effect (docs/verify.md). ``bonferroni_confidence_pct`` shares an error rate
over the looks of a sequential design.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

__all__ = [
    "BOOTSTRAP_MAX_STEPS",
    "BOOTSTRAP_TEST",
    "CONFIDENCE_PCT",
    "EXACT_MAX_PAIRS",
    "RESAMPLES",
    "SEED",
    "RunSpeedupStats",
    "SpeedupStats",
    "bonferroni_confidence_pct",
    "bootstrap_speedup",
    "bootstrap_speedup_ci",
    "interval_and_p",
    "mann_whitney_p",
    "run_speedup_stats",
    "speedup_stats",
    "stratified_speedup_stats",
]

CONFIDENCE_PCT = 95.0
RESAMPLES = 2000  # bootstrap resamples, drawn with a fixed seed: the same steps give the same interval
SEED = 0
BOOTSTRAP_TEST = "bootstrap test of the ratio of medians (the interval's resamples)"
EXACT_MAX_PAIRS = 1600  # m * n up to which the exact U distribution is used (no ties)
BOOTSTRAP_BATCH_CELLS = 4_000_000  # resampled values held at once (32 MB of float64)
BOOTSTRAP_MAX_STEPS = 5_000  # longer samples are resampled from this many steps spread evenly over them:
# the interval is then already far narrower than any minimum effect, and it stays under a second


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> tuple[float, str]:
    """Two-sided p-value of the Mann–Whitney U test of ``a`` against ``b``, and the method used."""
    xa = np.asarray(a, dtype=np.float64)
    xb = np.asarray(b, dtype=np.float64)
    if len(xa) == 0 or len(xb) == 0:
        raise ValueError("both samples need at least one value")
    both = np.concatenate([xa, xb])
    ties = len(np.unique(both)) < len(both)
    if not ties and len(xa) * len(xb) <= EXACT_MAX_PAIRS:
        p = sps.mannwhitneyu(xa, xb, alternative="two-sided", method="exact").pvalue
        return float(min(1.0, p)), "Mann–Whitney U (exact)"
    method = "Mann–Whitney U (normal approximation" + (", ties corrected)" if ties else ")")
    if np.all(both == both[0]):  # every value equal: no evidence of a difference
        return 1.0, method
    p = sps.mannwhitneyu(xa, xb, alternative="two-sided", method="asymptotic", use_continuity=True).pvalue
    return float(min(1.0, p)) if math.isfinite(p) else 1.0, method


def _thin(x: np.ndarray) -> np.ndarray:
    """At most ``BOOTSTRAP_MAX_STEPS`` values, evenly spaced over the sample (all of them when fewer)."""
    if len(x) <= BOOTSTRAP_MAX_STEPS:
        return x
    return x[np.linspace(0, len(x) - 1, BOOTSTRAP_MAX_STEPS).round().astype(np.int64)]


def _ratio_of_medians(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    mb = np.median(b, axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.median(a, axis=axis) / mb


def _resampled(samples: Sequence[np.ndarray], statistic, resamples: int, seed: int) -> np.ndarray:  # noqa: ANN001
    """The bootstrap distribution of ``statistic`` over ``samples`` (each resampled independently,
    ``scipy.stats.bootstrap``), deterministic for a seed."""
    batch = max(1, BOOTSTRAP_BATCH_CELLS // max(len(x) for x in samples))
    # a sample whose resampled medians are 0 gives inf / nan ratios: scipy warns, the caller drops them
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", sps.DegenerateDataWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        res = sps.bootstrap(
            tuple(samples), statistic, n_resamples=resamples, batch=batch, vectorized=True, paired=False,
            axis=-1, method="percentile", rng=np.random.default_rng(seed),
        )
    return np.asarray(res.bootstrap_distribution, dtype=np.float64)


def interval_and_p(ratios: np.ndarray, confidence_pct: float = CONFIDENCE_PCT) -> tuple[float, float, float]:
    """The percentile interval of a speed-up from its bootstrap distribution ``ratios`` and the bootstrap
    test of "no change" (ratio 1) from the same resamples, made to be one decision: with ``B`` resamples
    and ``α = 1 − confidence``, the interval is the ``j``-th smallest and ``j``-th largest resample,
    ``j = ⌈α B / 2⌉``, and ``p = 2 min(#(r ≤ 1), #(r ≥ 1)) / B`` (capped at 1). The interval excludes 1
    exactly when ``p < α``: both say "fewer than α B / 2 resamples fall on the other side of 1". ``p`` has
    the resolution ``1 / B`` (0: no resample on the other side). (nan, nan, nan) without a finite resample."""
    r = np.sort(ratios[np.isfinite(ratios)])
    n = len(r)
    if n == 0:
        return math.nan, math.nan, math.nan
    j = max(1, math.ceil((1.0 - confidence_pct / 100.0) * n / 2))
    below, above = int(np.count_nonzero(r <= 1.0)), int(np.count_nonzero(r >= 1.0))
    return float(r[j - 1]), float(r[n - j]), min(1.0, 2.0 * min(below, above) / n)


def bootstrap_speedup(
    a: Sequence[float],
    b: Sequence[float],
    confidence_pct: float = CONFIDENCE_PCT,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """Percentile bootstrap interval of median(a) / median(b) and the bootstrap p of "no change", from the
    same resamples (``interval_and_p``), deterministic for a seed: (low, high, p).

    (nan, nan, nan) when the interval cannot be formed (a sample whose median is 0 in every resample);
    one value a side: the point as the interval, no p."""
    xa = _thin(np.asarray(a, dtype=np.float64))
    xb = _thin(np.asarray(b, dtype=np.float64))
    if len(xa) == 0 or len(xb) == 0:
        raise ValueError("both samples need at least one value")
    if len(xa) == 1 and len(xb) == 1:  # nothing to resample: the interval is the point
        r = float(_ratio_of_medians(xa, xb))
        return (r, r, math.nan) if math.isfinite(r) else (math.nan, math.nan, math.nan)
    return interval_and_p(_resampled((xa, xb), _ratio_of_medians, resamples, seed), confidence_pct)


def bootstrap_speedup_ci(
    a: Sequence[float],
    b: Sequence[float],
    confidence_pct: float = CONFIDENCE_PCT,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float]:
    """Percentile bootstrap interval of median(a) / median(b) (``bootstrap_speedup``), deterministic for a
    seed; (nan, nan) when it cannot be formed."""
    lo, hi, _ = bootstrap_speedup(a, b, confidence_pct, resamples, seed)
    return lo, hi


def _weighted_median_ratio(weights_a: Sequence[float], weights_b: Sequence[float]):
    """statistic(*a_strata, *b_strata) = Σ w·median(a stratum) / Σ w·median(b stratum), vectorized."""
    na = len(weights_a)

    def stat(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        ta = sum(w * np.median(x, axis=axis) for w, x in zip(weights_a, samples[:na], strict=True))
        tb = sum(w * np.median(x, axis=axis) for w, x in zip(weights_b, samples[na:], strict=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            return ta / tb

    return stat


@dataclass(frozen=True, slots=True)
class SpeedupStats:
    """A's step times against B's: the speed-up (median A / median B) and whether it is beyond noise.

    One decision: the interval decides, and ``p_value`` is the bootstrap test of the same statistic from the
    same resamples (``interval_and_p``), so it is under 1 − confidence exactly when the interval excludes 1."""

    median_a: float
    median_b: float
    speedup: float | None  # None when B's median is 0
    change_pct: float | None  # (B - A) / A of the medians, in %; None when A's median is 0
    ci_low: float | None  # bootstrap interval of ``speedup`` (None when it cannot be formed)
    ci_high: float | None
    p_value: float | None  # the bootstrap test of ratio 1, from the interval's resamples; None: no resample
    test: str
    confidence_pct: float

    @property
    def significant(self) -> bool:
        """The interval excludes 1 (and so ``p_value`` < 1 − confidence: the same resamples decide both)."""
        return (
            self.ci_low is not None
            and self.ci_high is not None
            and (self.ci_low > 1.0 or self.ci_high < 1.0)
        )


def speedup_stats(
    a: Sequence[float],
    b: Sequence[float],
    confidence_pct: float = CONFIDENCE_PCT,
    resamples: int = RESAMPLES,
) -> SpeedupStats:
    """The test and the interval of median(a) / median(b) (``a``: before, ``b``: after)."""
    med_a, med_b = float(statistics.median(a)), float(statistics.median(b))
    lo, hi, p = bootstrap_speedup(a, b, confidence_pct, resamples)
    ok = math.isfinite(lo) and math.isfinite(hi)
    return SpeedupStats(
        median_a=med_a,
        median_b=med_b,
        speedup=med_a / med_b if med_b > 0 else None,
        change_pct=100.0 * (med_b - med_a) / med_a if med_a > 0 else None,
        ci_low=lo if ok else None,
        ci_high=hi if ok else None,
        p_value=p if math.isfinite(p) else None,
        test=BOOTSTRAP_TEST,
        confidence_pct=confidence_pct,
    )


def stratified_speedup_stats(
    a: Sequence[Sequence[float]],
    b: Sequence[Sequence[float]],
    confidence_pct: float = CONFIDENCE_PCT,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> SpeedupStats:
    """A's strata of step times against B's (say: epoch starts, other steps): the speed-up of
    Σ share × median(stratum), share = the stratum's count / the side's count; empty strata are
    left out. Bootstrapped within each stratum (percentile interval); no test (``p_value`` None)."""
    sa = [np.asarray(x, dtype=np.float64) for x in a if len(x)]
    sb = [np.asarray(x, dtype=np.float64) for x in b if len(x)]
    if not sa or not sb:
        raise ValueError("both sides need at least one step")
    wa = [len(x) / sum(len(y) for y in sa) for x in sa]
    wb = [len(x) / sum(len(y) for y in sb) for x in sb]
    stat = _weighted_median_ratio(wa, wb)
    ta = float(sum(w * np.median(x) for w, x in zip(wa, sa, strict=True)))
    tb = float(sum(w * np.median(x) for w, x in zip(wb, sb, strict=True)))
    lo = hi = p = math.nan
    if any(len(x) > 1 for x in (*sa, *sb)):
        lo, hi, p = interval_and_p(_resampled([_thin(x) for x in (*sa, *sb)], stat, resamples, seed), confidence_pct)
    ok = math.isfinite(lo) and math.isfinite(hi)
    return SpeedupStats(
        median_a=ta,
        median_b=tb,
        speedup=ta / tb if tb > 0 else None,
        change_pct=100.0 * (tb - ta) / ta if ta > 0 else None,
        ci_low=lo if ok else None,
        ci_high=hi if ok else None,
        p_value=p if ok and math.isfinite(p) else None,
        test="stratified bootstrap test of Σ share × median (the interval's resamples)",
        confidence_pct=confidence_pct,
    )


# --------------------------------------------------------------------------- the run as the unit


def bonferroni_confidence_pct(confidence_pct: float, looks: int) -> float:
    """The level of each of ``looks`` intervals such that all of them hold together with at least
    ``confidence_pct`` (Bonferroni: the error rate 1 − confidence shared equally over the looks)."""
    if looks < 1:
        raise ValueError("looks must be at least 1")
    return 100.0 - (100.0 - confidence_pct) / looks


@dataclass(frozen=True, slots=True)
class RunSpeedupStats:
    """A's runs against B's, one figure per run (its time per step): how much faster B is."""

    speedup: float | None  # geometric mean of A ÷ geometric mean of B; None without a positive figure a side
    ci_low: float | None  # Welch t interval of ``speedup`` at ``confidence_pct`` (None: fewer than 2 runs a
    ci_high: float | None  # side, or no spread at all)
    p_value: float | None  # Welch's t-test, two-sided, of "same mean log time per step"
    df: float | None  # Welch–Satterthwaite degrees of freedom
    mean_a: float | None  # geometric means of the runs' figures
    mean_b: float | None
    runs_a: int
    runs_b: int
    confidence_pct: float
    test: str = "Welch's t-test on log time per step of the runs"


def run_speedup_stats(
    a: Sequence[float], b: Sequence[float], confidence_pct: float = CONFIDENCE_PCT
) -> RunSpeedupStats:
    """Welch's t on the logs of the runs' times per step (``a``: before, ``b``: after).

    Figures that are not positive and finite are left out (a run without a judged step gives
    none). One run a side gives the ratio without an interval."""
    xa = np.log(np.asarray([v for v in a if math.isfinite(v) and v > 0], dtype=np.float64))
    xb = np.log(np.asarray([v for v in b if math.isfinite(v) and v > 0], dtype=np.float64))
    if len(xa) == 0 or len(xb) == 0:
        return RunSpeedupStats(None, None, None, None, None, None, None, len(xa), len(xb), confidence_pct)
    ma, mb = float(np.mean(xa)), float(np.mean(xb))
    lo = hi = p = df = None
    if len(xa) >= 2 and len(xb) >= 2 and (np.ptp(xa) > 0 or np.ptp(xb) > 0):
        res = sps.ttest_ind(xa, xb, equal_var=False)
        ci = res.confidence_interval(confidence_level=confidence_pct / 100.0)
        if math.isfinite(ci.low) and math.isfinite(ci.high) and math.isfinite(res.pvalue):
            lo, hi = math.exp(float(ci.low)), math.exp(float(ci.high))
            p, df = float(res.pvalue), float(res.df)
    return RunSpeedupStats(
        speedup=math.exp(ma - mb),
        ci_low=lo,
        ci_high=hi,
        p_value=p,
        df=df,
        mean_a=math.exp(ma),
        mean_b=math.exp(mb),
        runs_a=len(xa),
        runs_b=len(xb),
        confidence_pct=confidence_pct,
    )
