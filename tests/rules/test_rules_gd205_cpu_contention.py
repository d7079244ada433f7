"""GD205 cpu-contention: other processes take the cores; it must fire on a busy machine only."""

from __future__ import annotations

import dataclasses

import pytest
from rule_builders import (
    MS,
    Samples,
    cpu_manifest,
    dataloader,
    judge,
    proc_samples,
    run,
    settings,
    steps,
)

from gpudoctor.model import HostSample, Severity
from gpudoctor.rules.results import Verdict


def _host(cpu_pct: float, n: int = 20, steal_pct: float | None = 0.0) -> tuple[HostSample, ...]:
    return tuple(HostSample(int(i * 100 * MS), cpu_pct, steal_pct, procs_running=3) for i in range(n))


def _busy(main: tuple[float, float], system_cpu_pct: float | None, cores: int = 2, workers: tuple[float, float] | None = None):
    """The training process at main = (cpu_pct, runq_wait_pct) beside a machine using ``system_cpu_pct``
    (every process, 100 = one core; None: no host samples, as in runs recorded before them)."""
    procs = proc_samples(main[0], runq_wait_pct=main[1])
    if workers is not None:
        procs += proc_samples(workers[0], role="worker", pid=201, runq_wait_pct=workers[1])
    host = _host(system_cpu_pct) if system_cpu_pct is not None else ()
    return run(manifest=cpu_manifest(cpu_count=cores), settings=settings(device_type="cpu", cpu_count=cores),
               steps=steps(20, 100.0), samples=Samples(process=procs, host=host, system_cpu_count=cores))


def test_gd205_fires_when_other_processes_take_the_cores():
    # measured on the 2-core machine: a CPU hog beside a CPU-bound loop, the loop runs half the time
    res = judge("GD205", _busy((50.0, 50.0), 200.0))
    assert res.verdict == Verdict.FIRED
    (f,) = res.findings
    assert f.severity == Severity.ERROR  # waited half the time: above the error scale's 20%
    assert "waited for a core 50.0% of the time" in f.message
    assert "other processes used 1.50 of the 2 cores" in f.message
    assert "taskset" in f.fix.instruction and "taskset" in f.fix.after
    metrics = {m.name: m.value for m in f.evidence.metrics}
    assert metrics["others_cpu_pct"] == 150.0 and metrics["runq_wait_pct"] == 50.0
    assert f.gain.share_pct is None and not f.gain.claims  # not a share of step time


def test_gd205_fires_without_host_samples_on_the_wait_alone():
    res = judge("GD205", _busy((60.0, 30.0), None))
    assert res.verdict == Verdict.FIRED
    assert "not recorded in this run" in res.findings[0].message


def test_gd205_is_fine_on_a_quiet_machine():
    # measured: 1-2.5% wait with other jobs on the other core
    res = judge("GD205", _busy((98.0, 2.0), 165.0))
    assert res.verdict == Verdict.FINE and "2.0% of the time" in res.reason


def test_gd205_stands_aside_when_the_training_oversubscribes_itself():
    # its own threads want 1.0 + 2 × 1.5 = 4 cores of 2: GD204's case
    res = judge("GD205", _busy((50.0, 50.0), 200.0, workers=(100.0, 200.0)))
    assert res.verdict == Verdict.NOT_APPLICABLE and "GD204" in res.reason


def test_gd205_does_not_blame_others_who_used_little():
    res = judge("GD205", _busy((80.0, 15.0), 100.0))  # the others used 0.2 cores
    assert res.verdict == Verdict.FINE and "only 0.20 cores" in res.reason


def test_gd205_cannot_judge_without_run_queue_figures():
    assert judge("GD205", _busy((80.0, None), 200.0)).verdict == Verdict.CANNOT_JUDGE
    assert judge("GD205", run(settings=settings())).verdict == Verdict.CANNOT_JUDGE


def test_gd205_thresholds_are_thresholds():
    assert judge("GD205", _busy((50.0, 50.0), 200.0), cpu_contention_wait_pct=60.0).verdict == Verdict.FINE
    assert judge("GD205", _busy((50.0, 50.0), 200.0), cpu_contention_others_pct=180.0).verdict == Verdict.FINE


def test_gd205_says_threads_when_more_than_one_waits():
    (f,) = judge("GD205", _busy((40.0, 120.0), 200.0)).findings  # summed over threads: 1.2 threads waiting
    assert "kept 1.2 threads waiting for a core on average" in f.message


