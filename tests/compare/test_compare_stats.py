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
    assert st.p_value is None and st.ci_low is not None and st.ci_low > 1.5 and st.significant
    assert st == stratified_speedup_stats((a_first, a_rest), (b_first, b_rest))  # fixed seed
    # without the epoch starts it is the plain ratio of medians
    plain = stratified_speedup_stats(((), a_rest), ((), b_rest))
    assert plain.speedup == pytest.approx(float(np.median(a_rest) / np.median(b_rest)))
    with pytest.raises(ValueError):
        stratified_speedup_stats(((), ()), ((), b_rest))
