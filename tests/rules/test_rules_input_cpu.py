"""GD201–GD204 and GD503: the input pipeline and the CPU side; these judge CPU-only runs too."""

from __future__ import annotations

import dataclasses

import pytest
from rule_builders import (
    MS,
    GapCause,
    PstatsEntry,
    Samples,
    cpu_manifest,
    cpu_trace,
    dataloader,
    judge,
    manifest,
    proc_samples,
    run,
    settings,
    steps,
    trace,
    utilization,
)

from gpudoctor.analysis.loader import COMPUTING, Load
from gpudoctor.config import Thresholds
from gpudoctor.model import DispatchStats, Severity, WindowKind
from gpudoctor.rules.load_model import plan_workers
from gpudoctor.rules.results import Verdict

# ---------------------------------------------------------------- GD201 dataloader-stall


def _cpu_run(**kw):
    base = dict(manifest=cpu_manifest(), settings=settings(device_type="cpu"), steps=steps(20, 100.0, 60.0))
    base.update(kw)
    return run(**base)


def test_gd201_fires_with_derived_num_workers_and_call_site():
    res = judge("GD201", _cpu_run())
    (f,) = res.findings
    assert f.severity == Severity.ERROR
    assert round(f.gain.share_pct) == 60
    assert f.location is not None and str(f.location) == "train.py:31"
    # 60 ms load per batch, 40 ms compute per step: two workers keep up, plus one spare
    assert "num_workers=3" in f.fix.instruction and "num_workers=3" in f.fix.after
    assert "num_workers=0" in f.message
    assert "pin_memory" not in f.fix.after  # CPU run: nothing to pin for
    names = {s.name: s for s in f.evidence.settings}
    assert names["DataLoader.num_workers"].value == 0
    assert str(names["DataLoader.num_workers"].location) == "train.py:31"
    assert any(m.name == "per_batch_load_ns" and m.value == 60 * MS for m in f.evidence.metrics)


def test_gd201_suggestion_with_workers_and_cap():
    th = Thresholds()
    # 2 workers, 100 ms steps of which 30 ms waiting: load ≈ 2 × 100 ms per batch, compute 70 ms (+1 ms
    # hand-over) → 3 workers, +1 spare
    load = Load(200 * MS, 200 * MS, 1.0, COMPUTING)
    plan = plan_workers(load, compute_ns=70 * MS, wait_ns=30 * MS, workers_now=2, cores=16, main_cpu_ns=None,
                        mem_cap=None, t=th)
    assert plan.workers == 4 and plan.cap is None
    # a computing load of 300 ms per batch, 10 ms of compute, on 4 cores: 3 usable cores, not 32 workers
    load = Load(300 * MS, 300 * MS, 1.0, COMPUTING)
    plan = plan_workers(load, compute_ns=10 * MS, wait_ns=300 * MS, workers_now=0, cores=4, main_cpu_ns=None,
                        mem_cap=None, t=th)
    assert plan.workers == 3 and plan.cap == 3 and "usable core" in plan.cap_reason and not plan.hides


def test_gd201_on_gpu_run_adds_pin_memory():
    data = run(manifest=manifest(), settings=settings(), steps=steps(20, 100.0, 30.0))
    (f,) = judge("GD201", data).findings
    assert "pin_memory=True" in f.fix.after


def test_gd201_quiet_when_the_loop_does_not_wait():
    res = judge("GD201", _cpu_run(steps=steps(20, 100.0, 1.0)))
    assert res.verdict == Verdict.FINE and "1.0%" in res.reason


def test_gd201_quiet_when_a_batch_loads_faster_than_a_worker_hands_one_over():
    # 0.6 ms of a 10 ms step (6%): more than the 5% threshold, less than receiving a batch from a worker
    res = judge("GD201", _cpu_run(steps=steps(20, 10.0, 0.6)))
    assert res.verdict == Verdict.FINE and "600.0 µs" in res.reason and "would not win it back" in res.reason
    # the same share of a step ten times longer is 6 ms per batch: workers hide it
    (f,) = judge("GD201", _cpu_run(steps=steps(20, 100.0, 6.0))).findings
    assert f.severity == Severity.WARNING
    # a loader that falls behind on some steps only: the mean per batch decides, not the median
    s = steps(20, 10.0, 0.1)
    s = (*s[:15], *(dataclasses.replace(x, data_wait_ns=8 * MS, wall_ns=18 * MS) for x in s[15:]))
    assert judge("GD201", _cpu_run(steps=s)).verdict == Verdict.FIRED


