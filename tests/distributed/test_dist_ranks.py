"""analysis.ranks: per-rank rows and the cross-rank comparison (work = step time - exposed communication)."""

from __future__ import annotations

import dataclasses

import pytest
from dist_builders import rank_trace, synchronized
from rule_builders import MS, dataloader, manifest, run, settings, steps

from gpudoctor.analysis.figures import run_figures
from gpudoctor.analysis.ranks import rank_figures
from gpudoctor.config import Thresholds

TH = Thresholds()


def figures(data, **kw):
    args = dict(delay_share_pct=TH.straggler_delay_share_pct, consistency_pct=TH.straggler_consistency_pct,
                min_steps=TH.straggler_min_steps)
    args.update(kw)
    return rank_figures(data, **args)


def test_the_straggler_is_the_rank_with_the_most_work_not_the_longest_steps():
    fig = figures(run(metrics=synchronized(slow_rank=2)))
    s = fig.summary
    assert s.basis == "work" and s.ranks == 3 and s.world_size == 3 and s.compared_steps == 5
    assert s.step_imbalance == pytest.approx(1.0, abs=0.01)  # step times are equal: synchronized
    assert s.slowest_rank == 2 and s.straggler_rank == 2 and s.slowest_in_steps == 5
    assert s.slowest_excess_ns == pytest.approx(20 * MS, rel=0.01)
    assert s.slowest_excess_pct == pytest.approx(100 * 20 / 32.2, rel=0.01)
    assert s.work_imbalance == pytest.approx(30.2 / 10.25, rel=0.01)
    assert [r.rank for r in fig.rows] == [0, 1, 2] and [r.straggler for r in fig.rows] == [False, False, True]
    r0 = fig.rows[0]
    assert r0.step_source == "trace" and r0.steps == r0.profiled_steps == 5
    assert r0.work_median_ns == pytest.approx(10.2 * MS, rel=0.01)
    assert r0.comm_exposed_pct == pytest.approx(100 * (32.2 - 10.2) / 32.2, rel=0.02)
    assert r0.traces == ("host_1000.00000010.pt.trace.json.gz",)


def test_equal_ranks_have_no_straggler():
    s = figures(run(metrics=synchronized(slow_rank=None))).summary
    assert s.straggler_rank is None and s.slowest_excess_pct < 1.0
    assert s.slowest_rank is not None  # there is always a slowest one; it is not a straggler


def test_a_rank_slow_only_now_and_then_is_not_consistent():
    ranks = list(synchronized(slow_rank=None, world=2))
    # rank 1 is much slower in one step of five only: the median and the per-step count both say no
    step = [12.0, 12.1, 40.0, 12.3, 12.4]
    ranks[1] = rank_trace(1, 2, step, [2.0, 2.0, 2.0, 2.0, 2.0])
    ranks[0] = rank_trace(0, 2, step, [2.0, 2.0, 30.0, 2.0, 2.0])
    s = figures(run(metrics=tuple(ranks))).summary
    assert s.straggler_rank is None


def test_consistency_threshold_is_read():
    data = run(metrics=synchronized(slow_rank=1, world=2, extra_ms=3.0))
    assert figures(data).summary.straggler_rank == 1
    assert figures(data, delay_share_pct=50.0).summary.straggler_rank is None
    assert figures(data, min_steps=6).summary.straggler_rank is None  # only 5 steps compared


def test_steps_only_compares_step_times_and_says_what_it_cannot_see():
    recs = []
    for r, wall in ((0, 100.0), (1, 100.0), (2, 130.0)):
        recs += [dataclasses.replace(s, rank=r) for s in steps(n=10, wall_ms=wall)]
    s = figures(run(manifest=manifest(world_size=3), steps=tuple(recs))).summary
    assert s.basis == "step" and s.slowest_rank == 2 and s.straggler_rank == 2 and s.compared_steps == 9
    assert any("synchronized training" in n for n in s.notes)
    fig = figures(run(manifest=manifest(world_size=3), steps=tuple(recs)))
    assert [r.step_source for r in fig.rows] == ["steps"] * 3 and fig.rows[0].steps == 9  # first step left out


