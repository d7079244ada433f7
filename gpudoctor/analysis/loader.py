"""The DataLoader's load, part of the run's figures (``RunFigures.loader``; DESIGN.md, "The run's figures").

How long loading one batch takes in one worker, its CPU time, the share of a core it wants while it runs
and so its *kind* (``WAITING``: storage, a network, a sleep; ``COMPUTING``: it keeps a core busy;
``UNMEASURED``), with how each figure was measured, in words; the training process's own CPU per batch
without the loading; the measurements they come from: the fetch's cProfile (``num_workers=0``), the
training process's getrusage readings (``CpuReading``), the workers' psutil samples (``WorkerUse``), the
threads that wanted a core (``Demand``), and the machine's load as GD205 judges it (``busy``, the cores
other processes left). Computed once per diagnosis from the run's records, settings, samples and cProfile,
over the account's steps (``RankSteps.account``: the unprofiled steady steps where there are enough), per
batch (gradient accumulation: the step ÷ its micro-batches). GD201 sizes its workers from it
(``rules.load_model.plan_workers``); GD202, GD203, GD204 and GD205 read the same measurements.

The thresholds that judge the figures (the kind's CPU share, GD205's contention) come from the diagnosis
(``LoaderLimits``: ``config.Thresholds`` has them); this layer does not import the configuration.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpudoctor.analysis.cprofile import entry_name, user_functions
from gpudoctor.analysis.load import free_cores
from gpudoctor.model import HostLoad
from gpudoctor.model.findings import RunData
from gpudoctor.model.run import PstatsEntry, Samples, StepRecord
from gpudoctor.model.steady import main_dataloader
from gpudoctor.model.units import duration_text, pct_text

if TYPE_CHECKING:
    from gpudoctor.analysis.figures import RankSteps

__all__ = [
    "COMPUTING", "UNMEASURED", "WAITING", "CpuReading", "Demand", "Load", "LoaderFigures", "LoaderLimits",
    "LoaderProfile", "WorkerUse", "classify", "cpu_readings", "is_waiting_call", "loader_figures", "loader_profile",
    "machine_busy", "measure_load", "runnable_demand", "worker_use",
]

WAITING = "waiting"  # wall time ≫ CPU time: storage, network, a sleep
COMPUTING = "computing"  # the loading keeps a core busy
UNMEASURED = "unmeasured"  # no CPU figure of the loading: sized as if it computed


class LoaderLimits(Protocol):
    """The thresholds the loader's figures are judged by (``config.Thresholds`` has them)."""

    dataloader_waiting_cpu_max_pct: float  # at most this CPU share of its wall time, a load waits
    cpu_contention_wait_pct: float  # GD205: the training process waited for a core at least this share ...
    cpu_contention_others_pct: float  # ... while other processes used at least this much (100 = one core)


def _ns(ns: float | None) -> str:
    return duration_text(ns, "?", precise=True)


def _pct(p: float | None) -> str:
    return pct_text(p, "?")


# --------------------------------------------------------------------------- the fetch's cProfile

# cProfile's names of calls in which a thread waits rather than computes: sleeping, polling, socket and
# file I/O, waiting for a lock, a thread or a child process. A read served from the page cache is CPU
# work under the same name; the figures bound it by the process's CPU time (getrusage).
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


# --------------------------------------------------------------------------- the process's CPU and samples


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


def cpu_readings(steps: Sequence[StepRecord]) -> tuple[CpuReading, ...]:
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


def _span(steps: Sequence[StepRecord]) -> tuple[int | None, int | None]:
    return (steps[0].start_ns, max(s.start_ns + s.wall_ns for s in steps)) if steps else (None, None)


@dataclass(frozen=True, slots=True)
class WorkerUse:
    """The DataLoader workers in the psutil samples taken while the steps ran (medians over instants)."""

    workers: int  # worker processes seen at an instant (median)
    cpu_cores: float  # the cores they used together (psutil CPU %, ÷ 100)
    wanted_cores: float | None  # the cores they wanted: used + waiting in the run queue (None: no schedstat)
    worker_rss_bytes: int | None  # the median worker's resident memory
    main_rss_bytes: int | None  # the training process's resident memory
    ticks: int


def worker_use(samples: Samples | None, steps: Sequence[StepRecord]) -> WorkerUse | None:
    """The workers' and the training process's figures over the span of ``steps`` (every sample without
    steps); None without a sample of the training process."""
    lo, hi = _span(steps)
    ticks: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    worker_rss: list[int] = []
    main_rss: list[int] = []
    runq_known = True
    for p in samples.process if samples is not None else ():
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