def test_gd201_first_step_of_the_run_is_left_out():
    s = steps(20, 100.0, 1.0)
    s = (dataclasses.replace(s[0], data_wait_ns=5000 * MS, wall_ns=5100 * MS), *s[1:])
    assert judge("GD201", _cpu_run(steps=s)).verdict == Verdict.FINE


def _workers_starting(workers: int, epochs: int, persistent: bool, late_ms: float):
    """Three epochs of 20 steps (10 ms each, 0.3 ms waiting): each epoch's first step waits for
    its workers (GD202's); the second worker's first batch comes ``late_ms`` after the first's."""
    d = dataloader(num_workers=workers, prefetch_factor=2, persistent_workers=persistent, iterations_started=epochs)
    s = list(steps(20 * epochs, 10.0, 0.3, epochs=epochs, first_wait_ms=1500.0))
    for k in range(epochs):
        i = 20 * k + 1
        s[i] = dataclasses.replace(s[i], data_wait_ns=int(late_ms * MS), wall_ns=int((late_ms + 9.7) * MS))
    return _cpu_run(settings=settings(device_type="cpu", dataloaders=(d,)), steps=tuple(s))


def test_gd201_leaves_each_workers_first_batch_to_gd202():
    # 2 spawned workers: the second one's first batch waits 0.5 s for it to start, every epoch (the
    # workers restart): start-up, not a stall
    assert judge("GD201", _workers_starting(2, 3, persistent=False, late_ms=500.0)).verdict == Verdict.FINE
    # one worker has no second first batch: a step that waits 0.5 s is a stall
    assert judge("GD201", _workers_starting(1, 3, persistent=False, late_ms=500.0)).verdict == Verdict.FIRED
    # persistent workers start once: after the first epoch such a wait is a stall (60 steps less each
    # epoch's first and the first epoch's second)
    res = judge("GD201", _workers_starting(2, 3, persistent=True, late_ms=500.0))
    assert res.verdict == Verdict.FIRED and "means over 56 steps" in res.findings[0].message


def test_gd201_from_a_bare_trace():
    m = trace(breakdown_mean_pct={"data_loading": 35.0, "gpu_compute": 65.0})
    (f,) = judge("GD201", run(metrics=(m,))).findings
    assert "35.0%" in f.message and f.location is None


def test_gd201_leaves_workers_short_of_cpu_to_gd204():
    d = dataclasses.replace(dataloader(num_workers=2, prefetch_factor=2), has_worker_init_fn=True)
    procs = proc_samples(20.0, runq_wait_pct=160.0)
    procs += proc_samples(25.0, role="worker", pid=201, runq_wait_pct=170.0)
    procs += proc_samples(25.0, role="worker", pid=202, runq_wait_pct=170.0)
    data = _cpu_run(settings=settings(device_type="cpu", num_threads=2, cpu_count=2, dataloaders=(d,)),
                    manifest=cpu_manifest(cpu_count=2), samples=Samples(process=procs))
    res = judge("GD201", data)
    assert res.verdict == Verdict.NOT_APPLICABLE and "GD204" in res.reason and "5.7 runnable threads" in res.reason
    calm = Samples(process=proc_samples(100.0, runq_wait_pct=5.0) + proc_samples(20.0, role="worker", pid=201,
                                                                                  runq_wait_pct=1.0))
    assert judge("GD201", dataclasses.replace(data, samples=calm)).verdict == Verdict.FIRED


def test_gd201_cannot_judge_without_steps_or_trace():
    assert judge("GD201", run()).verdict == Verdict.CANNOT_JUDGE


# ---------------------------------------------------------------- GD202 worker-restart


def _metric(f, name):
    return next(m.value for m in f.evidence.metrics if m.name == name)


def _restart_run(first_wait_ms: float, **dl):
    d = dataloader(num_workers=4, prefetch_factor=2, iterations_started=4, **dl)
    return run(manifest=manifest(), settings=settings(dataloaders=(d,)),
               steps=steps(40, 100.0, 1.0, epochs=4, first_wait_ms=first_wait_ms))


def test_gd202_fires_on_start_up_stalls():
    (f,) = judge("GD202", _restart_run(400.0)).findings
    assert "epochs 2..4" in f.message and "persistent_workers=False" in f.message
    assert "persistent_workers=True" in f.fix.after
    assert str(f.location) == "train.py:31"
    # 399 ms once an epoch of 10 steps of 100 ms: 399 / 1399 of an epoch's time (the sentence's share), outside
    # the steady steps the account covers, so no claim on its ledger
    assert "(28.5% of an epoch's time)" in f.message
    # at stake: all but each step's own work (100 ms less its 1 ms wait): what no loading fix can beat
    assert f.gain.share_pct == pytest.approx(100 * (1399 - 10 * 99) / 1399, abs=1e-3)
    assert not f.gain.claims and "of an epoch's time" in f.gain.note
    assert f.gain.speedup_bound == pytest.approx(1399 / 990, abs=1e-3)
    assert f.severity == Severity.ERROR
    assert f.gain.expected_speedup is None  # no samples of the workers: what they still load is unknown


