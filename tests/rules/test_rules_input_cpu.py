"""GD201–GD204 and GD503: the input pipeline and the CPU side; these judge CPU-only runs too."""

from __future__ import annotations

import dataclasses

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

from gpudoctor.model import Severity
from gpudoctor.rules.context import Verdict
from gpudoctor.rules.gd201_dataloader_stall import suggest_num_workers

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
    dl = dataloader(num_workers=2, prefetch_factor=2)
    # 2 workers, 100 ms steps of which 30 ms waiting: load ≈ 2 × 100 ms, compute 70 ms → 3 workers
    n, load, compute, _ = suggest_num_workers(dl, 30 * MS, 100 * MS, 16, 1)
    assert (n, load, compute) == (3, 200 * MS, 70 * MS)
    assert suggest_num_workers(dl, 30 * MS, 100 * MS, 16, 1, spare=1)[0] == 4
    n, *_ , how = suggest_num_workers(dataloader(), 300 * MS, 310 * MS, 4, 1)
    assert n == 3 and "capped" in how


def test_gd201_on_gpu_run_adds_pin_memory():
    data = run(manifest=manifest(), settings=settings(), steps=steps(20, 100.0, 30.0))
    (f,) = judge("GD201", data).findings
    assert "pin_memory=True" in f.fix.after


def test_gd201_quiet_when_the_loop_does_not_wait():
    res = judge("GD201", _cpu_run(steps=steps(20, 100.0, 1.0)))
    assert res.verdict == Verdict.FINE and "1.0%" in res.reason


def test_gd201_first_step_of_the_run_is_left_out():
    s = steps(20, 100.0, 1.0)
    s = (dataclasses.replace(s[0], data_wait_ns=5000 * MS, wall_ns=5100 * MS), *s[1:])
    assert judge("GD201", _cpu_run(steps=s)).verdict == Verdict.FINE


def test_gd201_from_a_bare_trace():
    m = trace(breakdown_mean_pct={"data_loading": 35.0, "gpu_compute": 65.0})
    (f,) = judge("GD201", run(metrics=(m,))).findings
    assert "35.0%" in f.message and f.location is None


def test_gd201_cannot_judge_without_steps_or_trace():
    assert judge("GD201", run()).verdict == Verdict.CANNOT_JUDGE


# ---------------------------------------------------------------- GD202 worker-restart


def _restart_run(first_wait_ms: float, **dl):
    d = dataloader(num_workers=4, prefetch_factor=2, iterations_started=4, **dl)
    return run(manifest=manifest(), settings=settings(dataloaders=(d,)),
               steps=steps(40, 100.0, 1.0, epochs=4, first_wait_ms=first_wait_ms))


def test_gd202_fires_on_start_up_stalls():
    (f,) = judge("GD202", _restart_run(400.0)).findings
    assert "epochs 2..4" in f.message and "persistent_workers=False" in f.message
    assert "persistent_workers=True" in f.fix.after
    assert str(f.location) == "train.py:31"
    assert 20 < f.gain.share_pct < 30  # 3 × 399 ms of ~5.2 s


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
    assert "99%" in f.message and "45.0%" in f.message
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
    assert round(f.gain.share_pct) == 61  # user self time 6.1 s of 10 s


def test_gd203_cpu_run_using_its_threads_is_fine():
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu", num_threads=8, cpu_count=8),
               steps=steps(), samples=Samples(process=proc_samples(700.0)))
    assert judge("GD203", data).verdict == Verdict.FINE


def test_gd203_cannot_judge_without_samples():
    assert judge("GD203", run(settings=settings())).verdict == Verdict.CANNOT_JUDGE


# ---------------------------------------------------------------- GD204 cpu-oversubscription


def _oversub(num_threads: int, workers: int, main_pct: float, worker_pct: float, cores: int = 8):
    samples = proc_samples(main_pct)
    for w in range(workers):
        samples += proc_samples(worker_pct, role="worker", pid=200 + w, threads=1)
    d = dataloader(num_workers=workers, prefetch_factor=2)
    return run(manifest=cpu_manifest(cpu_count=cores),
               settings=settings(device_type="cpu", num_threads=num_threads, cpu_count=cores, dataloaders=(d,)),
               steps=steps(), samples=Samples(process=samples))


def test_gd204_fires_when_threads_exceed_cores_on_a_saturated_machine():
    (f,) = judge("GD204", _oversub(8, 4, 700.0, 100.0)).findings
    assert "12 busy threads on 8 cores" in f.message
    assert "torch.set_num_threads(4)" in f.fix.after and "worker_init_fn" in f.fix.after
    assert round(f.gain.share_pct) == 33  # 4 of 12 threads' demand cannot be served
    assert str(f.location) == "train.py:31"


def test_gd204_quiet_when_threads_fit():
    assert judge("GD204", _oversub(4, 4, 390.0, 100.0)).verdict == Verdict.FINE


def test_gd204_quiet_when_machine_is_not_saturated():
    res = judge("GD204", _oversub(8, 4, 150.0, 20.0))
    assert res.verdict == Verdict.FINE and "no contention" in res.reason


def test_gd204_not_applicable_without_workers():
    assert judge("GD204", _oversub(8, 0, 700.0, 0.0)).verdict == Verdict.NOT_APPLICABLE


# ---------------------------------------------------------------- GD503 host-allocator-churn


def test_gd503_fires_on_sys_time_and_page_faults():
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu"),
               steps=steps(20, 100.0, sys_ms=25.0, user_ms=70.0, faults=5000))
    (f,) = judge("GD503", data).findings
    assert "25.0%" in f.message and "5000 minor page faults" in f.message
    assert "jemalloc" in f.fix.instruction and "MALLOC_MMAP_THRESHOLD_" in f.fix.instruction
    assert f.severity == Severity.ERROR


def test_gd503_quiet_with_few_faults():
    data = run(settings=settings(device_type="cpu"), steps=steps(20, 100.0, sys_ms=25.0, faults=300))
    assert judge("GD503", data).verdict == Verdict.FINE


def test_gd503_with_jemalloc_already_preloaded():
    s = settings(device_type="cpu", env={"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"})
    (f,) = judge("GD503", run(settings=s, steps=steps(20, 100.0, sys_ms=25.0, faults=5000))).findings
    assert "jemalloc is preloaded" in f.fix.instruction


def test_gd503_cannot_judge_without_rusage():
    assert judge("GD503", run(steps=steps())).verdict == Verdict.CANNOT_JUDGE