@dataclass(frozen=True, slots=True)
class Demand:
    """Threads that wanted a core (on it or waiting for it), medians over sample instants."""

    tree: float
    main: float
    workers: float  # all workers together
    workers_cpu: float  # the cores the workers got (psutil CPU %, without the waiting)
    per_worker: float  # the median worker
    main_wait: float  # the training process's threads waiting for a core
    ticks: int


def runnable_demand(samples: Samples | None, steps: Sequence[StepRecord]) -> Demand | None:
    """CPU + run-queue wait of the training process and its workers, in threads, over the span of
    ``steps`` (every sample without steps); None without run-queue figures."""
    per_t: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    per_worker: dict[int, list[float]] = defaultdict(list)
    lo, hi = _span(steps)
    for p in samples.process if samples is not None else ():
        if p.role not in ("main", "worker") or p.runq_wait_pct is None:
            continue
        if lo is not None and not lo <= p.t_ns <= hi:
            continue
        threads = (p.cpu_pct + p.runq_wait_pct) / 100.0
        tick = per_t[p.t_ns]
        tick[p.role] += threads
        if p.role == "main":
            tick["main_wait"] += p.runq_wait_pct / 100.0
            tick["has_main"] = 1.0
        else:
            tick["worker_cpu"] += p.cpu_pct / 100.0
            per_worker[p.pid].append(threads)
    ticks = [v for v in per_t.values() if v.get("has_main")]
    if not ticks:
        return None
    return Demand(
        tree=statistics.median(v["main"] + v["worker"] for v in ticks),
        main=statistics.median(v["main"] for v in ticks),
        workers=statistics.median(v["worker"] for v in ticks),
        workers_cpu=statistics.median(v["worker_cpu"] for v in ticks),
        per_worker=statistics.median(statistics.median(v) for v in per_worker.values()) if per_worker else 0.0,
        main_wait=statistics.median(v["main_wait"] for v in ticks),
        ticks=len(ticks),
    )


def machine_busy(load: HostLoad | None, cores: int | None, limits: LoaderLimits) -> tuple[str, float | None]:
    """GD205's case, in words ("" when not: the training process waited for cores while other processes held
    them), and the cores other processes left free (None unknown), from the machine's load over the steps."""
    free = free_cores(load, cores)
    if load is None or load.runq_wait_pct is None or load.others_cpu_pct is None:
        return "", free
    if load.runq_wait_pct < limits.cpu_contention_wait_pct or load.others_cpu_pct < limits.cpu_contention_others_pct:
        return "", free
    return (f"the machine was busy: the training process waited for a core {load.runq_wait_pct:.1f}% of the time "
            f"while other processes used {load.others_cpu_pct / 100:.2f} cores"), free


def uses_gpu(run: RunData) -> bool:
    """GPU work seen in a trace, or the run used a CUDA device (``RuleContext.has_gpu``)."""
    if any(m.has_gpu_activity for m in run.metrics):
        return True
    s = run.settings
    if s is not None and s.device_type not in ("cpu", ""):
        return True
    return any(g.util_pct is not None for g in (run.samples.gpu if run.samples else ()))


# --------------------------------------------------------------------------- the load of a batch


@dataclass(frozen=True, slots=True)
class Load:
    """Loading one batch, measured: its wall time in one worker and its CPU time."""

    load_ns: float  # wall time of one batch in one worker (with num_workers=0: the wait itself)
    cpu_ns: float | None  # CPU time of one batch (None: not measured)
    wanted_frac: float | None  # cores the loading wants while it runs, 0..1 (CPU ÷ wall; workers: + run-queue wait)
    kind: str  # WAITING, COMPUTING or UNMEASURED
    evidence: tuple[str, ...] = ()  # how each figure was measured, in words
    profile: LoaderProfile | None = None  # the cProfile of the fetch (num_workers=0)

    @property
    def kind_text(self) -> str:
        """The load's kind in a message ("" where its CPU was not measured)."""
        if self.wanted_frac is None:
            return ""
        cpu = _pct(100.0 * self.wanted_frac)
        if self.kind == WAITING:
            return f"the loading waits rather than computes (it keeps a core busy {cpu} of its time)"
        return f"the loading computes (it keeps a core busy {cpu} of its time)"

    @property
    def hot_text(self) -> str:
        """The loading code's hot functions, from the cProfile of the fetch (num_workers=0)."""
        p = self.profile
        if p is None or not p.hot:
            if self.profile is None and self.kind == COMPUTING:
                return ("the workers' code is not under cProfile: profile once with num_workers=0 to see the loading "
                        "code's hot functions")
            return ""
        share = ", ".join(f"{entry_name(e)} {_pct(100.0 * e.loader_tottime_s / p.fetch_s)}" for e in p.hot)
        own = ", ".join(f"{entry_name(e)} {_pct(100.0 * e.loader_cumtime_s / p.fetch_s)}" for e in p.own)
        text = f"the loading's hot functions (cProfile, share of the fetch's time): {share}"
        return text + (f"; your code in it: {own}" if own else "")