def test_gd202_expects_the_stall_less_the_first_batch_live_workers_still_load():
    procs = proc_samples(100.0) + sum((proc_samples(25.0, role="worker", pid=200 + k) for k in range(4)), ())
    data = dataclasses.replace(_restart_run(400.0), samples=Samples(process=procs))
    (f,) = judge("GD202", data).findings
    # the workers use 1.00 core: 100 ms of CPU per 100 ms batch, + 1 ms hand-over, is what persistent
    # workers still wait for at an epoch's start: 399 - 101 ms of the 1399 ms epoch is won
    assert f.gain.expected_speedup == pytest.approx(1399 / (1399 - 298), abs=1e-3)
    assert f.gain.expected_fraction == round(298 / (1399 - 990), 4)  # of the bound
    assert "first batch" in f.gain.expected_note and "1.00 worker cores" in f.gain.expected_note
    assert any(m.name == "first_batch_ns" and m.value == 101 * MS for m in f.evidence.metrics)


def test_gd202_counts_the_work_the_starting_workers_take_from_the_first_step():
    """worker_restart on 2 cores: the first step of an epoch waited 347 ms more than the others, and its own
    work took 175 ms more (the new workers' start-up on the same cores); --verify measured 2.36x [2.14-2.60]
    where a bound of the wait alone said 1.95x. The bound and the model count the first step's whole excess."""
    base = _restart_run(400.0)
    slowed = tuple(dataclasses.replace(x, wall_ns=x.wall_ns + 175 * MS) if x.data_wait_ns == 400 * MS else x
                   for x in base.steps)
    (f,) = judge("GD202", dataclasses.replace(base, steps=slowed)).findings
    epoch = 1000 + 399 + 175
    assert f.gain.share_pct == pytest.approx(100 * (epoch - 990) / epoch, abs=1e-3)
    assert _metric(f, "startup_cost_ns") == (399 + 175) * MS and "(25.3% of an epoch's time)" in f.message


def test_gd202_quiet_with_persistent_workers():
    assert judge("GD202", _restart_run(400.0, persistent_workers=True)).verdict == Verdict.FINE


def test_gd202_quiet_when_stall_is_small():
    assert judge("GD202", _restart_run(20.0)).verdict == Verdict.FINE


def test_gd202_not_applicable_without_workers():
    d = dataloader(iterations_started=4)
    res = judge("GD202", run(settings=settings(dataloaders=(d,)), steps=steps(40, epochs=4)))
    assert res.verdict == Verdict.NOT_APPLICABLE


# ---------------------------------------------------------------- GD203 main-process-cpu-bound


def test_gd203_fires_on_gpu_run_when_python_holds_the_gpu():
    m = trace(utilization=(utilization(45.0, causes={GapCause.OTHER: 0.8, GapCause.SYNC: 0.2}),))
    pst = (PstatsEntry("/work/train.py", 12, "augment", 640, 3.0, 3.1),
           PstatsEntry("/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", 1, "_call_impl", 10, 0.5, 9.0),
           PstatsEntry("/work/train.py", 40, "main", 1, 0.1, 10.0))
    data = run(manifest=manifest(), settings=settings(), steps=steps(20, 100.0, 1.0), metrics=(m,),
               samples=Samples(process=proc_samples(99.0)), pstats=pst)
    (f,) = judge("GD203", data).findings
    assert "99.0% of one core" in f.message and "45.0%" in f.message
    assert f.location is not None and (f.location.file, f.location.line) == ("/work/train.py", 12)
    assert round(f.gain.share_pct) == 36  # the idle time with the host busy elsewhere


def test_gd203_quiet_when_main_process_is_not_busy():
    data = run(settings=settings(), steps=steps(), samples=Samples(process=proc_samples(40.0)))
    assert judge("GD203", data).verdict == Verdict.FINE


def test_gd203_leaves_data_loading_to_gd201():
    data = run(settings=settings(), steps=steps(20, 100.0, 50.0), samples=Samples(process=proc_samples(100.0)))
    assert judge("GD203", data).verdict == Verdict.NOT_APPLICABLE


