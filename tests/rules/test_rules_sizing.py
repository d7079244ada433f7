"""Fixes sized for the load (issue 24): GD201's workers from a measured waiting or computing load,
GD104's batch factor from memory headroom, GD204's threads; each with the expected gain of its model."""

from __future__ import annotations

import dataclasses
import math

import pytest
from rule_builders import (
    GB,
    MS,
    MemoryStats,
    OptimizerSetting,
    PstatsEntry,
    Samples,
    cpu_manifest,
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

from gpudoctor.analysis.loader import COMPUTING, UNMEASURED, WAITING, Load, classify
from gpudoctor.config import Thresholds
from gpudoctor.model import GapCause, ProcessSample, Severity
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.gd104_batch_too_small import plan_batch
from gpudoctor.rules.load_model import plan_workers
from gpudoctor.rules.registry import get
from gpudoctor.rules.results import Verdict

FETCH = "/venv/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py"


def _metric(f, name):
    return next(m.value for m in f.evidence.metrics if m.name == name)


def _inject(code, data, finding):
    """What --verify would change for ``finding``."""
    rule = get(code)
    changes = rule.inject(finding, RuleContext(data, Thresholds()).for_rule(rule.code, rule.name))
    assert not isinstance(changes, str), changes
    return changes


def _two_core_run(wall_ms: float, wait_ms: float, *, cpu_ms: float | None = None, model_ms: float | None = None,
                  pstats=(), **kw):
    """A CPU run on 2 cores, num_workers=0: ``wait_ms`` of each ``wall_ms`` step in DataLoader.__next__;
    getrusage ``cpu_ms`` per step, ``model_ms`` of it in the model's calls."""
    s = steps(30, wall_ms, wait_ms, user_ms=cpu_ms, sys_ms=0.0 if cpu_ms is not None else None)
    if model_ms is not None:
        s = tuple(dataclasses.replace(x, forward_ns=int(model_ms * MS / 3), backward_ns=int(model_ms * MS / 3),
                                      optimizer_ns=int(model_ms * MS / 3)) for x in s)
    base = dict(manifest=cpu_manifest(cpu_count=2), settings=settings(device_type="cpu", cpu_count=2, num_threads=2),
                steps=s, pstats=tuple(pstats))
    base.update(kw)
    return run(**base)


def _fetch_profile(sleep_s: float, work_s: float, *, hot: str = "decode") -> tuple[PstatsEntry, ...]:
    """cProfile entries of a fetch that sleeps ``sleep_s`` and computes ``work_s`` in the user's ``hot``."""
    fetch_s = sleep_s + work_s
    return (
        PstatsEntry("/work/train.py", 1, "<module>", 1, 0.01, 10.0),
        PstatsEntry(FETCH, 49, "fetch", 20, 0.001, fetch_s, 0.001, fetch_s),
        PstatsEntry("/work/train.py", 20, "slow_collate", 20, 0.001, fetch_s, 0.001, fetch_s),
        PstatsEntry("~", 0, "<built-in method time.sleep>", 20, sleep_s, sleep_s, sleep_s, sleep_s),
        PstatsEntry("/work/train.py", 30, hot, 640, work_s, work_s, work_s, work_s),
    )


# ---------------------------------------------------------------- GD201: a waiting load


def test_a_waiting_load_gets_more_workers_than_cores_with_the_gain_of_that_count():
    # 20 ms sleep in collate per batch, 12 ms of compute on 2 cores: the case, refuted at 1 worker
    data = _two_core_run(32.0, 20.0, cpu_ms=12.5, model_ms=11.0, pstats=_fetch_profile(0.40, 0.004))
    (f,) = judge("GD201", data).findings
    assert _metric(f, "load_kind") == WAITING
    n = _metric(f, "suggested_num_workers")
    # ceil(20 ÷ (12 + 1 hand-over)) + 1 spare = 3, not capped at the 2 cores (1 usable)
    assert n == 3 and n > _metric(f, "cpu_count")
    assert "num_workers=3" in f.fix.instruction and "num_workers=3" in f.fix.after
    assert "more than the 2 cores" in f.fix.instruction and "waits rather than computes" in f.message
    # the model for 3 workers: max(12, 20 ÷ 3, ...) + 1 = 13 ms against 32 ms: 19 of the 20 ms wait
    assert f.gain.expected_fraction == pytest.approx(19 / 20, abs=0.01)
    assert "3 workers (waiting load)" in f.gain.expected_note and "(load 20.00 ms + hand-over) ÷ 3 worker(s)" in f.gain.expected_note
    assert 0.0 <= f.gain.expected_fraction <= 1.0 and f.gain.expected_share_pct <= f.gain.share_pct
    assert any("time.sleep" in n for n in f.evidence.notes)


def test_the_model_and_its_bound_are_of_the_unprofiled_steps():
    """Issue 37's held-out loader (a collate that waits ~30 ms, num_workers=0, 2 cores): the profiler's
    windows made its steps heavier, and the finding mixed them in (a bound of 87.4% that --verify's
    measured 91.0% beat). The account's steps are the unprofiled ones: the share at stake is the wait's
    share of their sums, and the model's speed-up is their step over the step it expects."""
    data = _two_core_run(32.0, 30.0, cpu_ms=2.0, model_ms=1.8)
    heavy = {i: w for i, w in ((9, "warmup"), *((i, "active") for i in range(10, 15)), (15, "cprofile"),
                               *((i, "cprofile") for i in range(16, 20)))}
    windowed = tuple(dataclasses.replace(x, window=heavy[x.index], wall_ns=x.wall_ns + 10 * MS)
                     if x.index in heavy else x for x in data.steps)
    (f,) = judge("GD201", dataclasses.replace(data, steps=windowed)).findings
    bare = [x for x in windowed if not x.window and x.index not in (0, 20)]  # the first, and the one after a window
    assert f.gain.share_pct == pytest.approx(100.0 * 30 / 32, abs=1e-3)
    assert f"over {len(bare)} steps" in f.message and "30.00 ms of a 32.00 ms step" in f.message
    after = _metric(f, "expected_step_ns")
    assert f.gain.expected_speedup == pytest.approx(32.0 * MS / after, rel=2e-3)
    # every steady step mixed in (the profiled ones 10 ms heavier), the share would be lower than what a bare
    # trial run waits: the bound would not hold
    every = [x for x in windowed if x.index != 0]
    assert 100.0 * sum(x.data_wait_ns for x in every) / sum(x.wall_ns for x in every) < f.gain.share_pct - 2


def test_a_waiting_load_is_told_by_getrusage_alone():
    # no cProfile: the process used 12 ms of CPU per step, 11 ms of it in the model's calls, against a 20 ms
    # wait: the loading used at most 1 ms of CPU in its 20 ms
    (f,) = judge("GD201", _two_core_run(32.0, 20.0, cpu_ms=12.0, model_ms=11.0)).findings
    assert _metric(f, "load_kind") == WAITING and _metric(f, "suggested_num_workers") == 3
    assert any(n.startswith("getrusage:") and "at most 5.0%" in n for n in f.evidence.notes)


def test_the_profile_cannot_make_a_load_look_cheaper_than_getrusage_allows():
    # cProfile counts the fetch's reads as waits, but the process's CPU shows the loading computed
    data = _two_core_run(32.0, 20.0, cpu_ms=31.0, model_ms=11.0, pstats=_fetch_profile(0.40, 0.004))
    (f,) = judge("GD201", data).findings
    assert _metric(f, "load_kind") == WAITING  # the smaller estimate (cProfile's) is used: 1%
    # without the profile the bound alone says it computes
    (g,) = judge("GD201", _two_core_run(32.0, 20.0, cpu_ms=31.0, model_ms=11.0)).findings
    assert _metric(g, "load_kind") == COMPUTING and _metric(g, "suggested_num_workers") == 1


# ---------------------------------------------------------------- GD201: a computing load


def test_a_computing_load_is_capped_at_the_usable_cores_and_names_its_hot_functions():
    # 40 ms of CPU in decode() per batch, 12 ms of compute, 2 cores: one usable core cannot hide it
    data = _two_core_run(52.0, 40.0, cpu_ms=52.0, model_ms=11.0, pstats=_fetch_profile(0.0, 0.8))
    (f,) = judge("GD201", data).findings
    assert _metric(f, "load_kind") == COMPUTING and "the loading computes" in f.message
    assert _metric(f, "suggested_num_workers") == 1  # 2 cores less 1 for the training process
    assert "capped at 1" in f.fix.instruction and "computing load cannot use more workers than cores" in f.fix.instruction
    assert "cannot hide this load" in f.fix.instruction and "train.py:30(decode)" in f.fix.instruction
    # one worker: max(12 + 1 hand-over, (40 + 1) ÷ 1, (40 CPU + 1) ÷ 1 core, (12 + 40 + 2 × 1) ÷ 2) = 41 ms against
    # 52 ms: 11 of the 40 ms wait (the worker sets the pace, collating into shared memory besides its load; the
    # loop's side of the hand-over runs beside it)
    assert f.gain.expected_fraction == pytest.approx(11 / 40, abs=0.01)
    assert f.gain.expected_share_pct <= f.gain.share_pct
    # the worker and torch's 2 intra-op threads want 3 of the 2 cores: the training process keeps one thread, which
    # costs its compute nothing (it kept one core busy: 12 ms of CPU over 12 ms of compute)
    assert _metric(f, "suggested_num_threads") == 1 and "torch.set_num_threads(1)" in f.fix.instruction
    assert "12.00 ms × 2 threads" not in f.gain.expected_note
    (inj_threads,) = [i for i in _inject("GD201", data, f) if i.kind == "threads"]
    assert (inj_threads.key, inj_threads.value) == ("torch.set_num_threads", 1)


def test_workers_and_intra_op_threads_share_the_cores():
    """A computing load beside a compute that keeps both of its 2 threads busy (the calibration loop: one worker
    beside torch's 2 threads on 2 cores ran 1.27x slower; with one thread, confirmed at the 1.17x expected): the
    training keeps one thread and its compute is taken to double; a waiting load's workers leave the threads be."""
    th = Thresholds()
    computing = Load(4.0 * MS, 4.0 * MS, 1.0, COMPUTING)
    args = dict(compute_ns=2.0 * MS, wait_ns=4.0 * MS, workers_now=0, cores=2, main_cpu_ns=4.0 * MS, mem_cap=None,
                t=th)
    plan = plan_workers(computing, **args, threads_now=2, main_got=2.0)
    assert (plan.workers, plan.threads_after) == (1, 1)
    # max(2 × 2 + 1, (4 + 1) ÷ 1, (4 + 1) ÷ 1, (min(4, 4 × 1) + 4 + 2) ÷ 2) = 5 ms
    assert plan.step_after_ns == pytest.approx(5.0 * MS) and "× 2 threads ÷ 1" in plan.model
    assert "torch.set_num_threads(1)" in plan.model
    # threads that fit beside the worker are left as they are, and so is a compute that keeps one core busy
    assert plan_workers(computing, **args, threads_now=1, main_got=1.0).threads_after is None
    one_core = plan_workers(computing, **args, threads_now=2, main_got=0.9)
    assert one_core.threads_after == 1 and one_core.step_after_ns == pytest.approx(5.0 * MS)
    waiting = Load(40.0 * MS, 1.0 * MS, 0.03, WAITING)
    assert plan_workers(waiting, **{**args, "wait_ns": 40.0 * MS}, threads_now=2, main_got=2.0).threads_after is None
    # 8 cores, 8 threads: the planned workers stay (with their spare), the threads make room for what they keep
    # busy: (40 + 1) ms of CPU per 13 ms step, 3.15 cores, leave 4
    wide = plan_workers(Load(40.0 * MS, 40.0 * MS, 1.0, COMPUTING), compute_ns=12.0 * MS, wait_ns=40.0 * MS,
                        workers_now=0, cores=8, main_cpu_ns=12.0 * MS, mem_cap=None, t=th, threads_now=8,
                        main_got=1.0)
    assert (wide.workers, wide.threads_after) == (5, 4)
    # a worker busy a small share of the step (7 ms of CPU per 101 ms) leaves the threads be
    light = plan_workers(Load(6.0 * MS, 6.0 * MS, 1.0, COMPUTING), compute_ns=94.0 * MS, wait_ns=6.0 * MS,
                         workers_now=0, cores=8, main_cpu_ns=94.0 * MS, mem_cap=None, t=th, threads_now=8)
    assert light.threads_after is None and light.expected_fraction > 0


def test_a_computing_load_the_cores_can_hide_gets_its_gain():
    # 8 cores (7 usable): 40 ms of CPU per batch over 12 ms of compute → ceil(40 ÷ 13) + 1 = 5 workers
    data = _two_core_run(52.0, 40.0, cpu_ms=52.0, model_ms=11.0, pstats=_fetch_profile(0.0, 0.8),
                         manifest=cpu_manifest(cpu_count=8),
                         settings=settings(device_type="cpu", cpu_count=8, num_threads=8))
    (f,) = judge("GD201", data).findings
    assert _metric(f, "suggested_num_workers") == 5 and "cannot hide" not in f.fix.instruction
    # max(12 + 1, 40 ÷ 5, 40 ÷ 7, (12 + 1 + 40) ÷ 8) = 13 ms against 52: 39 of the 40 ms
    assert f.gain.expected_fraction == pytest.approx(39 / 40, abs=0.01)


def test_unmeasured_load_is_sized_as_computing():
    (f,) = judge("GD201", _two_core_run(32.0, 20.0)).findings
    assert _metric(f, "load_kind") == UNMEASURED and _metric(f, "suggested_num_workers") == 1
    assert any("not measured" in n for n in f.evidence.notes)


# ---------------------------------------------------------------- GD201: with workers, from the samples


def _workers_run(cpu_pct_each: float, *, cores: int = 2, runq: float | None = 0.0, rss: int = 10**9,
                 memory: int | None = None):
    """2 workers that fall behind: 100 ms steps, 30 ms waiting; each worker at ``cpu_pct_each``."""
    d = dataloader(num_workers=2, prefetch_factor=2, persistent_workers=True)
    procs = proc_samples(60.0, runq_wait_pct=0.0 if runq is not None else None)
    for pid in (201, 202):
        procs += tuple(ProcessSample(int(i * 100 * MS), pid, "worker", cpu_pct_each, rss, 1, runq_wait_pct=runq)
                       for i in range(20))
    return run(manifest=cpu_manifest(cpu_count=cores), steps=steps(20, 100.0, 30.0),
               settings=settings(device_type="cpu", cpu_count=cores, num_threads=1, dataloaders=(d,)),
               samples=Samples(process=procs, system_memory_bytes=memory))


def test_waiting_workers_are_told_from_their_cpu_in_the_samples():
    # each worker busy 5% of its time: 2 × 100 ms per batch of load, 71 ms of compute → 3 + 1 spare
    (f,) = judge("GD201", _workers_run(5.0)).findings
    assert _metric(f, "load_kind") == WAITING and _metric(f, "suggested_num_workers") == 4
    assert any(n.startswith("psutil: the 2 worker(s) used 0.10 cores") for n in f.evidence.notes)
    assert "prefetch_factor=2" in f.fix.after and 0.0 < f.gain.expected_fraction <= 1.0


def test_computing_workers_at_the_cores_get_a_deeper_queue_and_no_model_gain():
    # 2 workers each at a full core on 2 cores: the cores allow no more workers
    (f,) = judge("GD201", _workers_run(100.0)).findings
    assert _metric(f, "load_kind") == COMPUTING and "num_workers=2," in f.fix.after and "prefetch_factor=4" in f.fix.after
    assert "prefetch_factor=4" in f.fix.instruction and "make loading cheaper" in f.fix.instruction
    assert "profile once with num_workers=0" in f.fix.instruction  # workers are not under cProfile
    assert f.gain.expected_fraction is None and f.gain.share_pct > 0


def test_memory_bounds_the_workers():
    # 8 GB machine, 1 GB per worker (RSS), 1 GB training process: 50% of 8 GB less 1 GB holds 3 workers
    (f,) = judge("GD201", _workers_run(5.0, memory=8 * 2**30, rss=2**30)).findings
    assert _metric(f, "workers_memory_cap_count") == 3 and _metric(f, "suggested_num_workers") == 3
    assert "capped at 3: memory:" in f.fix.instruction


def test_the_most_workers_recommended_is_a_threshold():
    # 200 ms of sleep per batch, 2 ms of compute: 67 + 1 workers would hide it; at most 16
    data = _two_core_run(202.0, 200.0, cpu_ms=2.0, model_ms=1.5, pstats=_fetch_profile(4.0, 0.01))
    (f,) = judge("GD201", data).findings
    assert _metric(f, "suggested_num_workers") == 16 and "dataloader_max_workers_count=16" in f.fix.instruction
    # 200 ÷ 16 = 12.5 ms per batch: the model does not promise the whole wait
    assert f.gain.expected_fraction == pytest.approx((202 - 12.5) / 200, abs=0.01)
    (g,) = judge("GD201", data, dataloader_max_workers_count=8).findings
    assert _metric(g, "suggested_num_workers") == 8 and g.gain.expected_fraction < f.gain.expected_fraction


# ---------------------------------------------------------------- GD201: the model itself


@pytest.mark.parametrize("kind", [WAITING, COMPUTING, UNMEASURED])
@pytest.mark.parametrize("load_ms,compute_ms,cores", [(20, 12, 2), (5, 50, 2), (300, 10, 4), (60, 40, 16), (2, 1, 1)])
def test_the_expected_fraction_is_bounded_and_computed_for_the_count_recommended(kind, load_ms, compute_ms, cores):
    th = Thresholds()
    cpu = {WAITING: 0.05, COMPUTING: 1.0, UNMEASURED: None}[kind]
    load = Load(load_ms * MS, None if cpu is None else cpu * load_ms * MS, cpu, kind)
    plan = plan_workers(load, compute_ns=compute_ms * MS, wait_ns=load_ms * MS, workers_now=0, cores=cores,
                        main_cpu_ns=compute_ms * MS, mem_cap=None, t=th)
    assert 1 <= plan.workers <= th.dataloader_max_workers_count
    if kind != WAITING:
        assert plan.workers <= max(1, cores - th.dataloader_reserved_cores)
    assert 0.0 <= plan.expected_fraction <= 1.0
    # the fraction is the model's step for that count
    running = plan.workers if kind == WAITING else min(plan.workers, max(1, cores - 1))
    # a pipeline: the loop's stage (compute and the hand-over) or the workers', whichever is slower
    assert plan.step_after_ns >= max(compute_ms * MS + th.dataloader_handover_ms * MS, load_ms * MS / running)
    now = (compute_ms + load_ms) * MS
    won = now - plan.step_after_ns  # under the hand-over: within what the model can tell, no gain promised
    want = max(0.0, min(1.0, won / (load_ms * MS))) if won >= th.dataloader_handover_ms * MS else 0.0
    assert plan.expected_fraction == pytest.approx(want)


def test_a_win_under_the_hand_over_is_not_promised():
    """tuned_baseline on 2 cores, its CPU saturated: workers would leave the step at 56.42 ms of 56.18 ms (the CPU
    of both sides of the hand-over on the 2 cores), no win the model can tell; with the whole CPU term gone the
    same wait is won."""
    th = Thresholds()
    load = Load(112.4 * MS, 5.5 * MS, 0.05, WAITING)
    plan = plan_workers(load, compute_ns=52.67 * MS, wait_ns=3.51 * MS, workers_now=2, cores=2,
                        main_cpu_ns=105.34 * MS, mem_cap=None, t=th)
    assert (52.67 + 3.51) * MS - plan.step_after_ns < th.dataloader_handover_ms * MS
    assert plan.expected_fraction == 0.0
    free = plan_workers(load, compute_ns=52.67 * MS, wait_ns=3.51 * MS, workers_now=2, cores=8,
                        main_cpu_ns=52.0 * MS, mem_cap=None, t=th)
    assert free.step_after_ns == pytest.approx(53.67 * MS) and free.expected_fraction == pytest.approx(2.51 / 3.51)


def test_a_win_under_the_noise_of_the_step_is_not_promised():
    """tuned_baseline on a noisier run (CI: a warning on the tuned baseline): workers would leave the step at
    61.68 ms of 62.79 ms, a win of 1.11 ms, over the 1 ms hand-over but under two standard errors of the
    mean of the step less its wait (1.9 ms over 8 steps); the same win with a steadier step is promised."""
    th = Thresholds()
    load = Load(125.59 * MS, 6.03 * MS, 0.048, WAITING)
    args = dict(compute_ns=59.50 * MS, wait_ns=3.29 * MS, workers_now=2, cores=2, main_cpu_ns=115.33 * MS,
                mem_cap=None, t=th)
    noisy = plan_workers(load, **args, noise_ns=1.9 * MS)
    won = (59.50 + 3.29) * MS - noisy.step_after_ns
    assert th.dataloader_handover_ms * MS < won < 1.9 * MS
    assert noisy.expected_fraction == 0.0 and "within the noise" in noisy.model
    steady = plan_workers(load, **args, noise_ns=0.5 * MS)
    assert steady.expected_fraction == pytest.approx(won / (3.29 * MS)) and "noise" not in steady.model


def test_classify_reads_its_threshold():
    assert classify(0.5, 50.0) == WAITING and classify(0.51, 50.0) == COMPUTING and classify(None, 50.0) == UNMEASURED


# ---------------------------------------------------------------- GD201 from a bare trace


def test_a_bare_trace_with_the_single_process_iterator_expects_all_but_the_hand_over():
    m = trace(breakdown_mean_pct={"data_loading": 40.0, "gpu_compute": 60.0}, dataloader_iter="single-process")
    (f,) = judge("GD201", run(metrics=(m,))).findings
    # 5 steps of 10 ms, 4 ms waiting each: workers leave the 1 ms hand-over
    assert f.gain.expected_fraction == pytest.approx(0.75)
    assert "a bare trace records neither" in f.gain.expected_note
    m = trace(breakdown_mean_pct={"data_loading": 40.0, "gpu_compute": 60.0}, dataloader_iter="multi-process")
    (g,) = judge("GD201", run(metrics=(m,))).findings
    assert g.gain.expected_fraction is None and g.gain.share_pct == pytest.approx(40.0)


# ---------------------------------------------------------------- GD104 batch-too-small


def _launch_bound(peak_gb: float, optimizer: OptimizerSetting | None = None):
    m = trace(
        utilization=(utilization(40.0, causes={GapCause.LAUNCH_BOUND: 1.0}),),
        memory=(MemoryStats(0, peak_reserved_bytes=int(peak_gb * GB), total_bytes=80 * GB),),
    )
    s = settings(dataloaders=(dataloader(batch_size=16),), optimizers=(optimizer,) if optimizer else ())
    return run(metrics=(m,), settings=s, manifest=manifest())


def test_gd104_sizes_the_batch_to_hide_the_launch_overhead_with_its_gain():
    # 40% of the step is launch overhead, 60% the GPU busy: 2× covers the host's issue time (100 ÷ 60)
    (f,) = judge("GD104", _launch_bound(10.0)).findings
    assert _metric(f, "batch_factor") == 2 and "batch_size=32" in f.fix.after
    assert "hides the launch overhead" in f.fix.instruction
    # per sample: max(10 ms ÷ 2, 6 ms) = 6 ms against 10 ms: the 4 ms of overhead, whole
    assert f.gain.expected_fraction == pytest.approx(1.0)
    assert f.gain.expected_share_pct <= f.gain.share_pct


def test_gd104_headroom_leaves_out_what_does_not_grow_with_the_batch():
    plan = plan_batch(peak_bytes=40 * GB, total_bytes=80 * GB, fixed=0, limit_pct=90.0, busy_ns=1 * MS,
                      overhead_ns=9 * MS, total_ns=10 * MS)
    assert plan.factor == 1.5 and plan.memory_factor == pytest.approx(1.8)  # doubling would pass 90%
    # 30 GB of the 38 are weights, gradients and Adam's moments: the activations (8 GB) can grow 5.25×
    adam = OptimizerSetting(None, "torch.optim.AdamW", None, None, num_params=30 * GB // 16)
    plan = plan_batch(peak_bytes=38 * GB, total_bytes=80 * GB, fixed=30 * GB, limit_pct=90.0, busy_ns=1 * MS,
                      overhead_ns=9 * MS, total_ns=10 * MS)
    assert plan.memory_factor == pytest.approx(5.25) and plan.factor == 4
    # per sample: max(10 ÷ 4, 1) = 2.5 ms against 10 ms: 7.5 of the 9 ms of overhead
    assert plan.expected_fraction == pytest.approx(7.5 / 9)
    (f,) = judge("GD104", _launch_bound(38.0, adam)).findings
    assert _metric(f, "fixed_memory_bytes") == 30 * GB and "stay, the rest grows" in f.fix.instruction


# ---------------------------------------------------------------- GD204 cpu-oversubscription


def test_gd204_puts_the_oversubscription_in_step_time_from_the_cpu_while_computing():
    # 2 cores, training process with 2 threads, 2 one-thread workers wanting 1.2 cores each, the loop
    # waiting 30 of 100 ms; getrusage: 35 ms of CPU in the 70 ms of compute, half a core
    d = dataclasses.replace(dataloader(num_workers=2, prefetch_factor=2), has_worker_init_fn=True)
    procs = proc_samples(50.0, runq_wait_pct=150.0)
    procs += proc_samples(40.0, role="worker", pid=201, runq_wait_pct=80.0)
    procs += proc_samples(40.0, role="worker", pid=202, runq_wait_pct=80.0)
    data = run(manifest=cpu_manifest(cpu_count=2),
               settings=settings(device_type="cpu", num_threads=2, cpu_count=2, dataloaders=(d,)),
               steps=steps(20, 100.0, 30.0, user_ms=35.0, sys_ms=0.0), samples=Samples(process=procs))
    (f,) = judge("GD204", data).findings
    claimed = {c.component for c in f.gain.claims}
    assert "data_loading" in claimed and f.gain.share_pct > 30.0
    assert "0.50 cores now" in f.gain.expected_note
    assert 0.0 <= f.gain.expected_fraction <= 1.0 and f.gain.expected_share_pct <= f.gain.share_pct
    assert f.severity == Severity.ERROR
    # the step after is never longer than the step now, nor shorter than the compute can go
    after = _metric(f, "expected_step_ns")
    assert 0 < after <= 100 * MS


def test_gd204_expects_nothing_it_cannot_model_when_the_workers_pools_spin():
    # the same run with workers running thread pools (1.9 cores wanted each): their CPU is spinning at
    # OpenMP barriers, no measure of the work one thread each will do; the bound stays, no expected gain
    d = dataclasses.replace(dataloader(num_workers=2, prefetch_factor=2), has_worker_init_fn=True)
    procs = proc_samples(50.0, runq_wait_pct=150.0)
    procs += proc_samples(40.0, role="worker", pid=201, threads=4, runq_wait_pct=150.0)
    procs += proc_samples(40.0, role="worker", pid=202, threads=4, runq_wait_pct=150.0)
    data = run(manifest=cpu_manifest(cpu_count=2),
               settings=settings(device_type="cpu", num_threads=2, cpu_count=2, dataloaders=(d,)),
               steps=steps(20, 100.0, 30.0, user_ms=35.0, sys_ms=0.0), samples=Samples(process=procs))
    (f,) = judge("GD204", data).findings
    assert f.gain.share_pct > 30.0 and f.gain.speedup_bound > 1.0
    assert f.gain.expected_fraction is None and f.gain.expected_speedup is None
    assert "no expected gain: the workers' thread pools spin" in f.gain.note
    assert not [m for m in f.evidence.metrics if m.name == "expected_step_ns"]
    # spinning pools stretch the compute beyond what the run-queue figures see, every step's alike: the whole
    # step is at stake (a bound from the least compute a step showed was beaten: 27.65x measured against 11.78x
    # on Python 3.12; 9.85x against 9.10x from the run-queue figures before that), a faster step changes nothing
    assert f.gain.share_pct == pytest.approx(99.9, abs=0.1)
    fast = tuple(dataclasses.replace(x, wall_ns=x.data_wait_ns + 20 * MS) if x.index == 19 else x
                 for x in data.steps)
    (g,) = judge("GD204", dataclasses.replace(data, steps=fast)).findings
    assert g.gain.share_pct == pytest.approx(f.gain.share_pct, abs=0.1)


def test_gd204_without_per_step_records_keeps_the_demand_as_its_figure():
    d = dataclasses.replace(dataloader(num_workers=2, prefetch_factor=2), has_worker_init_fn=True)
    procs = proc_samples(20.0, runq_wait_pct=160.0)
    procs += proc_samples(25.0, role="worker", pid=201, runq_wait_pct=170.0)
    procs += proc_samples(25.0, role="worker", pid=202, runq_wait_pct=170.0)
    data = run(manifest=cpu_manifest(cpu_count=2),
               settings=settings(device_type="cpu", num_threads=2, cpu_count=2, dataloaders=(d,)),
               samples=Samples(process=procs))
    res = judge("GD204", data)
    assert res.verdict == Verdict.FIRED
    (f,) = res.findings
    assert f.gain.share_pct is None and f.gain.expected_fraction is None and f.severity == Severity.ERROR
    assert math.isclose(_metric(f, "cpu_demand_unserved_pct"), 64.9, abs_tol=0.1)