def classify(wanted_frac: float | None, waiting_max_pct: float) -> str:
    """WAITING when the loading wants at most ``waiting_max_pct`` % of a core while it runs."""
    if wanted_frac is None:
        return UNMEASURED
    return WAITING if 100.0 * wanted_frac <= waiting_max_pct else COMPUTING


def measure_load(*, workers: int, readings: Sequence[CpuReading], micro: int, step_ns: float, wait_ns: float,
                 entries: tuple[PstatsEntry, ...], gpu: bool, demand: Demand | None, others_busy: bool,
                 use: WorkerUse | None, waiting_max_pct: float) -> tuple[Load, float | None]:
    """The load of one batch (wall and CPU time, and the share of a core it wants) and the training
    process's own CPU per batch (without the loading; None without getrusage readings), with ``workers``
    DataLoader workers, ``micro`` batches per step, the step and its wait per batch (GD201's docs,
    "Evidence used"). ``others_busy``: other processes held the cores (GD205's case)."""
    proc_cpu = (statistics.median(r.cpu_ns / (r.steps * micro) for r in readings) if readings else None)
    evidence: list[str] = []
    profile = None
    if workers == 0:
        load = wait_ns
        cpu_frac: float | None = None  # the loading's CPU ÷ its wall time, by the cProfile
        wanted: float | None = None  # ... and with the time it waited for a core
        profile = loader_profile(entries)
        if profile is not None and profile.fetch_s > 0:
            # time in the fetch outside waiting calls: computing, or runnable and waiting for a core
            cpu_frac = wanted = profile.cpu_frac
            waits = ", ".join(entry_name(e) for e in profile.waits) or "none"
            evidence.append(
                f"cProfile: {_pct(100.0 * profile.waiting_s / profile.fetch_s)} of the {profile.fetch_s:.3g} s in the "
                f"DataLoader's fetch is spent in calls that wait ({waits})"
            )
        bounds = [r for r in readings if r.wait_ns > 0]
        if bounds:
            # the training process loads its own batches: their CPU is inside its getrusage figures; on a
            # run without a GPU the model's calls keep at least one core busy, so they are not the loading's
            runq = min(1.0, demand.main_wait) if demand is not None else None
            # on a machine other processes keep busy, the waiting for a core is theirs (GD205), not the
            # loading's demand: its CPU alone says what it wants (a waiting load stays one whatever the load)
            on_core = 1.0 - (runq or 0.0)  # the share of its time a thread that wants a core gets one

            def loading_cpu(r: CpuReading) -> float:
                model = r.model_ns * on_core if r.model_ns is not None and not gpu else 0.0
                return max(0.0, r.cpu_ns - model)

            bound = statistics.median(loading_cpu(r) / r.wait_ns for r in bounds)
            bound_cpu = statistics.median(loading_cpu(r) / (r.steps * micro) for r in bounds)
            with_runq = (f", {_pct(100.0 * runq)} more waiting for a core (schedstat)" if runq and not others_busy
                         else ", its waiting for a core left out: other processes held the cores" if runq else "")
            evidence.append(
                f"getrusage: the training process used {_ns(proc_cpu)} of CPU per batch against a {_ns(load)} "
                f"wait (median of {len(bounds)} readings): the loading's CPU is at most "
                f"{_pct(100.0 * min(1.0, bound))} of it{with_runq}"
            )
            cpu_per_batch = min(load * cpu_frac, bound_cpu) if cpu_frac is not None else min(load, bound_cpu)
            # a loading held off its core by other threads wants the core for that time too
            want_bound = bound + (0.0 if others_busy else runq or 0.0)
            wanted = want_bound if wanted is None else min(wanted, want_bound)
        else:
            cpu_per_batch = load * cpu_frac if cpu_frac is not None else None
        cpu = cpu_per_batch
        wanted = min(1.0, wanted) if wanted is not None else None
        main_cpu = max(0.0, proc_cpu - cpu) if proc_cpu is not None and cpu is not None else proc_cpu
    else:
        # n workers that cannot keep up each take n steps per batch
        load = workers * step_ns
        cpu = wanted = None
        if use is not None and use.workers:
            cpu = use.cpu_cores * step_ns  # the cores they used × the time per batch: CPU per batch
            wanted = min(1.0, (use.wanted_cores if use.wanted_cores is not None else use.cpu_cores) / workers)
            runq_text = (f", {use.wanted_cores:.2f} with their run-queue wait" if use.wanted_cores is not None else "")
            evidence.append(
                f"psutil: the {workers} worker(s) used {use.cpu_cores:.2f} cores together{runq_text} "
                f"(median of {use.ticks} samples), each busy {_pct(100.0 * wanted)} of its time"
            )
        main_cpu = proc_cpu
    kind = classify(wanted, waiting_max_pct)
    if kind == UNMEASURED:
        evidence.append("the loading's CPU time was not measured (no cProfile of the fetch, no getrusage readings, "
                        "no worker samples): sized as if it computed")
    return Load(load, cpu, wanted, kind, tuple(evidence), profile), main_cpu


