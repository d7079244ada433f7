"""The DataLoader's load (GD201, GD204): the fetch's cProfile, the training process's CPU readings,
the workers' samples, and the step a number of workers gives."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass

from gpudoctor.model.metrics import Component
from gpudoctor.model.run import PstatsEntry, StepRecord
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.profiles import user_functions

# cProfile's names of calls in which a thread waits rather than computes: sleeping, polling, socket and
# file I/O, waiting for a lock, a thread or a child process. A read served from the page cache is CPU
# work under the same name; the rules bound it by the process's CPU time (getrusage).
_WAITING_CALL_RE = re.compile(
    r"^<built-in method (?:time\.sleep|select\.\w+|_socket\.\w+|posix\.(?:read|readv|pread|preadv|waitpid|wait\w*"
    r"|open|stat|lstat|fstat|sendfile|scandir|listdir)|io\.open|_io\.open|nt\.\w+)>$"
    r"|^<method '(?:recv\w*|send\w*|accept|connect\w*|read\w*|peek|poll|select|control|acquire|wait\w*|join"
    r"|do_handshake|get)' of '(?:_socket\.socket|_ssl\._SSLSocket|_io\.\w+|select\.\w+|_thread\.\w+"
    r"|_multiprocessing\.SemLock|_queue\.SimpleQueue|mmap\.mmap)' objects>$"
)


def is_waiting_call(e: PstatsEntry) -> bool:
    """A call whose self time is a thread blocked (sleep, I/O, a socket, a lock), not computing."""
    return bool(_WAITING_CALL_RE.match(e.function))


@dataclass(frozen=True, slots=True)
class LoaderProfile:
    """The cProfile of the DataLoader's fetch in the training process (``num_workers=0``)."""

    fetch_s: float  # time inside the fetch (the dataset's __getitem__ and the collate_fn)
    waiting_s: float  # of it, in calls that wait (sleep, I/O, sockets, locks)
    waits: tuple[PstatsEntry, ...]  # those calls, most time first
    hot: tuple[PstatsEntry, ...]  # the computing functions with the most self time inside it
    own: tuple[PstatsEntry, ...]  # the user's own functions inside it, most time inside first

    @property
    def cpu_frac(self) -> float:
        """The share of the fetch's time that is not waiting: an estimate of its CPU ÷ wall time."""
        return max(0.0, min(1.0, 1.0 - self.waiting_s / self.fetch_s)) if self.fetch_s > 0 else 1.0


def loader_profile(entries: tuple[PstatsEntry, ...], top: int = 3) -> LoaderProfile | None:
    """The loading code's time in the cProfile (``PstatsEntry.loader_*``, parsed along caller edges);
    None when the training process ran no fetch (workers load, or no cProfile)."""
    inside = [e for e in entries if e.loader_cumtime_s > 0.0]
    if not inside:
        return None
    fetch_s = max(e.loader_cumtime_s for e in inside)
    waits = sorted((e for e in inside if is_waiting_call(e) and e.loader_tottime_s > 0.0),
                   key=lambda e: -e.loader_tottime_s)
    hot = sorted((e for e in inside if not is_waiting_call(e) and e.loader_tottime_s > 0.0),
                 key=lambda e: -e.loader_tottime_s)
    own_set = {id(e) for e in user_functions(tuple(inside))}
    own = sorted((e for e in inside if id(e) in own_set), key=lambda e: -e.loader_cumtime_s)
    waiting_s = min(fetch_s, sum(e.loader_tottime_s for e in waits))
    return LoaderProfile(fetch_s, waiting_s, tuple(waits[:top]), tuple(hot[:top]), tuple(own[:top]))


@dataclass(frozen=True, slots=True)
class CpuReading:
    """One getrusage reading of the training process (every thread) and the steps it covers."""

    steps: int
    wall_ns: int
    cpu_ns: int  # user + system
    wait_ns: int  # of the wall time, blocked in DataLoader.__next__
    model_ns: int | None  # in the model's calls (forward, backward, optimizer.step); None: not timed
    instrumented: bool  # a covered step ran under torch.profiler or cProfile (their own CPU is in it)


_MIN_PLAIN_READINGS = 5  # uninstrumented readings enough to judge from them alone


def cpu_readings(steps: tuple[StepRecord, ...]) -> tuple[CpuReading, ...]:
    """The readings among ``steps`` (in order): a row with CPU figures covers ``cpu_steps`` steps
    ending at it (itself and the rows just before it without figures); a reading whose steps are not
    all among ``steps`` is left out. Those of steps without an instrument when there are enough of
    them: torch.profiler's and cProfile's own work (a trace export: seconds of CPU in one step) is
    in the others' figures."""
    out: list[CpuReading] = []
    group: list[StepRecord] = []
    prev = None
    for s in steps:
        if prev is not None and s.index != prev + 1:
            group = []
        prev = s.index
        group.append(s)
        if s.user_cpu_ns is None or s.sys_cpu_ns is None:
            continue
        k = max(1, s.cpu_steps or 1)
        if len(group) >= k:
            covered = group[-k:]
            timed = all(x.backward_ns is not None and x.optimizer_ns is not None for x in covered)
            out.append(CpuReading(
                steps=k,
                wall_ns=sum(x.wall_ns for x in covered),
                cpu_ns=s.user_cpu_ns + s.sys_cpu_ns,
                wait_ns=sum(min(x.data_wait_ns, x.wall_ns) for x in covered),
                model_ns=sum((x.forward_ns or 0) + (x.backward_ns or 0) + (x.optimizer_ns or 0) for x in covered)
                if timed else None,
                instrumented=any(x.window for x in covered),
            ))
        group = []
    plain = [r for r in out if not r.instrumented]
    return tuple(plain if len(plain) >= _MIN_PLAIN_READINGS else out)