def test_gd203_cpu_run_bound_by_one_python_thread():
    pst = (PstatsEntry("/work/train.py", 12, "tokenize", 640, 6.0, 6.1),
           PstatsEntry("/work/train.py", 40, "main", 1, 0.1, 10.0))
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu", num_threads=8, cpu_count=8),
               steps=steps(), samples=Samples(process=proc_samples(100.0)), pstats=pst, metrics=(cpu_trace(),))
    (f,) = judge("GD203", data).findings
    assert "12%" in f.message or "13%" in f.message
    # user self time 6.1 s of 10 s of cProfile: not a part of the step (no trace splits it)
    assert f.gain.share_pct is None and "61.0% of the cProfile time" in f.gain.note


def _python_trace(long_gap_ms: float, typical_ms: float = 180.0, n_steps: int = 5):
    d = DispatchStats(window=WindowKind.STEPS, steps=n_steps, ops_per_step=400.0, op_ns=int((typical_ms - long_gap_ms) * MS),
                      long_gap_ns=int(long_gap_ms * MS), typical_step_ns=int(typical_ms * MS),
                      step_median_ns=int(typical_ms * MS))
    pct = 100.0 * long_gap_ms / typical_ms
    return cpu_trace(dispatch=d, breakdown_mean_pct={"other_cpu": pct, "cpu_compute": 100.0 - pct})


def test_gd203_cpu_run_with_python_between_ops_fires_from_the_trace_whatever_the_cpu_pct():
    """The planted sample: OpenMP threads spinning in the ops lift the process to 133% CPU, but 82% of
    the typical step runs Python between ops."""
    pst = (PstatsEntry("/work/train.py", 12, "tokenize", 640, 6.0, 6.1),
           PstatsEntry("/work/train.py", 40, "main", 1, 0.1, 10.0))
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu", num_threads=2, cpu_count=2),
               steps=steps(), samples=Samples(process=proc_samples(133.0, runq_wait_pct=1.0)), pstats=pst,
               metrics=(_python_trace(147.0),))
    (f,) = judge("GD203", data).findings
    assert "81.7% of a typical step runs Python between torch ops" in f.message
    assert "train.py:12" in f.message
    assert round(f.gain.share_pct) == 82 and f.confidence.value == "measured"
    assert [c.component for c in f.gain.claims] == ["other_cpu"]
    # the fixed sample: no Python of its own between ops
    fixed = dataclasses.replace(data, metrics=(_python_trace(0.0, 25.0),), pstats=())
    res = judge("GD203", fixed)
    assert res.verdict == Verdict.FINE and "0.0% of a typical step runs Python between torch ops" in res.reason
    # one profiled step (a run stopped inside its only window) clears nothing: not measurable
    one = judge("GD203", dataclasses.replace(fixed, metrics=(_python_trace(0.0, 25.0, n_steps=1),)))
    assert one.verdict == Verdict.CANNOT_JUDGE and "not measurable: the trace holds 1 profiled step" in one.reason
    assert judge("GD203", dataclasses.replace(data, metrics=(_python_trace(147.0, n_steps=1),))).verdict == Verdict.FIRED
    # a trace says no even when the CPU % alone would have said yes
    low_cpu = dataclasses.replace(fixed, samples=Samples(process=proc_samples(100.0, runq_wait_pct=0.0)))
    assert judge("GD203", low_cpu).verdict == Verdict.FINE


def test_gd203_cpu_run_with_one_intra_op_thread_on_two_cores_still_judged():
    """torch counts physical cores: two vCPUs that share one core give one intra-op thread. The other
    core is still there for DataLoader workers, where the fix moves the work."""
    base = run(manifest=cpu_manifest(), settings=settings(device_type="cpu", num_threads=1, cpu_count=2),
               steps=steps(), samples=Samples(process=proc_samples(100.0)), metrics=(_python_trace(147.0),))
    (f,) = judge("GD203", base).findings
    assert "81.7% of a typical step runs Python between torch ops" in f.message
    assert "the other 1 core could run it in DataLoader workers" in f.message
    assert judge("GD203", dataclasses.replace(base, metrics=(_python_trace(0.0, 25.0),))).verdict == Verdict.FINE
    # no trace, no phase times: at one thread the CPU % cannot tell Python from op work
    res = judge("GD203", dataclasses.replace(base, metrics=()))
    assert res.verdict == Verdict.CANNOT_JUDGE and "cannot tell Python" in res.reason
    # one core: nowhere to move the work
    one = dataclasses.replace(base, settings=settings(device_type="cpu", num_threads=1, cpu_count=1),
                              manifest=cpu_manifest(cpu_count=1))
    assert judge("GD203", one).verdict == Verdict.NOT_APPLICABLE


