"""analysis.load: the training's own CPU against everything else on the machine (host_load, free_cores), and
the step's own work warm and cold (step_compute)."""

from __future__ import annotations

import pytest

from gpudoctor.analysis.load import free_cores, host_load, step_compute
from gpudoctor.model import HostSample, ProcessSample, Samples, StepRecord

MS = 1_000_000


def _tick(t_ms: int, main: float, worker: float, system: float, wait: float | None = 10.0) -> tuple:
    t = t_ms * MS
    return (
        [ProcessSample(t, 1, "main", main, 1, 4, runq_wait_pct=wait), ProcessSample(t, 2, "worker", worker, 1, 1)],
        [HostSample(t, system, steal_pct=2.0, procs_running=3)],
    )


def _samples(*ticks: tuple) -> Samples:
    return Samples(process=tuple(p for t in ticks for p in t[0]), host=tuple(h for t in ticks for h in t[1]),
                   system_cpu_count=2)


def test_others_are_the_machine_less_the_training_tree():
    s = _samples(_tick(100, 90.0, 40.0, 190.0), _tick(200, 80.0, 30.0, 170.0, wait=30.0))
    load = host_load(s)
    assert load.samples == 2 and load.cores == 2
    assert load.training_cpu_pct == 120.0  # (130 + 110) / 2
    assert load.system_cpu_pct == 180.0 and load.others_cpu_pct == 60.0
    assert load.runq_wait_pct == 20.0 and load.steal_pct == 2.0 and load.procs_running == 3.0


def test_a_span_keeps_only_its_samples_and_others_never_go_negative():
    s = _samples(_tick(100, 90.0, 40.0, 190.0), _tick(200, 100.0, 50.0, 140.0))  # psutil's two clocks differ
    load = host_load(s, 150 * MS, 250 * MS)
    assert load.samples == 1 and load.others_cpu_pct == 0.0


def test_without_host_samples_only_the_training_is_known():
    s = Samples(process=_tick(100, 90.0, 40.0, 0.0)[0], system_cpu_count=2)
    load = host_load(s)
    assert load.training_cpu_pct == pytest.approx(130.0) and load.others_cpu_pct is None and load.system_cpu_pct is None


def test_nothing_in_the_span_is_none():
    assert host_load(None) is None
    assert host_load(_samples(_tick(100, 90.0, 40.0, 190.0)), 500 * MS, 600 * MS) is None


# ---------------------------------------------------------------- step_compute: the loop's warm compute

def _steps(computes_ms: list[float], wait_ms: float = 30.0) -> tuple[StepRecord, ...]:
    return tuple(StepRecord(index=i, start_ns=i * 100 * MS, wall_ns=int((c + wait_ms) * MS), data_wait_ns=int(wait_ms * MS))
                 for i, c in enumerate(computes_ms))


def test_step_compute_takes_a_low_quantile_as_warm_and_the_least_as_floor():
    # issue 42's shape: a few warm steps (1.3 ms), most cold after their wait (11.3 ms)
    comp = step_compute(_steps([1.3] * 3 + [11.3] * 17 + [0.9]), quantile_pct=10.0)
    assert comp.steps == 21 and comp.quantile_pct == 10.0
    assert comp.warm_ns == pytest.approx(1.3 * MS)
    assert comp.cold_ns == pytest.approx(11.3 * MS) and comp.least_ns == pytest.approx(0.9 * MS)
    assert comp.mean_ns == pytest.approx((3 * 1.3 + 17 * 11.3 + 0.9) / 21 * MS)
    assert comp.cold_ratio == pytest.approx(11.3 / 1.3)


def test_step_compute_of_a_steady_loop_is_its_compute_and_counts_micro_batches():
    comp = step_compute(_steps([20.0] * 10), micro=4)
    assert comp.warm_ns == comp.cold_ns == comp.least_ns == pytest.approx(5.0 * MS) and comp.cold_ratio == 1.0


def test_step_compute_interpolates_and_clamps_the_quantile_and_a_wait_beyond_the_step_counts_whole():
    comp = step_compute(_steps([1.0, 2.0, 3.0, 4.0, 5.0]), quantile_pct=25.0)
    assert comp.warm_ns == pytest.approx(2.0 * MS)  # numpy's linear interpolation
    assert step_compute(_steps([1.0, 5.0]), quantile_pct=250.0).warm_ns == pytest.approx(5.0 * MS)
    odd = StepRecord(index=0, start_ns=0, wall_ns=10 * MS, data_wait_ns=12 * MS)  # a wait recorded past the step
    assert step_compute((odd,)).least_ns == 0.0
    assert step_compute(()) is None


def test_free_cores_are_the_cores_others_left():
    s = _samples(_tick(100, 50.0, 0.0, 214.0))
    assert free_cores(host_load(s), 2) == pytest.approx(2 - 1.64)
    assert free_cores(host_load(s), None) is None and free_cores(None, 2) is None
    assert free_cores(host_load(_samples(_tick(100, 50.0, 0.0, 600.0))), 2) == 0.0
