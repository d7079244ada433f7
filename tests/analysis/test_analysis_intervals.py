"""Interval arithmetic, checked against a brute-force unit-grid model."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpudoctor.analysis import intervals as iv


def grid(s, e, n=200) -> np.ndarray:
    g = np.zeros(n, bool)
    for a, b in zip(s, e, strict=True):
        g[a:b] = True
    return g


def random_set(rng: random.Random, k: int, n: int = 200):
    s = [rng.randrange(0, n - 1) for _ in range(k)]
    e = [min(n, a + rng.randrange(0, 30)) for a in s]
    return np.array(s), np.array(e)


@pytest.mark.parametrize("seed", range(20))
def test_union_intersect_subtract_gaps_match_a_grid(seed):
    rng = random.Random(seed)
    a = random_set(rng, rng.randrange(0, 12))
    b = random_set(rng, rng.randrange(0, 12))
    ua, ub = iv.union(*a), iv.union(*b)
    ga, gb = grid(*a), grid(*b)
    assert np.array_equal(grid(*ua), ga)
    assert iv.total(*ua) == ga.sum()
    assert np.all(ua[0][1:] > ua[1][:-1])  # disjoint, not touching
    assert np.array_equal(grid(*iv.intersect(*ua, *ub)), ga & gb)
    assert np.array_equal(grid(*iv.subtract(*ua, *ub)), ga & ~gb)
    lo, hi = 20, 180
    gs, ge = iv.gaps(*ua, lo, hi)
    want = ~ga
    want[:lo] = False
    want[hi:] = False
    assert np.array_equal(grid(gs, ge), want)
    cov = iv.Coverage(*ua)
    for x, y in [(0, 200), (5, 17), (50, 51), (100, 90)]:
        assert cov.covered(x, y) == (ga[x:y].sum() if y > x else 0)


def test_union_reports_the_first_interval_of_each_group():
    s, e, first = iv.union(np.array([50, 0, 5, 100]), np.array([60, 10, 20, 110]), with_first=True)
    assert s.tolist() == [0, 50, 100] and e.tolist() == [20, 60, 110]
    assert first.tolist() == [1, 0, 3]


def test_gaps_in_touching_windows_are_cut_at_the_boundary():
    s, e = np.array([2, 14]), np.array([4, 16])
    g_s, g_e, w = iv.gaps_in_windows(s, e, np.array([0, 10]), np.array([10, 20]))
    assert list(zip(g_s.tolist(), g_e.tolist(), w.tolist(), strict=True)) == [
        (0, 2, 0), (4, 10, 0), (10, 14, 1), (16, 20, 1)
    ]


def test_any_overlap_is_closed_at_both_ends():
    cov = iv.Coverage(np.array([10]), np.array([20]))
    assert cov.any_overlap(np.array([20, 0, 21]), np.array([30, 10, 30])).tolist() == [True, True, False]


def test_clip_and_empty_inputs():
    assert iv.total(*iv.clip(np.array([0, 10]), np.array([5, 20]), 3, 12)) == 4
    assert iv.total(*iv.union(np.zeros(0), np.zeros(0))) == 0
    assert iv.intersect(np.zeros(0), np.zeros(0), np.array([1]), np.array([2]))[0].size == 0
    assert iv.gaps(np.zeros(0, np.int64), np.zeros(0, np.int64), 0, 5)[1].tolist() == [5]


@pytest.mark.parametrize("seed", range(10))
def test_nesting_order_is_lexsort_by_thread_start_and_longer_first(seed):
    rng = np.random.default_rng(seed)
    for n in (0, 1, 2, 7, 300):
        ts = rng.integers(0, 25, n)  # many equal starts
        end = ts + rng.integers(0, 6, n)
        for thread in (rng.integers(-2, 3, n), rng.integers(0, 1 << 40, n)):
            assert np.array_equal(iv.nesting_order(ts, end, thread), np.lexsort((-end, ts, thread)))
        assert np.array_equal(iv.nesting_order(ts, end), np.lexsort((-end, ts)))


def test_nesting_order_on_nearly_sorted_starts_with_ties():
    # a trace's layout: starts nearly in order, runs of ops that start together, two threads
    rng = np.random.default_rng(1)
    ts = np.sort(rng.integers(0, 5000, 4000))
    ts[::97] -= 3  # a few out of order
    end = ts + rng.integers(0, 400, 4000)
    thread = np.where(rng.random(4000) < 0.9, 11, 12)
    assert np.array_equal(iv.nesting_order(ts, end, thread), np.lexsort((-end, ts, thread)))
