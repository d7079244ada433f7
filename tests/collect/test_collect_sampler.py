"""The sampler's pieces that need no training run: roles, run-queue wait, the machine's load."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
import types
from pathlib import Path

import pytest

from gpudoctor.collect.sampler import ROLE_CHILD, ROLE_WORKER, HostCpu, RunQueueWait, _role

MS = 1_000_000


def _proc(cmd: list[str]):
    return types.SimpleNamespace(cmdline=lambda: cmd)


def test_roles_tell_workers_from_multiprocessing_bookkeeping():
    main = [sys.executable, "train.py"]
    assert _role(_proc(main), main) == ROLE_WORKER  # forked
    spawn = [sys.executable, "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
             "--multiprocessing-fork"]
    assert _role(_proc(spawn), main) == ROLE_WORKER
    tracker = [sys.executable, "-c", "from multiprocessing.resource_tracker import main;main(8)"]
    assert _role(_proc(tracker), main) == ROLE_CHILD
    assert _role(_proc(["/bin/sh", "-c", "nvidia-smi"]), main) == ROLE_CHILD


def _write(root: Path, pid: int, waits: dict[int, int]) -> None:
    for tid, wait in waits.items():
        d = root / str(pid) / "task" / str(tid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "schedstat").write_text(f"123456 {wait} 7\n")


def test_run_queue_wait_sums_thread_deltas_over_the_interval(tmp_path):
    (tmp_path / "self" / "task").mkdir(parents=True)
    rq = RunQueueWait(str(tmp_path))
    _write(tmp_path, 42, {42: 1000 * MS, 43: 500 * MS})
    assert rq.sample(42, 0) is None  # first reading primes
    # 200 ms later: thread 42 waited 100 ms more, 43 waited 200 ms more, new thread 44 waited 50 ms
    _write(tmp_path, 42, {42: 1100 * MS, 43: 700 * MS, 44: 50 * MS})
    assert rq.sample(42, 200 * MS) == 175.0  # 350 ms of waiting in 200 ms: 1.75 threads
    # a thread that ended just drops out; counters never go backwards into negative waits
    (tmp_path / "42" / "task" / "44" / "schedstat").unlink()
    (tmp_path / "42" / "task" / "44").rmdir()
    _write(tmp_path, 42, {42: 1100 * MS, 43: 700 * MS})
    assert rq.sample(42, 400 * MS) == 0.0
    assert rq.sample(99, 400 * MS) is None  # no such process
    rq.forget({99})
    assert rq.sample(42, 600 * MS) is None  # forgotten: primes again


def test_run_queue_wait_unavailable_is_none(tmp_path):
    rq = RunQueueWait(str(tmp_path))  # no <root>/self/task: not a Linux /proc
    assert not rq.available and rq.sample(os.getpid(), 0) is None


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"),
                    reason="no Linux schedstat on this machine")
def test_run_queue_wait_sees_threads_competing_for_cores():
    """Three spinning processes per core: each waits for a core about two thirds of the time.
    (Processes, not threads: Python threads would wait for the GIL, not for a core.)"""
    cores = len(os.sched_getaffinity(0))
    rq = RunQueueWait()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_spin_for, args=(0.6,)) for _ in range(cores * 3)]
    for p in procs:
        p.start()
    t0 = time.monotonic_ns()
    for p in procs:
        rq.sample(p.pid, t0)
    time.sleep(0.4)
    t1 = time.monotonic_ns()
    waits = [rq.sample(p.pid, t1) for p in procs]
    for p in procs:
        p.join()
    total = sum(w for w in waits if w is not None)
    assert total / 100.0 > cores, waits


def _spin_for(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


# ---------------------------------------------------------------- the machine's load (HostCpu)


def test_host_cpu_is_the_busy_share_of_every_core_since_the_last_sample(tmp_path, monkeypatch):
    (tmp_path / "stat").write_text("cpu  1 2 3 4\nintr 5\nprocs_running 3\nprocs_blocked 0\n")
    host = HostCpu(str(tmp_path))
    readings = iter([(100.0, 50.0, 1.0), (110.0, 58.0, 1.5)])  # CPU-seconds of all cores: total, busy, steal
    monkeypatch.setattr(HostCpu, "_times", staticmethod(lambda: next(readings)))
    assert host.sample(0) is None  # the first reading primes
    s = host.sample(200 * MS)
    cores = os.cpu_count() or 1
    # 8 of the 10 CPU-seconds that passed were busy: 80% of every core, 100 = one core
    assert s.t_ns == 200 * MS and s.cpu_pct == pytest.approx(80.0 * cores, abs=0.1)
    assert s.steal_pct == pytest.approx(5.0 * cores, abs=0.1) and s.procs_running == 3


def test_host_cpu_without_proc_stat_leaves_runnable_threads_unknown(tmp_path):
    assert HostCpu(str(tmp_path)).procs_running() is None


def test_host_cpu_sees_a_busy_core():
    """A process spinning for 0.5 s: the machine was busy at least most of one core meanwhile."""
    host = HostCpu()
    ctx = mp.get_context("fork")
    p = ctx.Process(target=_spin_for, args=(0.5,))
    host.sample(0)
    p.start()
    p.join()
    s = host.sample(500 * MS)
    assert s is not None and s.cpu_pct >= 70.0
