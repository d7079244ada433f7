"""The statistics of ``--verify`` on simulated trial runs: the run as the unit, two looks, the error rate.

Each simulated run is what a trial run gives: a level of its own (another job on the machine, a
cache, a CPU frequency: the whole run slower or faster, lognormal) and steps around it that are
not independent (a slow phase lasts several steps, AR(1)). Its figure is its time per step. The
same functions ``gpudoctor.verify`` uses decide (``run_speedup_stats``, ``decide``,
``bonferroni_confidence_pct``), with the schedule ``measure`` follows: a look after 3 runs a
side, 3 more runs and a second look while undecided, each look at 97.5%. Deterministic (fixed
seeds); ``benchmarks/verify_aa.py`` measures the same on real runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpudoctor.analysis.stats import bonferroni_confidence_pct, run_speedup_stats, speedup_stats
from gpudoctor.model import VerifyStatus
from gpudoctor.verify import FASTER, NO_GAIN, SLOWER, STRADDLE, decide

ALPHA = 0.05
MIN = 1.05  # Thresholds.verify_min_speedup_ratio
LOOK = bonferroni_confidence_pct(100 * (1 - ALPHA), 2)


def _runs(rng: np.random.Generator, n: int, step_ms: float, run_sd: float = 0.05, steps: int = 25,
          step_sd: float = 0.1, rho: float = 0.7) -> list[np.ndarray]:
    """``n`` runs of ``steps`` step times: a lognormal level per run, AR(1) noise within it."""
    level = step_ms * np.exp(rng.normal(0.0, run_sd, (n, 1)))
    shocks = rng.normal(0.0, step_sd, (n, steps))
    e = np.empty((n, steps))
    e[:, 0] = shocks[:, 0]
    for i in range(1, steps):  # each step keeps rho of the one before: a slow phase lasts
        e[:, i] = rho * e[:, i - 1] + np.sqrt(1 - rho * rho) * shocks[:, i]
    return list(level * np.exp(e))


def _session(rng: np.random.Generator, true_ratio: float, first: int = 3, most: int = 6, **kw):
    """One verify of one fix: (status, kind, ci) after the first look and, while undecided, a second."""
    base = _runs(rng, most, 20.0 * true_ratio, **kw)
    fix = _runs(rng, most, 20.0, **kw)
    for n in (first, most):
        st = run_speedup_stats([r.mean() for r in base[:n]], [r.mean() for r in fix[:n]], LOOK)
        status, kind = decide(st.speedup, st.ci_low, st.ci_high, MIN)
        if kind != STRADDLE:
            break
    return status, kind, (st.ci_low, st.ci_high), st.speedup


def test_bonferroni_shares_the_error_rate() -> None:
    assert bonferroni_confidence_pct(95.0, 1) == 95.0
    assert bonferroni_confidence_pct(95.0, 2) == 97.5
    assert bonferroni_confidence_pct(95.0, 4) == pytest.approx(98.75)
    with pytest.raises(ValueError):
        bonferroni_confidence_pct(95.0, 0)


def test_decide_covers_every_case() -> None:
    assert decide(1.3, 1.1, 1.5, MIN) == (VerifyStatus.CONFIRMED, FASTER)
    assert decide(1.03, 1.01, 1.05, MIN)[1] == STRADDLE  # faster beyond noise, but not by the minimum: not yet
    assert decide(1.02, 1.01, 1.04, MIN) == (VerifyStatus.REFUTED, NO_GAIN)
    assert decide(0.8, 0.7, 0.9, MIN) == (VerifyStatus.REFUTED, SLOWER)
    assert decide(0.97, 0.96, 0.98, MIN) == (VerifyStatus.REFUTED, NO_GAIN)  # slower, but by less than 1.05×
    assert decide(1.0, 0.9, 1.1, MIN) == (VerifyStatus.INCONCLUSIVE, STRADDLE)


def test_run_speedup_stats_edges() -> None:
    one = run_speedup_stats([30.0], [20.0])
    assert one.speedup == pytest.approx(1.5) and one.ci_low is None and one.p_value is None
    none = run_speedup_stats([0.0, float("nan")], [20.0, 21.0])
    assert none.speedup is None and none.runs_a == 0
    flat = run_speedup_stats([30.0, 30.0], [20.0, 20.0])  # no spread at all: no interval to form
    assert flat.speedup == pytest.approx(1.5) and flat.ci_low is None
    st = run_speedup_stats([30.0, 31.0, 29.0], [20.0, 20.5, 19.5])
    assert st.ci_low < st.speedup < st.ci_high and st.df > 1 and st.p_value < 0.01


def test_aa_false_confirms_stay_under_alpha_and_never_slower_beyond_it() -> None:
    """The same script both sides, 1000 times: confirmed at most α/2 (one tail of the interval, over
    both looks), called slower far less (the whole interval must lie under 1/1.05)."""
    rng = np.random.default_rng(25)
    kinds = [_session(rng, 1.0)[1] for _ in range(1000)]
    confirmed = kinds.count(FASTER) / len(kinds)
    slower = kinds.count(SLOWER) / len(kinds)
    assert confirmed <= ALPHA / 2 and slower <= ALPHA / 5
    assert kinds.count(STRADDLE) + kinds.count(NO_GAIN) >= 0.95 * len(kinds)


def test_aa_with_a_busy_machine_spreading_the_runs() -> None:
    """A CPU hog beside the runs: each run's level varies 4× more (σ 20%); still no false confirm
    beyond α, and the spread shows as a wider interval, not as a verdict."""
    rng = np.random.default_rng(26)
    out = [_session(rng, 1.0, run_sd=0.2) for _ in range(600)]
    assert sum(k == FASTER for _, k, _, _ in out) / len(out) <= ALPHA / 2
    assert sum(k == SLOWER for _, k, _, _ in out) / len(out) <= ALPHA / 2


def test_a_planted_effect_is_confirmed_and_covered() -> None:
    """A fix worth 1.5×: confirmed nearly always, and the interval covers 1.5 in ≥ 95% of sessions
    whichever look stopped (Bonferroni over the two looks)."""
    rng = np.random.default_rng(27)
    out = [_session(rng, 1.5) for _ in range(600)]
    covered = sum(lo <= 1.5 <= hi for _, _, (lo, hi), _ in out) / len(out)
    confirmed = sum(s == VerifyStatus.CONFIRMED for s, _, _, _ in out) / len(out)
    assert covered >= 0.95 and confirmed >= 0.98


def test_a_small_effect_takes_the_second_look() -> None:
    """1.12× with runs that differ by 5%: often undecided after 3 runs a side, decided after 6."""
    rng = np.random.default_rng(28)
    first = [_session(rng, 1.12, most=3) for _ in range(400)]
    rng = np.random.default_rng(28)
    both = [_session(rng, 1.12) for _ in range(400)]
    undecided_first = sum(k == STRADDLE for _, k, _, _ in first)
    undecided_both = sum(k == STRADDLE for _, k, _, _ in both)
    assert undecided_both < 0.6 * undecided_first
    assert all(k != SLOWER for _, k, _, _ in both)


def test_pooling_steps_as_independent_confirms_what_is_not_there() -> None:
    """Why the run is the unit: on the same A/A runs, the pooled steps' interval (compare's, 75 steps a
    side as if independent) excludes 1 far more often than α; the runs' interval does not."""
    rng = np.random.default_rng(29)
    pooled_wrong = runs_wrong = 0
    n = 150
    for _ in range(n):
        a, b = _runs(rng, 3, 20.0), _runs(rng, 3, 20.0)
        st = speedup_stats(np.concatenate(a), np.concatenate(b), 95.0, resamples=400)
        pooled_wrong += st.ci_low > 1.0 or st.ci_high < 1.0
        rs = run_speedup_stats([r.mean() for r in a], [r.mean() for r in b], 95.0)
        runs_wrong += rs.ci_low > 1.0 or rs.ci_high < 1.0
    assert pooled_wrong / n > 0.3  # a run-to-run spread of 5% is no noise to 75 "independent" steps
    assert runs_wrong / n <= 0.1