@dataclass(frozen=True, slots=True)
class WorkerUse:
    """The DataLoader workers in the psutil samples taken while the steps ran (medians over instants)."""

    workers: int  # worker processes seen at an instant (median)
    cpu_cores: float  # the cores they used together (psutil CPU %, ÷ 100)
    wanted_cores: float | None  # the cores they wanted: used + waiting in the run queue (None: no schedstat)
    worker_rss_bytes: int | None  # the median worker's resident memory
    main_rss_bytes: int | None  # the training process's resident memory
    ticks: int


def worker_use(ctx: RuleContext) -> WorkerUse | None:
    """The workers' and the training process's figures over the steps' span (every sample without
    steps); None without a sample of the training process."""
    steps = ctx.steps()
    lo, hi = (steps[0].start_ns, max(s.start_ns + s.wall_ns for s in steps)) if steps else (None, None)
    ticks: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    worker_rss: list[int] = []
    main_rss: list[int] = []
    runq_known = True
    for p in ctx.samples_process():
        if p.role not in ("main", "worker") or (lo is not None and not lo <= p.t_ns <= hi):
            continue
        tick = ticks[p.t_ns]
        if p.role == "main":
            tick["main"] = 1.0
            main_rss.append(p.rss_bytes)
            continue
        tick["n"] += 1
        tick["cpu"] += p.cpu_pct / 100.0
        if p.runq_wait_pct is None:
            runq_known = False
        else:
            tick["runq"] += p.runq_wait_pct / 100.0
        worker_rss.append(p.rss_bytes)
    rows = [v for v in ticks.values() if v.get("main")]
    if not rows:
        return None
    return WorkerUse(
        workers=int(statistics.median(v["n"] for v in rows)),
        cpu_cores=statistics.median(v["cpu"] for v in rows),
        wanted_cores=statistics.median(v["cpu"] + v["runq"] for v in rows) if runq_known and worker_rss else None,
        worker_rss_bytes=int(statistics.median(worker_rss)) if worker_rss else None,
        main_rss_bytes=int(statistics.median(main_rss)) if main_rss else None,
        ticks=len(rows),
    )


#: The training process's own time on a run without a GPU, outside its data wait: every host part of a
#: ledger but communication. GD201 and GD204 claim a share of them where their fix shortens the compute.
HOST_PARTS = (Component.CPU_COMPUTE, Component.FORWARD, Component.BACKWARD, Component.OPTIMIZER,
              Component.LAUNCH_OVERHEAD, Component.OTHER_CPU, Component.UNEXPLAINED)


def loader_step_ns(
    *,
    compute_ns: float,
    load_ns: float,
    load_cpu_ns: float | None,
    workers: int,
    usable_cores: float | None,
    cores: float | None,
    main_cpu_ns: float | None,
    handover_ns: float,
) -> float:
    """The step per batch with ``workers`` DataLoader workers (GD201's model, also GD204's)::

        step = max(compute + handover, (load + handover) ÷ workers, (load_cpu + handover) ÷ usable_cores,
                   (main_cpu + load_cpu + 2 × handover) ÷ cores)

    A pipeline runs at the rate of its slowest stage. The loop takes a batch every ``compute`` (the
    step less its data wait) plus the hand-over of the batch from a worker (unpickling it, mapping its
    shared memory); ``workers`` deliver ``workers`` batches per ``load`` (the wall time of one batch in
    one worker) and the hand-over's other side (collating into shared memory, pickling it onto the
    queue), in parallel with the loop; the workers' CPU per batch cannot run faster than the cores
    left to them allow, nor can the training process's and the workers' CPU together exceed all the
    cores. Terms whose figures are unknown (None) are left out. (Until issue 37 the hand-over was added
    after the max: where the workers set the pace, it was counted twice, and a held-out loader that
    waits 30 ms per batch, 14 workers, measured 2.27 ms per step against the 3.17 ms expected. Until
    issue 42 the workers' side of it was left out: a loader that computes 3.6 ms per batch, one worker,
    delivered a batch every 4.7-5.3 ms.)"""
    terms = [compute_ns + handover_ns, (load_ns + handover_ns) / max(1, workers)]
    if load_cpu_ns is not None and usable_cores:
        terms.append((load_cpu_ns + handover_ns) / usable_cores)
    if load_cpu_ns is not None and main_cpu_ns is not None and cores:
        terms.append((main_cpu_ns + load_cpu_ns + 2 * handover_ns) / cores)
    return max(terms)