def _loop(runq_wait_pct: float, system_cpu_pct: float, user_ms: float | None, workers: int = 0):
    """A 100 ms step waiting 60 ms for data, the training process at half a core waiting ``runq_wait_pct`` for
    one, the machine at ``system_cpu_pct``; ``user_ms`` the process's CPU per step (None: not measured)."""
    procs = proc_samples(50.0, runq_wait_pct=runq_wait_pct)
    if workers:
        procs += proc_samples(90.0, role="worker", pid=201, runq_wait_pct=runq_wait_pct)
    st = steps(20, 100.0, 60.0, user_ms=user_ms, sys_ms=0.0 if user_ms is not None else None)
    return run(manifest=cpu_manifest(cpu_count=2),
               settings=settings(device_type="cpu", cpu_count=2, dataloaders=(dataloader(num_workers=workers),)),
               steps=st, samples=Samples(process=procs, host=_host(system_cpu_pct), system_cpu_count=2))


def test_gd201_fires_beside_gd205_on_a_busy_machine():
    """Issue 42: a loop that waits for data (60 of 100 ms) while other processes hold the cores is still GD201's
    finding, at the same DataLoader, and says how busy the machine was; GD205 fires beside it. A waiting load
    (5 ms of CPU per 60 ms wait) needs no cores: its workers are sized as on a quiet machine."""
    busy, quiet = _loop(50.0, 200.0, 5.0), _loop(1.0, 60.0, 5.0)
    found = judge("GD201", busy)
    assert found.verdict == Verdict.FIRED and judge("GD205", busy).verdict == Verdict.FIRED
    (f,) = found.findings
    assert "(GD205)" in f.message and "1.50 cores" in f.message
    (q,) = judge("GD201", quiet).findings
    assert "GD205" not in q.message and judge("GD205", quiet).verdict != Verdict.FIRED
    assert f.location == q.location
    metric = {m.name: m.value for m in f.evidence.metrics}
    assert metric["load_kind"] == "waiting"
    assert metric["suggested_num_workers"] == {m.name: m.value for m in q.evidence.metrics}["suggested_num_workers"]


def test_gd201_sizes_a_computing_load_to_the_free_cores_and_leaves_full_workers_to_gd205():
    """A load whose CPU was not measured is sized as a computing one: to the cores the others left. Where the
    workers already use them, what the loading lacks is cores others hold (GD205's case), not workers."""
    (f,) = judge("GD201", _loop(50.0, 200.0, None)).findings
    metric = {m.name: m.value for m in f.evidence.metrics}
    assert metric["free_cores"] == 0.5 and metric["suggested_num_workers"] == 1
    assert any("cores other processes left free (0.50 of 2)" in n for n in f.evidence.notes)
    res = judge("GD201", _loop(50.0, 290.0, None, workers=1))
    assert res.verdict == Verdict.NOT_APPLICABLE and "(GD205)" in res.reason


def test_gd201_on_a_busy_machine_models_the_compute_as_measured():
    """Beside other processes' load, the step's work is slow for want of their cores, not only cold: workers do
    not give those back, so the model keeps the mean compute (a calibration run beside 1.7 busy cores: 0.88 ms
    warm, 76.6 ms mean, fixed trials at 64-92 ms); the bound still takes the least any step showed."""
    st = tuple(dataclasses.replace(s, wall_ns=s.wall_ns - (38 * MS if s.index % 5 == 2 else 0))
               for s in steps(20, 100.0, 60.0, user_ms=5.0, sys_ms=0.0))
    base = dict(manifest=cpu_manifest(cpu_count=2), steps=st,
                settings=settings(device_type="cpu", cpu_count=2, dataloaders=(dataloader(),)))
    busy = run(**base, samples=Samples(process=proc_samples(50.0, runq_wait_pct=50.0), host=_host(200.0),
                                       system_cpu_count=2))
    quiet = run(**base, samples=Samples(process=proc_samples(50.0, runq_wait_pct=1.0), host=_host(60.0),
                                        system_cpu_count=2))
    (b,) = judge("GD201", busy).findings
    (q,) = judge("GD201", quiet).findings
    compute = {f: {m.name: m.value for m in f.evidence.metrics}["compute_per_step_ns"] for f in (b, q)}
    assert compute[q] == pytest.approx(2 * MS, rel=0.05) and compute[b] > 30 * MS
    assert b.gain.expected_speedup < q.gain.expected_speedup
    assert b.gain.speedup_bound == pytest.approx(q.gain.speedup_bound)
    assert any("busy machine" in n and "the model takes the mean" in n for n in b.evidence.notes)