def test_gd203_cpu_run_using_its_threads_is_fine():
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu", num_threads=8, cpu_count=8),
               steps=steps(), samples=Samples(process=proc_samples(700.0)))
    assert judge("GD203", data).verdict == Verdict.FINE


def test_gd203_cpu_run_at_one_core_because_other_processes_hold_the_other_is_fine():
    """At one core with a second thread waiting for a core: not bound by one Python thread."""
    def data(wait_pct):
        return run(manifest=cpu_manifest(), settings=settings(device_type="cpu", num_threads=2, cpu_count=2),
                   steps=steps(), samples=Samples(process=proc_samples(100.0, runq_wait_pct=wait_pct)))
    res = judge("GD203", data(95.0))
    assert res.verdict == Verdict.FINE and "95% more waiting for a core" in res.reason
    assert judge("GD203", data(3.0)).verdict == Verdict.FIRED  # one thread that wants one core


def test_gd203_cpu_run_held_under_one_core_by_other_load_still_fires():
    """60% CPU and 40% waiting: one Python thread that wants one core, on a busy machine."""
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu", num_threads=2, cpu_count=2),
               steps=steps(), samples=Samples(process=proc_samples(60.0, runq_wait_pct=40.0)))
    (f,) = judge("GD203", data).findings
    assert "runs at 60.0% CPU, 40% more waiting for a core, 50% of what its 2 intra-op threads" in f.message
    no_wait = dataclasses.replace(data, samples=Samples(process=proc_samples(60.0)))
    assert judge("GD203", no_wait).verdict == Verdict.FINE  # without run-queue figures: not busy


def test_gd203_cannot_judge_without_samples():
    assert judge("GD203", run(settings=settings())).verdict == Verdict.CANNOT_JUDGE


# ---------------------------------------------------------------- GD204 cpu-oversubscription


def _oversub(num_threads: int, workers: int, main: tuple[float, float], worker: tuple[float, float] | None,
             cores: int = 8, init_fn: bool = False):
    """main/worker: (cpu_pct, runq_wait_pct) of the training process / each worker; None: not recorded."""
    samples = proc_samples(main[0], runq_wait_pct=main[1])
    for w in range(workers):
        cpu, wait = worker if worker is not None else (0.0, None)
        samples += proc_samples(cpu, role="worker", pid=200 + w, threads=4, runq_wait_pct=wait)
    d = dataclasses.replace(dataloader(num_workers=workers, prefetch_factor=2), has_worker_init_fn=init_fn)
    return run(manifest=cpu_manifest(cpu_count=cores),
               settings=settings(device_type="cpu", num_threads=num_threads, cpu_count=cores, dataloaders=(d,)),
               steps=steps(), samples=Samples(process=samples))


def test_gd204_fires_on_measured_runnable_threads_beyond_cores():
    # the planted sample on 2 cores: main 0.2 + 1.6 waiting, each worker 0.25 + 1.7 waiting
    (f,) = judge("GD204", _oversub(2, 2, (20.0, 160.0), (25.0, 170.0), cores=2, init_fn=True)).findings
    assert "5.7 runnable threads on 2 cores" in f.message
    assert "1.6 of the training process's threads are waiting" in f.message
    assert "each worker now keeps 1.9 threads busy" in f.fix.instruction
    # one thread per worker is enough: the workers used half a core between them
    assert "num_workers" not in f.fix.instruction and "training process" not in f.fix.instruction
    assert "torch.set_num_threads(1)" in f.fix.after and "worker_init_fn=worker_init_fn" in f.fix.after
    # (5.7 - 2) / 5.7 of the demand cannot be served; at stake in the step: the compute its threads stretch by
    # waiting, 100 ms × (1 - 0.2 cores got ÷ 1.5 after the fix) of each 100 ms step
    assert "64.9% of the threads' CPU demand" in f.gain.note
    assert round(f.gain.share_pct, 1) == 86.7 and 0.0 <= f.gain.expected_fraction <= 1.0
    assert f.gain.expected_share_pct <= f.gain.share_pct and "0.20 cores now" in f.gain.expected_note
    assert f.severity == Severity.ERROR
    assert str(f.location) == "train.py:31"
    metrics = {m.name: m.value for m in f.evidence.metrics}
    assert metrics["runnable_threads_per_worker"] == 1.95 and metrics["oversubscription_ratio"] == 2.85


def test_gd204_main_threads_and_workers_too_many():
    # 8 cores: main runs 8 threads, 6 single-threaded workers busy: 14 runnable
    (f,) = judge("GD204", _oversub(8, 6, (500.0, 300.0), (60.0, 40.0))).findings
    assert "torch.set_num_threads(2)" in f.fix.instruction and "torch.set_num_threads(2)" in f.fix.after
    assert "each worker now keeps" not in f.fix.instruction
    assert "worker_init_fn" in f.fix.instruction  # none was set: torch's default is kept explicit