def test_steps_rows_prefer_the_run_records_for_step_times():
    recs = tuple(dataclasses.replace(s, rank=r) for r in range(3) for s in steps(n=8, wall_ms=50.0))
    fig = figures(run(manifest=manifest(world_size=3), steps=recs, metrics=synchronized(slow_rank=0)))
    assert fig.summary.basis == "work" and fig.summary.straggler_rank == 0
    assert fig.rows[0].step_median_ns == 50 * MS and fig.rows[0].steps == 7
    assert fig.rows[0].profiled_steps == 5


def test_single_process_has_no_rank_figures():
    assert figures(run(steps=steps())).rows == ()
    assert figures(run()).summary is None


def test_mixed_jobs_and_unranked_traces_are_not_compared(tmp_path):
    a = rank_trace(0, 16, [200.0] * 5, [30.0] * 5)
    b = rank_trace(0, 2, [220.0] * 3, [10.0] * 3)
    c = rank_trace(3, 8, [77.0] * 6, [14.0] * 6)
    lone = dataclasses.replace(a, rank=None, world_size=None, path="mi300x.json.gz")
    fig = figures(run(metrics=(a, b, c, lone)))
    assert [(r.rank, r.world_size) for r in fig.rows] == [(0, 16), (0, 2), (3, 8)]
    s = fig.summary
    assert s.ranks == 1 and s.slowest_rank is None and s.straggler_rank is None
    text = " ".join(s.notes)
    assert "mi300x.json.gz" in text and "3 different jobs" in text and "1 of 16 ranks" in text


def test_several_windows_of_one_rank_are_one_row():
    w1 = rank_trace(0, 2, [10.0] * 3, [1.0] * 3, first_step=10)
    w2 = dataclasses.replace(rank_trace(0, 2, [12.0] * 3, [1.0] * 3, first_step=310), path="host_1000.00000310.pt.trace.json.gz")
    other = rank_trace(1, 2, [10.0] * 3, [1.0] * 3, first_step=10)
    fig = figures(run(metrics=(w1, w2, other)))
    assert fig.rows[0].profiled_steps == 6 and len(fig.rows[0].traces) == 2
    assert fig.summary.compared_steps == 3  # steps 310.. exist for rank 0 only


def _two_ranks(**kw):
    recs = tuple(dataclasses.replace(s, rank=r) for r in (0, 1) for s in steps(n=6, epochs=2))
    return run(steps=recs, **kw)


def test_each_rank_s_steps_are_its_steady_steps_in_the_run_s_figures():
    """A rank's row and the step basis read the run's figures (one definition of the steady steps): without
    the first step of each epoch and, with two DataLoader workers that start each epoch, the step that waits
    for the second worker's start-up."""
    data = _two_ranks()
    fig = figures(data)
    assert [r.steps for r in fig.rows] == [4, 4] and fig.summary.basis == "step"
    assert fig.summary.compared_steps == 4  # steps 1, 2, 4, 5 of both ranks
    workers = _two_ranks(settings=settings(dataloaders=(dataloader(num_workers=2),)))
    fig = figures(workers)
    assert [r.steps for r in fig.rows] == [2, 2] and fig.summary.compared_steps == 2  # steps 2 and 5
    stead = run_figures(workers)
    assert [len(stead.of(r.rank).steady) for r in fig.rows] == [r.steps for r in fig.rows]
    # the run's figures computed once by the caller are read as they are
    assert figures(workers, figures=run_figures(data)).rows[0].steps == 4


def test_an_excess_inside_the_others_jitter_is_not_a_straggler():
    # rank 1 is slower in every step by ~0.6 ms, but rank 0 itself varies by ~1 ms from step to step
    step = [6.0] * 5
    r0 = rank_trace(0, 2, step, [6.0 - w for w in (2.1, 3.4, 1.2, 2.2, 3.3)])
    r1 = rank_trace(1, 2, step, [6.0 - w for w in (2.7, 4.0, 1.8, 2.8, 3.9)])
    data = run(metrics=(r0, r1))
    s = figures(data, jitter_ratio=TH.straggler_excess_to_jitter_ratio).summary
    assert s.slowest_rank == 1 and s.slowest_in_steps == 5 and s.slowest_excess_pct > 5
    assert s.jitter_ns == pytest.approx(1.0 * MS, rel=0.01) and s.straggler_rank is None
    assert figures(data, jitter_ratio=0.5).summary.straggler_rank == 1