# --------------------------------------------------------------------------- the run's loader figures


@dataclass(frozen=True, slots=True)
class LoaderFigures:
    """The DataLoader's load over the account's steps, per batch, and the measurements behind it."""

    load: Load | None  # loading one batch and its kind (None: no step time: no per-step records)
    main_cpu_ns: float | None  # the training process's own CPU per batch, without the loading (None: no getrusage)
    readings: tuple[CpuReading, ...]  # the getrusage readings of the account's steps
    workers: WorkerUse | None  # the workers' and the training process's samples over the steps
    demand: Demand | None  # the threads that wanted a core over the steps (None: no run-queue figures)
    busy: str  # GD205's case in words ("" when the machine was not busy with other work)
    free_cores: float | None  # the cores other processes left (None: unknown)
    settled_wait_ns: float | None  # the mean wait per batch over the later half of the steady steps (None: < 5)


def _settled_wait_ns(job: RankSteps, micro: int) -> float | None:
    """The mean wait per batch over the later half of the run's steady steps (by index), where that half has
    at least 5 steps; None otherwise. Its unprofiled steps where it has 5: an instrument slows the training
    process's own receipt of a batch, not only its step (in a session, 2 workers that kept up waited 2.5 ms a
    step, 10-15 ms under cProfile, and 91 ms on one step while the trace was compressed beside); else all of
    them (a later half all under instruments: their waits are still the workers' pace)."""
    steady = sorted(job.steady, key=lambda s: s.index)
    late = steady[len(steady) // 2:]
    if len(late) < 5:
        return None
    unprofiled = {(s.rank, s.index) for s in job.unprofiled}  # the run's figures' population
    bare = [s for s in late if (s.rank, s.index) in unprofiled]
    late = bare if len(bare) >= 5 else late
    return sum(min(s.data_wait_ns, s.wall_ns) for s in late) / (len(late) * max(1, micro))


def loader_figures(run: RunData, job: RankSteps, machine: HostLoad | None, cores: int | None,
                   limits: LoaderLimits) -> LoaderFigures:
    """The loader's figures of ``run``: its job's account steps (``job``), the machine's load over the steps
    and the cores (``HostFigures``), judged by ``limits``."""
    steps = run.steps
    demand = runnable_demand(run.samples, steps)
    use = worker_use(run.samples, steps)
    busy, free = machine_busy(machine, cores, limits) if steps and run.samples is not None else ("", None)
    micro = job.micro_batches or 1  # gradient accumulation: batches per optimizer step
    readings = cpu_readings(job.account)
    load_of: Load | None = None
    main_cpu: float | None = None
    if job.step.step_ns is not None:
        dl = main_dataloader(run.settings)
        load_of, main_cpu = measure_load(
            workers=dl.num_workers if dl is not None else 0, readings=readings, micro=micro,
            step_ns=job.step.step_ns / micro, wait_ns=(job.step.data_wait_ns or 0) / micro, entries=run.pstats,
            gpu=uses_gpu(run), demand=demand, others_busy=bool(busy), use=use,
            waiting_max_pct=limits.dataloader_waiting_cpu_max_pct)
    return LoaderFigures(load_of, main_cpu, readings, use, demand, busy, free, _settled_wait_ns(job, micro))