def test_gd204_quiet_when_idle_workers_sit_beside_a_busy_training_process():
    # the fixed sample: main at two cores, two idle-ish workers with 4 threads each (psutil) —
    # threads that exist are not threads that want a core
    res = judge("GD204", _oversub(2, 2, (100.0, 100.0), (5.0, 2.0), cores=2))
    assert res.verdict == Verdict.FINE and "2.1 runnable threads on 2 cores" in res.reason


def test_gd204_cannot_judge_without_run_queue_figures():
    res = judge("GD204", _oversub(8, 4, (700.0, None), None))
    assert res.verdict == Verdict.CANNOT_JUDGE and "schedstat" in res.reason


def test_gd204_not_applicable_without_workers():
    assert judge("GD204", _oversub(8, 0, (700.0, 0.0), None)).verdict == Verdict.NOT_APPLICABLE


# ---------------------------------------------------------------- GD503 host-allocator-churn


def test_gd503_fires_on_sys_time_and_page_faults():
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu"),
               steps=steps(20, 100.0, sys_ms=25.0, user_ms=70.0, faults=5000))
    (f,) = judge("GD503", data).findings
    assert "25.0%" in f.message and "5000 minor page faults" in f.message
    assert "jemalloc" in f.fix.instruction and "MALLOC_MMAP_THRESHOLD_" in f.fix.instruction
    assert f.severity == Severity.ERROR


def test_gd503_judges_the_later_half_where_glibc_has_settled():
    # 40 steps: the first 20 fault 20,000 times with 30% system time, the last 20 only 27 times
    early = steps(20, 100.0, sys_ms=30.0, user_ms=60.0, faults=20000)
    late = tuple(dataclasses.replace(s, index=s.index + 20, start_ns=s.start_ns + 20 * 100 * MS)
                 for s in steps(20, 100.0, sys_ms=1.0, user_ms=90.0, faults=27))
    res = judge("GD503", run(manifest=cpu_manifest(), settings=settings(device_type="cpu"), steps=early + late))
    assert res.verdict == Verdict.FINE
    assert "27 minor faults per step over the last 20 steady steps" in res.reason
    assert "had 20000 faults per step: the allocator settled" in res.reason
    # the other way round (churn that begins and stays) fires
    flipped = tuple(dataclasses.replace(a, sys_cpu_ns=b.sys_cpu_ns, user_cpu_ns=b.user_cpu_ns,
                                        minor_faults=b.minor_faults) for a, b in zip(early + late, late + early, strict=True))
    (f,) = judge("GD503", run(manifest=cpu_manifest(), settings=settings(device_type="cpu"), steps=flipped)).findings
    assert "median of the last 20 steady steps" in f.message


def test_gd503_leaves_out_steps_under_torch_profiler():
    quiet = steps(20, 100.0, sys_ms=1.0, user_ms=90.0, faults=26)
    noisy = tuple(dataclasses.replace(s, minor_faults=12000, sys_cpu_ns=30 * MS, profiled=True, window="active")
                  if 12 <= s.index < 17 else s for s in quiet)
    res = judge("GD503", run(manifest=cpu_manifest(), settings=settings(device_type="cpu"), steps=noisy))
    assert res.verdict == Verdict.FINE and "26 minor faults per step" in res.reason
    # with the profiler in (almost) every step, its own faults cannot be told from the script's: not judged
    allp = tuple(dataclasses.replace(s, minor_faults=12000, sys_cpu_ns=30 * MS, profiled=True, window="active")
                 if s.index >= 3 else s for s in quiet)
    res = judge("GD503", run(manifest=cpu_manifest(), settings=settings(device_type="cpu"), steps=allp))
    assert res.verdict == Verdict.CANNOT_JUDGE and "outside torch.profiler's window" in res.reason
    # a few quiet steps outside it are enough to clear a short run whose profiled steps fault
    few = tuple(dataclasses.replace(s, minor_faults=1200, sys_cpu_ns=25 * MS, profiled=True, window="active")
                if s.index >= 8 else s for s in quiet)
    res = judge("GD503", run(manifest=cpu_manifest(), settings=settings(device_type="cpu"), steps=few))
    assert res.verdict == Verdict.FINE and "26 minor faults per step" in res.reason


def test_gd503_quiet_with_few_faults():
    data = run(settings=settings(device_type="cpu"), steps=steps(20, 100.0, sys_ms=25.0, faults=300))
    assert judge("GD503", data).verdict == Verdict.FINE


