"""Steady means settled (model/settle.py): a run whose step time changes beyond noise midway is split
where it changes, and its steady steps are the settled part's; on hand-built step records, and on every
recorded H200 run of tests/fixtures (and ../shared/gpu-runs where present), which must not be split."""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import pytest
from scipy import stats as sps

from gpudoctor.model import settle, steady
from gpudoctor.model.run import Settings, StepRecord

MS = 1_000_000
ROOT = Path(__file__).resolve().parents[2]


def _steps(times_ms, windows: dict[int, str] | None = None, *, rank: int | None = None, gpu: bool = False,
           seed: int = 0, noise: float = 0.03) -> tuple[StepRecord, ...]:
    """Steps of the given times (ms, multiplied by log-normal noise of ``noise``), marked by the optimizer;
    ``windows``: the instrument of some steps; ``gpu``: timed by CUDA events (the host enqueues in 1 ms)."""
    rng = random.Random(seed)
    out, t = [], 0
    for i, ms in enumerate(times_ms):
        ns = int(ms * MS * math.exp(rng.gauss(0.0, noise)))
        out.append(StepRecord(index=i, start_ns=t, wall_ns=MS if gpu else ns, gpu_ns=ns if gpu else None,
                              window=(windows or {}).get(i, ""), marker="optimizer", rank=rank))
        t += ns
    return tuple(out)


def _first_index(steps) -> int:
    return min(s.index for s in steps)


def test_a_loop_that_runs_20_slow_steps_then_settles_keeps_the_settled_steps() -> None:
    steps = _steps([200.0] * 20 + [10.0] * 20)
    found = steady.run_settling(steps, "optimizer", None)
    assert found is not None and found.settled and found.first_settled == 20
    assert [(p.first, p.last) for p in found.phases] == [(1, 19), (20, 39)]  # step 0 is a one-off of its own
    assert 190 * MS < found.phases[0].median_ns < 210 * MS and 9 * MS < found.phases[1].median_ns < 11 * MS
    assert found.p_value < settle.ALPHA
    kept = steady.steady_steps(steps, "optimizer", None)
    assert _first_index(kept) == 20 and len(kept) == 20
    assert found.text().startswith("steps 1–19 ran 19") and "steps 20–39 ran 10.0 ms" in found.text()
    assert "the figures are the settled part's" in found.text()
    figs = steady.step_figures(kept)
    assert figs.median_ms is not None and figs.median_ms < 11.0


def test_a_steady_noisy_loop_is_not_split() -> None:
    for seed in range(20):  # noise of 30%: no run of them is split
        steps = _steps([20.0] * 60, seed=seed, noise=0.3)
        assert steady.run_settling(steps, "optimizer", None) is None, seed
        assert len(steady.steady_steps(steps, "optimizer", None)) == 59


def test_a_small_change_is_not_a_settling() -> None:
    # 5% faster after step 20: detectable (little noise), but under MIN_RATIO
    steps = _steps([21.0] * 20 + [20.0] * 20, noise=0.005)
    assert steady.run_settling(steps, "optimizer", None) is None


def test_a_loop_that_slowed_down_late_is_named_but_not_cut() -> None:
    steps = _steps([10.0] * 25 + [30.0] * 15)
    found = steady.run_settling(steps, "optimizer", None)
    assert found is not None and not found.settled and found.first_settled is None
    assert found.phases[-1].first == 25
    assert "slowed down at step 25" in found.text() and "the figures are of both parts" in found.text()
    assert len(steady.steady_steps(steps, "optimizer", None)) == 39  # every step but the first


def test_instruments_alone_split_no_run() -> None:
    """A steady loop whose instrumented steps run slower (a detailed torch.profiler window at 10-15, cProfile
    at 16-33, a timings-only window at 34-39, as `profile --steps 40` lays them out): the windows' weight is
    no change of the loop."""
    windows = {10: "warmup", **{i: "active" for i in range(11, 16)}, **{i: "cprofile" for i in range(16, 34)},
               34: "warmup", **{i: "active" for i in range(35, 40)}}
    weight = {"": 1.0, "warmup": 1.5, "cprofile": 3.0}
    times = [10.0 * (4.0 if 11 <= i < 16 else weight.get(windows.get(i, ""), 1.2)) for i in range(40)]
    steps = _steps(times, windows)
    assert steady.run_settling(steps, "optimizer", None) is None


