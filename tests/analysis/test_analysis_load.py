"""analysis.load.host_load: the training's own CPU against everything else on the machine."""

from __future__ import annotations

import pytest

from gpudoctor.analysis.load import host_load
from gpudoctor.model import HostSample, ProcessSample, Samples

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
