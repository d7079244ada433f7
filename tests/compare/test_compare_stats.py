"""The noise judgement's statistics: Mann–Whitney U (exact and normal) and the bootstrap interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpudoctor.analysis.compare import _u_distribution, bootstrap_speedup_ci, mann_whitney_p


def test_u_distribution_counts_every_ordering() -> None:
    for m, n in ((1, 1), (2, 3), (4, 4), (5, 7)):
        dist = _u_distribution(m, n)
        assert len(dist) == m * n + 1
        assert dist.sum() == math.comb(m + n, m)
        assert np.allclose(dist, dist[::-1])  # symmetric


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


def test_agrees_with_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    for m, n, shift in ((8, 9, 0.3), (12, 12, 0.0), (20, 25, 0.5), (60, 70, 0.2)):
        a = rng.normal(0, 1, m)
        b = rng.normal(shift, 1, n)
        p, method = mann_whitney_p(a, b)
        exact = "exact" in method
        ref = scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method="exact" if exact else "asymptotic",
                                       use_continuity=True).pvalue
        assert p == pytest.approx(ref, rel=1e-6, abs=1e-12), (m, n, method)


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