def test_gd503_with_jemalloc_already_preloaded():
    s = settings(device_type="cpu", env={"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"})
    (f,) = judge("GD503", run(settings=s, steps=steps(20, 100.0, sys_ms=25.0, faults=5000))).findings
    assert "jemalloc is preloaded" in f.fix.instruction


def test_gd503_cannot_judge_without_rusage():
    assert judge("GD503", run(steps=steps())).verdict == Verdict.CANNOT_JUDGE


def _grouped(n: int, k: int, wall_ms: float, sys_share: float, faults_per_step: int) -> tuple:
    """``n`` short steps whose CPU figures were read every ``k`` steps (steps.jsonl's ``cpu_steps``)."""
    out = []
    for s in steps(n, wall_ms):
        if (s.index + 1) % k:
            out.append(s)
        else:
            out.append(dataclasses.replace(s, sys_cpu_ns=int(k * wall_ms * sys_share * MS),
                                           user_cpu_ns=int(k * wall_ms * (1 - sys_share) * MS),
                                           minor_faults=k * faults_per_step, cpu_steps=k))
    return tuple(out)


def test_gd503_judges_readings_that_cover_several_short_steps():
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu"),
               steps=_grouped(160, 8, 0.25, 0.3, 3000))
    (f,) = judge("GD503", data).findings
    # the share is over the wall time of every step a reading covers, the faults per step of each reading
    assert "30.0%" in f.message and "3000 minor page faults per step" in f.message
    assert "the last 80 steady steps" in f.message  # 19 readings after step 0's, the later 10 judged
    quiet = run(manifest=cpu_manifest(), settings=settings(device_type="cpu"), steps=_grouped(160, 8, 0.25, 0.3, 30))
    assert judge("GD503", quiet).verdict == Verdict.FINE


def test_a_finding_whose_model_expects_under_the_warning_share_is_info():
    """Severity is the share at stake, but at most info where the rule's own model expects its fix to win less
    of the step than the warning threshold (tuned_baseline on 2 cores, whole script: GD201 at 6.0% of step
    time, its model expecting 1.9%, read as a warning on the tuned baseline). The bound is still shown."""
    from gpudoctor.config import Thresholds as Th  # noqa: PLC0415
    from gpudoctor.rules.context import RuleContext  # noqa: PLC0415

    ctx = RuleContext(_cpu_run(), Th())
    small = ctx.gain(6.0, expected=1.9 / 6.0)
    assert ctx.severity_of(6.0, small) == Severity.INFO and small.share_pct == 6.0
    at = ctx.gain(6.0, expected=4.9998 / 6.0)  # printed "−5.0%": not under a 5% threshold
    assert ctx.severity_of(6.0, at) == Severity.WARNING
    assert ctx.severity_of(25.0, ctx.gain(25.0, expected=0.5)) == Severity.ERROR  # 12.5% expected: by the share
    assert ctx.severity_of(6.0, ctx.gain(6.0)) == Severity.WARNING  # no model: by the share


def test_gd201_leaves_the_workers_pipeline_filling_to_gd202():
    """tuned_baseline under --steps 40 (CI): its only unprofiled steps, 1-9, came while its 2 workers' pipeline
    filled (waits of 1.3-7.8 ms per 60 ms step), and every step from 17 on waited a hand-over (1.1-1.7 ms): the
    figures' steps read a 7.1% stall, the run's later half none. A stall that lasts is still one."""
    d = dataloader(num_workers=2, prefetch_factor=2, persistent_workers=True)
    early = [dataclasses.replace(s, data_wait_ns=int((6.0 if s.index % 2 else 1.4) * MS)) for s in steps(40, 60.0, 1.4)[:10]]
    late = [dataclasses.replace(s, window="active" if s.index >= 30 else "cprofile") for s in steps(40, 60.0, 1.4)[10:]]
    filling = _cpu_run(settings=settings(device_type="cpu", dataloaders=(d,)), steps=(*early, *late))
    res = judge("GD201", filling)
    assert res.verdict == Verdict.FINE and "pipeline was filling" in res.reason, res.reason
    lasting = [dataclasses.replace(s, data_wait_ns=int((6.0 if s.index % 2 else 1.4) * MS)) for s in late]
    assert judge("GD201", _cpu_run(settings=settings(device_type="cpu", dataloaders=(d,)),
                                   steps=(*early, *lasting))).verdict == Verdict.FIRED


