"""The noise judgement's statistics (``analysis.stats``, on scipy.stats): Mann–Whitney U and the bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

from gpudoctor.analysis.compare import bootstrap_speedup_ci, mann_whitney_p
from gpudoctor.analysis.stats import speedup_stats, stratified_speedup_stats


def test_exact_p_of_complete_separation() -> None:
    # 3 vs 3, fully separated: one ordering of 20 at each extreme, two-sided p = 2/20
    p, method = mann_whitney_p([1, 2, 3], [4, 5, 6])
    assert method == "Mann–Whitney U (exact)"
    assert p == pytest.approx(0.1)
    p, _ = mann_whitney_p([4, 5, 6], [1, 2, 3])
    assert p == pytest.approx(0.1)


def test_exact_p_of_interleaved_samples_is_one() -> None:
    p, _ = mann_whitney_p([1, 4, 5, 8], [2, 3, 6, 7])
    assert p == pytest.approx(1.0)


def test_ties_switch_to_the_corrected_normal_approximation() -> None:
    p, method = mann_whitney_p([1, 1, 2, 2, 3], [2, 3, 3, 4, 4])
    assert "normal approximation" in method and "ties" in method
    assert 0 < p < 1


def test_identical_constant_samples_give_p_one() -> None:
    p, _ = mann_whitney_p([5.0] * 6, [5.0] * 6)
    assert p == 1.0


def test_large_samples_use_the_normal_approximation() -> None:
    rng = np.random.default_rng(7)
    p, method = mann_whitney_p(rng.normal(0, 1, 60), rng.normal(0.2, 1, 70))
    assert method == "Mann–Whitney U (normal approximation)"
    assert 0 < p < 1


def test_bootstrap_interval_covers_the_true_ratio_and_is_deterministic() -> None:
    rng = np.random.default_rng(3)
    a = 100 * (1 + rng.uniform(-0.05, 0.05, 40))
    b = 50 * (1 + rng.uniform(-0.05, 0.05, 40))
    lo, hi = bootstrap_speedup_ci(a, b)
    assert lo < 2.0 < hi
    assert hi - lo < 0.2
    assert (lo, hi) == bootstrap_speedup_ci(a, b)  # fixed seed


def test_bootstrap_interval_of_one_distribution_includes_one() -> None:
    rng = np.random.default_rng(5)
    x = 100 * (1 + rng.uniform(-0.1, 0.1, 60))
    lo, hi = bootstrap_speedup_ci(x[:30], x[30:])
    assert lo < 1.0 < hi


def test_empty_samples_are_refused() -> None:
    with pytest.raises(ValueError):
        mann_whitney_p([], [1.0])
    with pytest.raises(ValueError):
        bootstrap_speedup_ci([1.0], [])


def test_long_runs_are_resampled_from_steps_spread_over_the_run() -> None:
    rng = np.random.default_rng(11)
    a = 100 * (1 + rng.uniform(-0.05, 0.05, 12_000))
    b = 80 * (1 + rng.uniform(-0.05, 0.05, 9_000))
    lo, hi = bootstrap_speedup_ci(a, b)
    assert lo < 1.25 < hi
    assert hi - lo < 0.02


def test_zero_medians_give_no_interval() -> None:
    st = speedup_stats([0.0] * 8, [0.0] * 8)
    assert st.speedup is None and st.change_pct is None
    assert st.ci_low is None and st.ci_high is None
    assert not st.significant


def test_speedup_stats_of_a_clear_speed_up() -> None:
    rng = np.random.default_rng(2)
    a = 30e6 * (1 + rng.uniform(-0.1, 0.1, 25))
    b = 20e6 * (1 + rng.uniform(-0.1, 0.1, 25))
    st = speedup_stats(a, b)
    assert st.speedup == pytest.approx(1.5, rel=0.08)
    assert st.ci_low is not None and st.ci_low > 1.3
    assert st.significant
    assert st.change_pct is not None and st.change_pct < -25


def test_stratified_speedup_weighs_each_stratum_by_its_share() -> None:
    rng = np.random.default_rng(4)
    # A: 1 step in 8 costs 500 ms (an epoch start), the others 50 ms; B: every step 50 ms
    a_first, a_rest = 500 * (1 + rng.uniform(-0.05, 0.05, 6)), 50 * (1 + rng.uniform(-0.05, 0.05, 42))
    b_first, b_rest = 50 * (1 + rng.uniform(-0.05, 0.05, 6)), 50 * (1 + rng.uniform(-0.05, 0.05, 42))
    st = stratified_speedup_stats((a_first, a_rest), (b_first, b_rest))
    assert st.speedup == pytest.approx((500 / 8 + 50 * 7 / 8) / 50, rel=0.05)
    # the interval and the test come from the same resamples: none of them at or under 1×
    assert st.p_value == 0.0 and st.ci_low is not None and st.ci_low > 1.5 and st.significant
    assert st == stratified_speedup_stats((a_first, a_rest), (b_first, b_rest))  # fixed seed
    # without the epoch starts it is the plain ratio of medians
    plain = stratified_speedup_stats(((), a_rest), ((), b_rest))
    assert plain.speedup == pytest.approx(float(np.median(a_rest) / np.median(b_rest)))
    with pytest.raises(ValueError):
        stratified_speedup_stats(((), ()), ((), b_rest))


# --------------------------------------------------------------------------- one decision: the interval and its test


def test_the_interval_and_its_test_are_one_decision() -> None:
    """The interval excludes 1× exactly when the test from its resamples rejects, at every level: pairs of
    samples from no change to a clear one, small and large, unimodal and bimodal."""
    rng = np.random.default_rng(21)
    seen = set()
    for k in range(36):
        n = (6, 15, 40)[k % 3]
        shift = (1.0, 1.03, 1.1, 1.4)[k % 4]
        a = 20 * np.exp(rng.normal(0, 0.15, n)) * np.where(rng.uniform(size=n) < 0.3 * (k % 2), 2.0, 1.0)
        b = 20 / shift * np.exp(rng.normal(0, 0.15, n + 3))
        for conf in (90.0, 95.0, 99.0):
            st = speedup_stats(a, b, conf, resamples=400)
            excludes = st.ci_low > 1.0 or st.ci_high < 1.0
            assert st.significant == excludes == (st.p_value < 1 - conf / 100), (k, conf, st)
            seen.add(excludes)
    assert seen == {True, False}  # both decisions were taken


def _bimodal(fast: int, base_ms: float, n: int = 21) -> list[int]:
    """``n`` steps, ``fast`` of them about ``base_ms`` and the rest about 2.2× (a loop with two kinds of step)."""
    return [int((base_ms + 0.1 * i) * 1e6) for i in range(fast)] + \
           [int((2.2 * base_ms + 0.1 * i) * 1e6) for i in range(n - fast)]


def test_compares_verdict_does_not_contradict_its_own_figures() -> None:
    """The issue's case: "Within noise: … 0.46×, 95% CI 0.42×–2.17×, p = 0.020". Bimodal steps (A: 15 of
    21 fast, B: 7 of 21): the medians fall in different modes (0.49×), a rank test of the steps rejects
    (p = 0.03), and the interval of the median's ratio spans 1×. The verdict's p is the interval's own
    test now: within noise, and p says so."""
    from gpudoctor.analysis.compare.steps import StepBasis, step_change
    from gpudoctor.model import StepTimeVerdict

    a, b = _bimodal(15, 10.0), _bimodal(7, 10.05)
    assert mann_whitney_p(a, b)[0] < 0.05  # what the verdict printed before
    basis = StepBasis("plain_steps", "wall time", a, b, "21 steps", "21 steps", [], [])
    got = step_change(basis, None, None, min_steps=10, min_change_pct=5.0, confidence_pct=95.0, resamples=2000)
    assert got.verdict == StepTimeVerdict.WITHIN_NOISE
    assert got.ci_low < 1.0 < got.ci_high and got.p_value >= 0.05
    assert "Within noise" in got.verdict_text and f"p = {got.p_value:.3f}" in got.verdict_text
    assert "interval includes 1×: p ≥ 0.05" in got.verdict_text
    # one side's steps all in the slow mode: the interval excludes 1×, the test rejects, the verdict says slower
    slower = step_change(StepBasis("plain_steps", "wall time", a, _bimodal(0, 10.05), "21", "21", [], []),
                         None, None, min_steps=10, min_change_pct=5.0, confidence_pct=95.0, resamples=2000)
    assert slower.verdict == StepTimeVerdict.SLOWER and slower.ci_high < 1.0 and slower.p_value < 0.05