def test_a_change_seen_only_under_instruments_is_a_change_of_the_loop() -> None:
    """The same layout with a loop that sleeps 200 ms in its first 20 steps: its steps after 20 are all
    instrumented, and faster than the bare steps before: no instrument makes a step faster."""
    windows = {10: "warmup", **{i: "active" for i in range(11, 16)}, **{i: "cprofile" for i in range(16, 34)},
               34: "warmup", **{i: "active" for i in range(35, 40)}}
    steps = _steps([210.0 if i < 20 else 11.0 for i in range(40)], windows)
    found = steady.run_settling(steps, "optimizer", None)
    assert found is not None and found.settled and found.first_settled == 20


def test_a_loop_that_settles_in_stages_is_split_at_the_last() -> None:
    steps = _steps([80.0] * 12 + [30.0] * 14 + [10.0] * 20)
    found = steady.run_settling(steps, "optimizer", None)
    assert found is not None and found.settled
    # the split of least cost falls at 26 or at 12, then the later part is searched again: the last change
    assert found.first_settled == 26 and found.phases[-1].first == 26
    assert _first_index(steady.steady_steps(steps, "optimizer", None)) == 26


def test_cuda_events_time_the_split_and_ranks_split_together() -> None:
    # the host enqueues every step in 1 ms; the device's time per step drops at step 15, on both ranks
    steps = (_steps([50.0] * 15 + [20.0] * 25, gpu=True, rank=0, seed=1)
             + _steps([50.0] * 15 + [20.0] * 25, gpu=True, rank=1, seed=2))
    found = steady.run_settling(steps, "optimizer", None)
    assert found is not None and found.source == "CUDA events" and found.first_settled == 15
    assert "CUDA events" in found.text()
    kept = steady.steady_steps(steps, "optimizer", None)
    assert {s.rank for s in kept} == {0, 1} and {s.index for s in kept} == set(range(15, 40))


def test_too_short_a_run_is_never_split() -> None:
    steps = _steps([200.0] * 4 + [10.0] * 5)
    assert steady.run_settling(steps, "optimizer", None) is None
    assert len(steady.steady_steps(steps, "optimizer", None)) == 8


def test_mann_whitney_is_scipys_normal_approximation() -> None:
    rng = random.Random(3)
    samples = [
        ([rng.gauss(0, 1) for _ in range(30)], [rng.gauss(0.8, 1) for _ in range(12)]),
        ([1, 1, 2, 2, 3, 3, 3, 4], [2, 3, 3, 4, 4, 5, 5]),  # ties
        ([5.0, 6.0, 7.0, 8.0, 9.0], [1.0, 2.0, 3.0, 4.0, 4.5, 0.5]),
    ]
    for a, b in samples:
        p, above = settle.mann_whitney(a, b)
        ref = sps.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic", use_continuity=True)
        assert p == pytest.approx(ref.pvalue, rel=1e-9)
        assert above == pytest.approx(ref.statistic / (len(a) * len(b)))
    assert settle.mann_whitney([], [1.0]) == (1.0, 0.5)
    assert settle.mann_whitney([2.0, 2.0], [2.0, 2.0]) == (1.0, 0.5)


def test_the_split_is_the_one_of_least_within_part_cost_on_ranks() -> None:
    times = [9.0, 8.0, 9.5, 8.5, 9.2, 8.8, 1.0, 1.2, 0.9, 1.1, 1.05, 0.95]
    assert settle.best_split(times) == 6
    assert settle.best_split(times[:9]) is None  # each part needs MIN_PART steps


# --------------------------------------------------------------------------- the recorded runs


def _read(run: Path, name: str) -> str | None:
    for n in (name, name + ".gz"):
        p = run / n
        if p.is_file():
            return gzip.decompress(p.read_bytes()).decode() if n.endswith(".gz") else p.read_text()
    return None


def _recorded_runs() -> list[Path]:
    roots = [ROOT / "tests" / "fixtures", ROOT.parent / "shared" / "gpu-runs"]
    runs = {p.parent for r in roots if r.is_dir() for p in r.rglob("steps.jsonl*")}
    return sorted(runs)


def test_no_recorded_h200_run_is_split() -> None:
    runs = _recorded_runs()
    assert len(runs) >= 20  # tests/fixtures/gpu and gpu2 at least
    for run in runs:
        steps = tuple(StepRecord.from_dict(json.loads(line)) for line in (_read(run, "steps.jsonl") or "").splitlines()
                      if line.strip())
        mf = json.loads(_read(run, "manifest.json") or "{}")
        text = _read(run, "settings.json")
        settings = Settings.from_dict(json.loads(text)) if text else None
        found = steady.run_settling(steps, mf.get("step_source"), steady.main_dataloader(settings),
                                    steady.compile_steps(settings, steps))
        assert found is None, f"{run}: {found.text()}"