def _cold_steps(warm_ms: float = 1.3, cold_ms: float = 11.3, wait_ms: float = 30.0, n: int = 40):
    """Issue 42's loop: a 30 ms wait per batch, the step's own work 1.3 ms on a fifth of the steps and 11.3 ms
    on the rest (its CPU went cold while it waited)."""
    out, t = [], 0
    for i in range(n):
        wall = (warm_ms if i % 5 == 2 else cold_ms) + wait_ms
        out.append(dataclasses.replace(steps(1, wall, wait_ms)[0], index=i, start_ns=t))
        t += int(wall * MS)
    return tuple(out)


def test_gd201_models_the_warm_compute_and_bounds_with_the_least():
    """The model takes the warm compute (p10 of the steps' time outside the wait), the evidence says both
    figures, and the bound (the wait and the compute beyond the least any step took) is at least the model's:
    workers that hide the wait let the compute run warm, so the fix wins more than the wait."""
    (f,) = judge("GD201", _cpu_run(steps=_cold_steps())).findings
    metric = {m.name: m.value for m in f.evidence.metrics}
    assert metric["compute_per_step_ns"] == pytest.approx(1.3 * MS, rel=0.01)
    assert metric["compute_median_ns"] == pytest.approx(11.3 * MS, rel=0.01)
    assert any("1.30 ms when its data is ready" in n and "11.30 ms after a wait" in n for n in f.evidence.notes)
    now = 30.0 + 0.8 * 11.3 + 0.2 * 1.3
    assert f.gain.share_pct > 100.0 * 30.0 / now + 10  # the wait alone: 76.1%
    # the step after the fix: at most now ÷ (least compute); expected within it
    assert 1.0 < f.gain.expected_speedup <= f.gain.speedup_bound
    assert f.gain.speedup_bound >= now / 1.3 * 0.99
    assert "warm compute" in f.fix.instruction


def test_gd201_a_loop_whose_compute_does_not_go_cold_keeps_the_wait_as_its_bound():
    (f,) = judge("GD201", _cpu_run(steps=_cold_steps(warm_ms=40.0, cold_ms=40.0, wait_ms=60.0))).findings
    assert f.gain.share_pct == pytest.approx(60.0, abs=0.1)
    assert not any("when its data is ready" in n for n in f.evidence.notes)


def test_gd204_a_waiting_loop_models_its_warm_compute_and_bounds_with_the_least():
    """Issue 42 for GD204: where the loop waits for its starved workers, its compute after the fix is the warm
    one (p10 of the steps' time outside the wait), and the share at stake reaches down to the least any showed."""
    base = _oversub(8, 6, (500.0, 300.0), (60.0, 40.0))
    (plain,) = judge("GD204", base).findings
    (cold,) = judge("GD204", dataclasses.replace(base, steps=_cold_steps())).findings
    assert "warm compute 1.30 ms" in cold.gain.expected_note and "warm" not in plain.gain.expected_note
    now = 30.0 + 0.8 * 11.3 + 0.2 * 1.3
    assert cold.gain.share_pct == pytest.approx(100.0 * (now - 1.3) / now, abs=0.5)
    assert cold.gain.expected_speedup <= cold.gain.speedup_bound


def test_gd201_settles_on_the_later_half_s_unprofiled_steps():
    """A session of Lightning, 2 workers that keep up, a 53 ms step of 4 micro-batches: its unprofiled steps
    wait a hand-over (6 ms a step, 1.5 ms a batch); under cProfile the training process's own receipt of a
    batch slows (8.7-15 ms a step, 91 ms on one while the trace was compressed beside). The later half's
    unprofiled steps say the pipeline keeps up; the same waits on unprofiled steps are a stall."""
    d = dataloader(num_workers=2, prefetch_factor=2, persistent_workers=True)
    base = [dataclasses.replace(s, marker="optimizer", micro_batches=4, batches=4) for s in steps(40, 53.0, 6.0)]
    late_waits = {19: 8.7, 20: 91.0, 21: 9.6, 22: 8.75}
    instrumented = [dataclasses.replace(s, window="cprofile" if 16 <= s.index <= 21 else s.window,
                                        data_wait_ns=int(late_waits.get(s.index, 6.0) * MS)) for s in base]
    cpu = settings(device_type="cpu", dataloaders=(d,))
    res = judge("GD201", _cpu_run(settings=cpu, steps=tuple(instrumented)))
    assert res.verdict == Verdict.FINE and "pipeline was filling" in res.reason, (res.verdict, res.reason)
    bare = [dataclasses.replace(s, window="") for s in instrumented]  # the same waits, no instrument
    assert judge("GD201", _cpu_run(settings=cpu, steps=tuple(bare))).verdict == Verdict.FIRED
