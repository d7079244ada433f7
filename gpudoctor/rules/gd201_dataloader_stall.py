# Why this file is long: a rule is one room (DESIGN.md, "Rules"): its documentation, runtime check,
# static check, checklist technique and examples live in this one module, so that changing the rule
# means opening one place.
"""GD201 dataloader-stall: the training loop waits for the next batch.

What it detects
---------------
The share of step time each step (one optimizer step) waits in
`DataLoader.__next__`, less each epoch's first step (GD202) and starting
workers' first batches. At stake: the ledger's `data_loading` part (on a GPU run
the GPU's idle time while the loop waited; none where the GPU limits the loop).

Why it matters
--------------
While the loop waits, neither CPU nor GPU works; `num_workers=0` loads serially.

How to fix
----------
Load batches in worker processes, as many as the *kind* of load calls for, kept
alive across epochs. Workers = ceil(load ÷ (warm compute + hand-over)) +
`dataloader_spare_workers_count`. A **waiting** load (its CPU at most
`dataloader_waiting_cpu_max_pct` of its wall time) is not capped at the cores; a
**computing** one at the free cores; where they cannot hide it, the finding names
the loading's hot functions. At most what memory holds (at that bound: a deeper
`prefetch_factor`). Without a GPU, the training keeps the cores computing workers
leave (`torch.set_num_threads`). In full: docs/account.md.

Before:

```python
loader = DataLoader(ds, batch_size=64, shuffle=True)
```

After:

```python
loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=4,
                    persistent_workers=True, prefetch_factor=4, pin_memory=True)
```

Expected gain
-------------
Per batch, over the unprofiled steady steps (what `--verify` measures):

    step_after = max(compute + h, (load + h) ÷ w, (load_cpu + h) ÷ usable_cores,
                     (training_cpu + load_cpu + 2 h) ÷ cores)
    expected   = (step_now − step_after) ÷ at_stake, clipped to [0, 1]

with h the hand-over (both sides pay it), compute the warm one (× threads lost);
at stake the wait (no GPU: plus the mean compute beyond the least: the bound).

Evidence used
-------------
Per-step records or the trace; the DataLoader's settings and `file:line`; cores
and memory; the loading's CPU against its wall time (cProfile, getrusage, psutil).
Workers short of CPU are GD204's; on a busy machine it stands beside GD205.

Thresholds
----------
- `dataloader_wait_share_pct` (5): fires above this share of step time.
- `dataloader_reserved_cores` (1), `dataloader_spare_workers_count` (1).
- `dataloader_handover_ms` (1): receiving one batch; a mean wait under it is no stall.
- `dataloader_win_noise_se_count` (2): standard errors the modelled win must exceed.
- `dataloader_waiting_cpu_max_pct` (50): at most this CPU share, a load waits.
- `dataloader_max_workers_count` (16), `dataloader_worker_memory_share_pct` (50):
  the most workers, and the share of the machine's memory they may hold.
- `warm_compute_quantile_pct` (10), `cold_compute_ratio` (2); `error_share_pct`,
  `warning_share_pct`: the warm compute's quantile, cold/warm shown; severity.

Known limits
------------
A batch is assumed as slow in a worker as in the training process, and cores
and storage to scale with workers. `check --fix` leaves the fix to the author
where a loop changes the dataset or a spawned worker could not unpickle it.

References
----------
- PyTorch data loading (workers):
  https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading
- PyTorch performance tuning guide: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
- torch-tb-profiler (5% of step time): https://github.com/pytorch/kineto/tree/main/tb_plugin
- cProfile: https://docs.python.org/3/library/profile.html
- getrusage(2): https://man7.org/linux/man-pages/man2/getrusage.2.html
"""

# Why this file is long: it is one rule's room (DESIGN.md, "Rules"): the runtime check, which
# measures the load of a batch and sizes num_workers from it (the largest model of any rule), then
# `gpudoctor check`'s static check, its checklist judges and its examples. Split it into a package
# (gd201_dataloader_stall/: runtime.py, static.py) when a part grows again.

from __future__ import annotations

import ast
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from gpudoctor.analysis.load import StepCompute, free_cores, step_compute
from gpudoctor.config import Thresholds
from gpudoctor.model.findings import (
    ChecklistStatus,
    Confidence,
    Evidence,
    Finding,
    Fix,
    Metric,
    SettingRef,
    Severity,
)
from gpudoctor.model.metrics import Component, Ledger, LedgerBasis, TraceMetrics
from gpudoctor.model.run import DataLoaderSetting, Injection, StepRecord
from gpudoctor.model.steady import data_wait_share_pct, median_int
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.cpu_demand import runnable_demand
from gpudoctor.rules.dataloader import (
    dataloader_fix,
    dataloader_injections,
    dataloader_of,
    dataloader_settings,
    dataset_changed,
    no_dataloader_reason,
)
from gpudoctor.rules.device import device_limited
from gpudoctor.rules.edits import dataloader_args, left_to_author, manual_note
from gpudoctor.rules.formatting import fmt_bytes, fmt_ns, fmt_pct, location_of
from gpudoctor.rules.load_model import (
    HOST_PARTS,
    CpuReading,
    LoaderProfile,
    cpu_readings,
    loader_profile,
    loader_step_ns,
    worker_use,
)
from gpudoctor.rules.profiles import entry_name
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.static_api import (
    Fact,
    Function,
    LoaderFact,
    Resolved,
    Scan,
    StaticCheck,
    StaticContext,
    Watch,
    examples,
)
from gpudoctor.rules.static_api.names import HF_TRAINING_ARGS
from gpudoctor.rules.static_api.text import (
    NO_LOADER,
    arg_fix,
    at,
    first_of,
    how,
    origin_note,
    shown,
    with_kwargs,
)

WAITING = "waiting"  # wall time ≫ CPU time: storage, network, a sleep
COMPUTING = "computing"  # the loading keeps a core busy
UNMEASURED = "unmeasured"  # no CPU figure of the loading: sized as if it computed


@dataclass(frozen=True, slots=True)
class Load:
    """Loading one batch, measured: its wall time in one worker and its CPU time."""

    load_ns: float  # wall time of one batch in one worker (with num_workers=0: the wait itself)
    cpu_ns: float | None  # CPU time of one batch (None: not measured)
    wanted_frac: float | None  # cores the loading wants while it runs, 0..1 (CPU ÷ wall; workers: + run-queue wait)
    kind: str  # WAITING, COMPUTING or UNMEASURED
    evidence: tuple[str, ...] = ()  # how each figure was measured, in words
    profile: LoaderProfile | None = None  # the cProfile of the fetch (num_workers=0)


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """The workers GD201 recommends and what its model expects of them (per batch)."""

    workers: int  # num_workers recommended
    needed: int  # ceil(load ÷ (compute + hand-over)) + spare: the count that hides the load
    cap: int | None  # the bound that stopped it (None: none did)
    cap_reason: str  # that bound in words
    step_now_ns: float  # mean step per batch now
    wait_ns: float  # mean wait per batch now
    step_after_ns: float  # the model's step per batch with ``workers``
    expected_fraction: float  # (step_now - step_after) ÷ wait, in [0, 1]
    hides: bool  # the workers hide the load: the step after is compute + hand-over
    model: str  # the model with its factors filled in
    threads_after: int | None = None  # torch.set_num_threads for the training process (None: leave it)


def classify(wanted_frac: float | None, waiting_max_pct: float) -> str:
    """WAITING when the loading wants at most ``waiting_max_pct`` % of a core while it runs."""
    if wanted_frac is None:
        return UNMEASURED
    return WAITING if 100.0 * wanted_frac <= waiting_max_pct else COMPUTING


def measure_load(ctx: RuleContext, dl: DataLoaderSetting | None, steps: tuple[StepRecord, ...], micro: int,
                 step_ns: float, wait_ns: float) -> tuple[Load, float | None]:
    """The load of one batch (wall and CPU time, and the share of a core it wants) and the training
    process's own CPU per batch (without the loading; None without getrusage readings). See the
    rule's docs, "Evidence used"."""
    t = ctx.thresholds
    workers = dl.num_workers if dl is not None else 0
    readings = cpu_readings(steps)
    proc_cpu = (statistics.median(r.cpu_ns / (r.steps * micro) for r in readings) if readings else None)
    evidence: list[str] = []
    profile = None
    if workers == 0:
        load = wait_ns
        cpu_frac: float | None = None  # the loading's CPU ÷ its wall time, by the cProfile
        wanted: float | None = None  # ... and with the time it waited for a core
        profile = loader_profile(ctx.run.pstats)
        if profile is not None and profile.fetch_s > 0:
            # time in the fetch outside waiting calls: computing, or runnable and waiting for a core
            cpu_frac = wanted = profile.cpu_frac
            waits = ", ".join(entry_name(e) for e in profile.waits) or "none"
            evidence.append(
                f"cProfile: {fmt_pct(100.0 * profile.waiting_s / profile.fetch_s)} of the {profile.fetch_s:.3g} s in the "
                f"DataLoader's fetch is spent in calls that wait ({waits})"
            )
        bounds = [r for r in readings if r.wait_ns > 0]
        if bounds:
            # the training process loads its own batches: their CPU is inside its getrusage figures; on a
            # run without a GPU the model's calls keep at least one core busy, so they are not the loading's
            gpu = ctx.has_gpu()
            demand = runnable_demand(ctx)
            runq = min(1.0, demand.main_wait) if demand is not None else None
            # on a machine other processes keep busy, the waiting for a core is theirs (GD205), not the
            # loading's demand: its CPU alone says what it wants (a waiting load stays one whatever the load)
            others = bool(_machine_busy(ctx)[0])
            on_core = 1.0 - (runq or 0.0)  # the share of its time a thread that wants a core gets one

            def loading_cpu(r: CpuReading) -> float:
                model = r.model_ns * on_core if r.model_ns is not None and not gpu else 0.0
                return max(0.0, r.cpu_ns - model)

            bound = statistics.median(loading_cpu(r) / r.wait_ns for r in bounds)
            bound_cpu = statistics.median(loading_cpu(r) / (r.steps * micro) for r in bounds)
            with_runq = (f", {fmt_pct(100.0 * runq)} more waiting for a core (schedstat)" if runq and not others
                         else ", its waiting for a core left out: other processes held the cores" if runq else "")
            evidence.append(
                f"getrusage: the training process used {fmt_ns(proc_cpu)} of CPU per batch against a {fmt_ns(load)} "
                f"wait (median of {len(bounds)} readings): the loading's CPU is at most "
                f"{fmt_pct(100.0 * min(1.0, bound))} of it{with_runq}"
            )
            cpu_per_batch = min(load * cpu_frac, bound_cpu) if cpu_frac is not None else min(load, bound_cpu)
            # a loading held off its core by other threads wants the core for that time too
            want_bound = bound + (0.0 if others else runq or 0.0)
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
        use = worker_use(ctx)
        if use is not None and use.workers:
            cpu = use.cpu_cores * step_ns  # the cores they used × the time per batch: CPU per batch
            wanted = min(1.0, (use.wanted_cores if use.wanted_cores is not None else use.cpu_cores) / workers)
            runq = (f", {use.wanted_cores:.2f} with their run-queue wait" if use.wanted_cores is not None else "")
            evidence.append(
                f"psutil: the {workers} worker(s) used {use.cpu_cores:.2f} cores together{runq} "
                f"(median of {use.ticks} samples), each busy {fmt_pct(100.0 * wanted)} of its time"
            )
        main_cpu = proc_cpu
    kind = classify(wanted, t.dataloader_waiting_cpu_max_pct)
    if kind == UNMEASURED:
        evidence.append("the loading's CPU time was not measured (no cProfile of the fetch, no getrusage readings, "
                        "no worker samples): sized as if it computed")
    return Load(load, cpu, wanted, kind, tuple(evidence), profile), main_cpu


def memory_cap(ctx: RuleContext, dl: DataLoaderSetting | None) -> tuple[int, str] | None:
    """How many workers the machine's memory holds (``dataloader_worker_memory_share_pct`` of it, less the
    training process), each at the median worker's RSS (the training process's when no worker ran: a
    forked worker maps its pages, and holds prefetch_factor batches besides); None without the figures."""
    t = ctx.thresholds
    samples = ctx.run.samples
    total = samples.system_memory_bytes if samples is not None else None
    use = worker_use(ctx)
    if not total or use is None or use.main_rss_bytes is None:
        return None
    from_workers = bool(dl is not None and dl.num_workers and use.worker_rss_bytes)
    per = use.worker_rss_bytes if from_workers else use.main_rss_bytes
    if not per:
        return None
    budget = total * t.dataloader_worker_memory_share_pct / 100.0 - use.main_rss_bytes
    n = max(1, int(budget // per))
    whose = "a worker's" if from_workers else "the training process's"
    return n, (f"memory: {t.dataloader_worker_memory_share_pct:g}% of the machine's {fmt_bytes(total)} less the "
               f"training process holds {n} workers at {whose} {fmt_bytes(per)} RSS")


# the cores the training's threads and the computing workers may want beyond the machine's before the threads give
# way: a worker busy a small share of the step takes a thread's core now and then, not at every op
_SPARE_CORE = 0.5


def plan_workers(load: Load, *, compute_ns: float, wait_ns: float, workers_now: int, cores: int | None,
                 main_cpu_ns: float | None, mem_cap: tuple[int, str] | None, t: Thresholds,
                 basis: str = "", noise_ns: float = 0.0, now_compute_ns: float | None = None,
                 stake_ns: float | None = None, free_cores: float | None = None,
                 threads_now: int | None = None, main_got: float | None = None) -> WorkerPlan:
    """The workers to recommend for ``load`` and the step the model expects with them (per batch).

    Enough workers to hide the load: ceil(load ÷ (compute + hand-over)) + spare. A waiting load is not
    capped at the cores: the usable cores run usable ÷ (CPU share of a worker) of them; a computing (or
    unmeasured) load at most the usable cores. Always at most ``dataloader_max_workers_count`` and what
    memory holds. The model is ``loader_step_ns`` with the workers that can run at once; ``basis`` names
    the steps its figures are means of, beside "now" (the summary's step time is another statistic);
    ``noise_ns`` what the model's step per batch is known to (two standard errors of the mean of the step
    less its wait): a smaller win is none the model can tell. ``compute_ns`` is the loop's warm compute (what
    it takes when its data is ready), ``now_compute_ns`` the compute as the run ran (default: the same):
    the step now is that and the wait; ``stake_ns`` what the fix can win at most per batch (default: the
    wait), of which the expected fraction is. ``free_cores``: the cores other processes left (None: all of
    them); a computing load's workers and the model's CPU terms get no more than those. ``threads_now``: the
    training process's intra-op threads on a run without a GPU (None elsewhere), ``main_got`` the cores its
    compute keeps busy: a computing load's workers and those threads share the cores, so where they would not
    fit, the threads give way (``_fit_threads``)."""
    handover = t.dataloader_handover_ms * 1e6
    if cores and free_cores is not None and load.kind != WAITING:
        cores = max(1, min(cores, math.floor(free_cores + 0.5)))  # a waiting load needs no cores: all of them
    usable = max(1, cores - t.dataloader_reserved_cores) if cores else None
    needed = max(1, math.ceil(load.load_ns / (compute_ns + handover))) + t.dataloader_spare_workers_count
    needed = max(needed, workers_now + 1)
    caps: list[tuple[int, str]] = [(t.dataloader_max_workers_count,
                                    f"the most gpudoctor recommends (dataloader_max_workers_count={t.dataloader_max_workers_count})")]
    if usable is not None:
        if load.kind != WAITING:
            what = "a computing load" if load.kind == COMPUTING else "a load whose CPU was not measured"
            caps.append((usable, f"{usable} usable core(s) ({cores} less {t.dataloader_reserved_cores} for the "
                                 f"training process): {what} cannot use more workers than cores"))
        elif load.wanted_frac:
            n = max(usable, math.floor(usable / load.wanted_frac))
            caps.append((n, f"{usable} usable core(s) run {n} workers that each want "
                            f"{fmt_pct(100.0 * load.wanted_frac)} of a core"))
    if mem_cap is not None:
        caps.append(mem_cap)
    cap, why = min(caps, key=lambda c: c[0])
    n = max(1, min(needed, cap))
    limited = n < needed
    cpu = load.cpu_ns if load.kind != UNMEASURED else load.load_ns
    running = n if load.kind == WAITING or usable is None else min(n, usable)
    # all the CPU, the workers' too (even a waiting load's), runs on the cores others leave
    cpu_cores = max(1.0, min(cores, free_cores)) if cores and free_cores is not None else cores

    def step_with(k: int, compute: float, threads: int | None = None) -> float:
        # without a GPU the training's CPU per batch is at most its compute's wall time on each of its threads: what
        # it used beyond that now, its OpenMP threads spun while the loop waited (fewer threads, less of it)
        main = min(main_cpu_ns, compute * threads) if main_cpu_ns is not None and threads else main_cpu_ns
        return loader_step_ns(compute_ns=compute, load_ns=load.load_ns, load_cpu_ns=cpu, workers=k,
                              usable_cores=usable, main_cpu_ns=main, handover_ns=handover, cores=cpu_cores)

    threads_after = None
    compute_after = compute_ns
    if threads_now and cores and load.kind != WAITING:
        running, threads_after, compute_after = _fit_threads(step_with, running, threads_now, main_got, compute_ns,
                                                             cores, cpu if cpu is not None else load.load_ns, handover)
        n = running if threads_after is not None else n
        limited = n < needed
    after = step_with(running, compute_after, threads_after or threads_now)
    now = (compute_ns if now_compute_ns is None else now_compute_ns) + wait_ns
    stake = wait_ns if stake_ns is None else stake_ns
    # a win per batch under the hand-over is within what the model can tell (its smallest term; a wait under it
    # is no stall the rule reports either), and so is one under the noise of the step's mean: none is promised
    resolution = max(handover, noise_ns)
    fraction = max(0.0, min(1.0, (now - after) / stake)) if stake > 0 and now - after >= resolution else 0.0
    slower = (f" × {threads_now} threads ÷ {threads_after} = {fmt_ns(compute_after)}"
              if threads_after is not None and compute_after > compute_ns else "")
    terms = [f"compute {fmt_ns(compute_ns)}{slower} + hand-over {fmt_ns(handover)}",
             f"(load {fmt_ns(load.load_ns)} + hand-over) ÷ {running} worker(s)"]
    if cpu is not None and usable:
        terms.append(f"(load CPU {fmt_ns(cpu)} + hand-over) ÷ {usable} usable core(s)")
        if main_cpu_ns is not None and cores:
            threads = threads_after or threads_now
            main = min(main_cpu_ns, compute_after * threads) if threads else main_cpu_ns
            capped = f" ≤ {threads} thread(s) × compute = {fmt_ns(main)}" if main < main_cpu_ns else ""
            terms.append(f"(training CPU {fmt_ns(main_cpu_ns)}{capped} + load CPU + 2 hand-overs) ÷ {cpu_cores:.3g}"
                         f"{' free' if cpu_cores < cores else ''} cores")
    model = (f"step per batch = max({', '.join(terms)}) = {fmt_ns(after)}, "
             f"against {fmt_ns(now)} now{f' ({basis})' if basis else ''}: {fmt_pct(100.0 * fraction)} of the "
             + (f"{fmt_ns(wait_ns)} wait won" if stake == wait_ns else
                f"{fmt_ns(stake)} at stake won (the {fmt_ns(wait_ns)} wait and {fmt_ns(stake - wait_ns)} of compute "
                "beyond the least a step took)"))
    if wait_ns > 0 and 0 < now - after < resolution:
        model += (f" (a win of {fmt_ns(now - after)} per batch is under "
                  + (f"the hand-over, {fmt_ns(handover)})" if resolution == handover else
                     f"{t.dataloader_win_noise_se_count:g} standard errors of the mean step less its wait, "
                     f"{fmt_ns(noise_ns)}: within the noise)"))
    if threads_after is not None:
        model += (f"; torch.set_num_threads({threads_after}) in the training process: {running} worker(s) and its "
                  f"{threads_now} intra-op threads would want more than the {cpu_cores:.3g} cores")
    return WorkerPlan(n, needed, cap if limited else None, why if limited else "", now, wait_ns, after, fraction,
                      after <= (compute_after + handover) * 1.01, model, threads_after)


def _fit_threads(step_with: Callable[[int, float, int | None], float], most: int, threads_now: int, main_got: float | None,
                 compute_ns: float, cores: float, load_cpu_ns: float, handover_ns: float) -> tuple[int, int | None, float]:
    """(workers, intra-op threads to set or None, compute per batch with them) for the ``most`` computing
    workers planned beside the training process's threads. The workers keep busy the cores their CPU per batch
    (the load's and their side of the hand-over) takes of the step; where those and the threads would want more
    than ``cores`` (half a core spare), the threads give way to the cores the workers leave: an OpenMP op of N
    threads with one of them off its core waits for it at its barrier (a loader computing 3.6 ms per batch, one
    worker beside torch's 2 threads on 2 cores, made the step 1.27× slower, and 1.2× faster with one thread).
    The compute is taken to scale with the threads it loses, at most the cores it kept busy (``main_got``; all
    its threads without the figure). Fewer workers only where that makes the step at least 1% shorter."""
    busy = min(float(threads_now), cores, main_got if main_got else float(threads_now))
    best: tuple[float, int, int | None, float] | None = None
    for k in range(max(1, most), 0, -1):
        step = step_with(k, compute_ns, threads_now)
        wanted = min(float(k), (load_cpu_ns + handover_ns) / step)  # the cores the workers keep busy
        threads, compute = threads_now, compute_ns
        if threads_now + wanted > cores + _SPARE_CORE:
            threads = max(1, min(threads_now, math.floor(cores - wanted)))
            compute = compute_ns * max(1.0, busy / threads)
            step = step_with(k, compute, threads)
        if best is None or step < best[0] * 0.99:
            best = (step, k, None if threads == threads_now else threads, compute)
    assert best is not None
    return best[1], best[2], best[3]


def _changes(ctx: RuleContext, dl: DataLoaderSetting | None, n: int) -> dict[str, object]:
    """The DataLoader arguments the fix sets, for ``n`` suggested workers (``_allowed`` then takes out what
    the script does not allow)."""
    workers = dl.num_workers if dl is not None else None
    changes: dict[str, object] = {"num_workers": n, "persistent_workers": True}
    if workers and workers >= n:
        # already as many workers as the cores (or memory) allow: deepen the queue instead
        changes = {"prefetch_factor": (dl.prefetch_factor or 2) * 2, "persistent_workers": True}
    elif workers:
        changes["prefetch_factor"] = max(dl.prefetch_factor or 2, 2)
    if ctx.has_gpu() and dl is not None and not dl.pin_memory:
        changes["pin_memory"] = True
    return changes


def _fix(ctx: RuleContext, dl: DataLoaderSetting | None, instruction: str, changes: dict[str, object],
         notes: list[str]) -> Fix:
    """The fix of ``changes`` at the DataLoader, as the script allows (``RuleContext.workers_caveat``):
    without persistent_workers where they would be wrong (the evidence says why), and left to the author
    where workers themselves would not see a change the loop makes at every step."""
    caveat = ctx.workers_caveat(dl)
    if caveat is not None:
        notes.append(manual_note(caveat[0]) if caveat[1] else f"persistent_workers left out: {caveat[0]}")
    fix = dataloader_fix(instruction, dl, _allowed(ctx, dl, changes))
    return left_to_author(fix, caveat[0]) if caveat is not None and caveat[1] else fix


def _allowed(ctx: RuleContext, dl: DataLoaderSetting | None, changes: dict[str, object]) -> dict[str, object]:
    """``changes`` without persistent_workers where the script is against them (``RuleContext.workers_caveat``:
    its own choice, or a loop that changes the dataset in place): the fix's and ``--verify``'s."""
    if ctx.workers_caveat(dl) is None:
        return changes
    return {k: v for k, v in changes.items() if k != "persistent_workers"}


def _hot_text(load: Load) -> str:
    """The loading code's hot functions, from the cProfile of the fetch (num_workers=0)."""
    p = load.profile
    if p is None or not p.hot:
        if load.profile is None and load.kind == COMPUTING:
            return ("the workers' code is not under cProfile: profile once with num_workers=0 to see the loading "
                    "code's hot functions")
        return ""
    share = ", ".join(f"{entry_name(e)} {fmt_pct(100.0 * e.loader_tottime_s / p.fetch_s)}" for e in p.hot)
    own = ", ".join(f"{entry_name(e)} {fmt_pct(100.0 * e.loader_cumtime_s / p.fetch_s)}" for e in p.own)
    text = f"the loading's hot functions (cProfile, share of the fetch's time): {share}"
    return text + (f"; your code in it: {own}" if own else "")


def _from_steps(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    # the run's figures (analysis.figures): the account's steps, the unprofiled ones where there are enough, as
    # --verify's trial runs carry no instrument (docs/account.md, "The accounting window"), else every steady
    # step; the step time is their mean, the data wait's share and mean are theirs
    fig = ctx.figures.job
    steps = fig.account
    share = fig.step.data_wait_pct
    dl = ctx.main_dataloader()
    if share is None or fig.step.step_ns is None:
        return RuleResult.cannot_judge("no per-step records")
    wait_med = median_int(s.data_wait_ns for s in steps) or 0
    micro = ctx.micro_batches() or 1  # gradient accumulation: batches per optimizer step
    loc = location_of(dl.call_site) if dl is not None else None
    where = f" at {loc}" if loc else ""
    if share <= t.dataloader_wait_share_pct:
        if dl is None and ctx.settings is not None and not ctx.settings.dataloaders:
            return RuleResult.not_applicable("no DataLoader in this run")
        return RuleResult.fine(
            f"the loop waits {fmt_pct(share)} of step time for data over {len(steps)} steps "
            f"(threshold {t.dataloader_wait_share_pct:g}%)",
            applied=dl is not None and dl.num_workers > 0,
        )
    ledger = ctx.ledger()
    if ledger is not None and ledger.basis == LedgerBasis.GPU:
        # a GPU run: a wait for a batch costs the step only where the GPU idles for it (the ledger's
        # data_loading part); where the device limits the loop, the host's waits hide behind its work
        m = ctx.primary_trace()
        limited = device_limited(m) if m is not None else None
        gpu_pct = ledger.pct(Component.DATA_LOADING)
        if limited is not None or gpu_pct <= t.dataloader_wait_share_pct:
            scaled = ", scaled to the unprofiled step" if ledger.weight is not None and ledger.weight.scaled else ""
            idle = (f"the GPU sat idle waiting for a batch {fmt_pct(gpu_pct)} of the {ledger.window}{scaled} "
                    f"(threshold {t.dataloader_wait_share_pct:g}%)")
            if limited is not None:
                why = f"the GPU did not wait for the batches: {limited}; {idle}"
            else:
                recorded = ctx.recorded_steps(ctx.accounting_traces())
                rec_share = data_wait_share_pct(recorded) if recorded else None
                why = idle + (f", where the loop waited {fmt_pct(rec_share)} of the host's step (the {len(recorded)} "
                              "steps the window recorded); the share at stake is the GPU's idle time, which no trace "
                              "shows for the unprofiled steps" if rec_share is not None and fig.account_is_unprofiled
                              else "")
            return RuleResult.fine(
                f"the loop waits {fmt_pct(share)} of the host's step time for data ({_steps_text(ctx, steps)}), "
                f"but {why}",
                applied=dl is not None and dl.num_workers > 0,
            )
    cores = ctx.cpu_count()
    if dl is not None and dl.num_workers and cores:
        demand = runnable_demand(ctx)
        if demand is not None and demand.tree / cores > t.oversubscription_ratio:
            return RuleResult.not_applicable(
                f"the loop waits {fmt_pct(share)} of step time for data, but the workers are short of CPU, not of "
                f"numbers: {demand.tree:.1f} runnable threads on {cores} cores (GD204); more workers would make it worse"
            )
    busy, free = _machine_busy(ctx)
    workers = dl.num_workers if dl is not None else None
    # the mean, not the median: a loader that falls behind now and then waits long on a few steps
    batches = max(1, len(steps) * micro)
    per_batch_ns = sum(s.data_wait_ns for s in steps) // batches
    handover_ns = int(t.dataloader_handover_ms * 1_000_000)
    if per_batch_ns < handover_ns:
        # workers would not win it: the loop still pays the receipt of each batch from a worker
        who = f"{workers} worker(s) deliver" if workers else "the main process loads"
        return RuleResult.fine(
            f"the loop waits {fmt_pct(share)} of step time for data over {len(steps)} steps, but {who} a batch in "
            f"{fmt_ns(per_batch_ns)}, less than receiving one from a worker costs (threshold "
            f"{fmt_ns(handover_ns)}): more workers would not win it back",
            applied=bool(workers),
        )
    settled = _settled_wait_ns(ctx, micro)
    if workers and settled is not None and settled - handover_ns < handover_ns:
        # the figures' steps were the pipeline filling: its workers' first batches after start-up come slower
        # (tuned_baseline under --steps 40: its unprofiled steps are steps 1-9, waiting 1.3-7.8 ms, and every
        # step from 17 on 1.1-1.7 ms), which is GD202's start-up, not a stall more workers would win back: in
        # the run's later half what workers could win (the wait beyond a hand-over) is under the hand-over,
        # the model's resolution
        return RuleResult.fine(
            f"the loop waits {fmt_pct(share)} of step time for data over {len(steps)} steps, but the run's later "
            f"half waits {fmt_ns(settled)} per batch: beyond receiving a batch from a worker ({fmt_ns(handover_ns)}), "
            f"less than that again; the workers' pipeline was filling, not falling behind",
            applied=True,
        )
    # the model's figures: the run's, per batch (the step time and the wait are means over the account's steps:
    # the steps no instrument slowed where there are enough, as torch.profiler's and cProfile's windows slow the
    # loading and the step unevenly, and --verify's trial runs carry neither)
    model_steps = steps
    wait_ns = (fig.step.data_wait_ns or 0) / micro
    step_batch_ns = fig.step.step_ns / micro
    # the loop's compute once workers hide the wait: warm (a low quantile of the steps' time outside the
    # wait), not the mean over steps whose CPU went cold while they waited; the bound takes the least
    comp = step_compute(model_steps, micro, t.warm_compute_quantile_pct)
    mean_compute = max(step_batch_ns - wait_ns, 1.0)
    # on a machine other processes keep busy, the step's work is slow for want of the cores they hold, which
    # workers do not give back: the model keeps it as measured (a calibration run beside 1.7 busy cores of 2:
    # 0.88 ms warm, 76.6 ms mean, and the fixed trials took 64-92 ms per step)
    warm = comp is not None and not busy
    compute_ns = max(min(comp.warm_ns, mean_compute), 1.0) if warm else mean_compute
    load, main_cpu = measure_load(ctx, dl, steps, micro, step_batch_ns, wait_ns)
    main_got = main_cpu / mean_compute if main_cpu is not None else None  # the cores the compute keeps busy
    if main_cpu is not None:
        main_cpu *= compute_ns / mean_compute  # the training's own CPU per batch shrinks with its compute
    on_gpu = ledger is not None and ledger.basis == LedgerBasis.GPU
    # without a GPU the step's compute is the training process's intra-op threads: workers share their cores
    threads_now = ctx.settings.num_threads if ctx.settings is not None and not ctx.has_gpu() else None
    # what the fix can win at most, per batch: the wait, and on a run without a GPU the compute beyond the
    # least any step showed (a loop that stops waiting runs warm)
    cold_ns = max(0.0, mean_compute - comp.least_ns) if comp is not None and not on_gpu else 0.0
    mem = memory_cap(ctx, dl)
    basis = (f"means per batch over the {fig.account_label}" if micro == 1 else
             f"per batch: the step time over the {fig.account_label} ÷ {micro} micro-batches")
    # what the model's step is known to: the scatter of the part of the step that is not the wait (its
    # compute and the CPU terms are built from it; the wait's own scatter is the stall, not noise)
    # On a GPU run the host's step also holds its waits for the device, which the host does not choose: not
    # the model's noise (the CUDA events time the loop there), so the hand-over alone sets the resolution.
    computes = [(s.wall_ns - min(s.data_wait_ns, s.wall_ns)) / micro for s in model_steps]
    noise_ns = (t.dataloader_win_noise_se_count * statistics.stdev(computes) / math.sqrt(len(computes))
                if len(computes) > 1 and not on_gpu else 0.0)
    plan = plan_workers(load, compute_ns=compute_ns, wait_ns=wait_ns, workers_now=workers or 0, cores=cores,
                        main_cpu_ns=main_cpu, mem_cap=mem, t=t, basis=basis, noise_ns=noise_ns,
                        now_compute_ns=mean_compute, stake_ns=wait_ns + cold_ns, free_cores=free,
                        threads_now=threads_now, main_got=main_got)
    n = plan.workers
    if busy and load.kind != WAITING and workers and workers >= n:
        # a computing load whose workers already use the cores others leave: what it lacks is those cores
        return RuleResult.not_applicable(
            f"the loop waits {fmt_pct(share)} of step time for data, but {busy} (GD205): what the loading "
            "lacks is cores others hold, which more workers would not win back"
        )
    # the share is one of sums (the summary's "waiting for data"): its figures are the means (the run's step
    # time), so that the sentence checks out (a median wait of a median step said 30.64 ms of a 32.03 ms step
    # beside 87.4%)
    wait_mean = fig.step.data_wait_ns or 0
    step_mean = fig.step.step_ns
    # on a GPU run the share at stake is of the account's window, which need not be these steps: say which
    over = _steps_text(ctx, steps) if ledger is not None and ledger.basis == LedgerBasis.GPU else f"{len(steps)} steps"
    if micro > 1:
        per = (f"{fmt_ns(wait_mean)} of a {fmt_ns(step_mean)} optimizer step over its {micro} micro-batches, "
               f"{fmt_ns(wait_mean // micro)} per batch; means over {over}")
    else:
        per = f"{fmt_ns(wait_mean)} of a {fmt_ns(step_mean)} step, means over {over}"
    gpu_wait = _gpu_wait_text(ledger)
    kind_text = _kind_text(load)
    message = (
        f"the loop waits {fmt_pct(share)} of step time for the next batch ({per})"
        + gpu_wait
        + (f"; DataLoader{where} has num_workers={workers}" if dl is not None else "")
        + (f"; {kind_text}" if kind_text else "")
        + (f"; {busy} (GD205)" if busy else "")
    )
    changes = _allowed(ctx, dl, _changes(ctx, dl, n))
    more = not (workers and workers >= n)
    how = (f"{load.kind} load: {fmt_ns(load.load_ns)} per batch ÷ ({fmt_ns(compute_ns)} {'warm ' if warm else ''}compute + "
           f"{fmt_ns(handover_ns)} hand-over) → {plan.needed - t.dataloader_spare_workers_count}, "
           f"+{t.dataloader_spare_workers_count} spare")
    if plan.cap is not None:
        how += f"; capped at {plan.cap}: {plan.cap_reason}"
    elif load.kind == WAITING and cores is not None and n > max(1, cores - t.dataloader_reserved_cores):
        how += f"; more than the {cores} cores: each worker waits most of the time"
    elif cores is not None:
        how += f", within {cores} cores"
    extra = ""
    if not more:
        pf = changes["prefetch_factor"]
        extra = (f"; no more workers than {workers} pay here ({plan.cap_reason or 'they already hide what workers can'}): "
                 f"raise prefetch_factor to {pf} (a deeper queue absorbs slow batches) and make loading cheaper")
    args = ", ".join(f"{k}={v}" for k, v in changes.items())
    instruction = f"Set {args} on the DataLoader{where} ({how}){extra}."
    if plan.threads_after is not None and more:
        instruction += (f" Call torch.set_num_threads({plan.threads_after}) in the training process (or "
                        f"OMP_NUM_THREADS={plan.threads_after}): its {threads_now} intra-op threads beside {n} "
                        f"computing worker(s) would want more than the {cores} cores, and an op waits at its barrier "
                        "for a thread that lost its core.")
    notes = ["first step of each epoch, and each worker's first batch where workers start, left out "
             "(worker start-up is GD202)", *load.evidence]
    if comp is not None and comp.cold_ratio >= t.cold_compute_ratio:
        notes.append(_cold_text(comp, warm))
    if busy and load.kind != WAITING:
        notes.append(f"sized to the cores other processes left free ({free:.2f} of {cores}): {busy}"
                     if free is not None else busy)
    if not plan.hides and load.kind != WAITING:
        hot = _hot_text(load)
        cannot = ("the usable cores cannot hide this load" if load.kind == COMPUTING
                  else "if the loading computes, the usable cores cannot hide it")
        cheaper = (f"{cannot}: make each batch cheaper (cache decoded data, move augmentation to the GPU)"
                   + (f"; {hot}" if hot else ""))
        notes.append(cheaper)
        instruction += " " + cheaper[0].upper() + cheaper[1:] + "."
    elif not plan.hides and plan.cap is not None:
        notes.append(f"{plan.needed} workers would hide the load; {plan.cap_reason}")
    metrics = [
        Metric("data_wait_share_pct", round(share, 2), "%", f"{len(steps)} steps"),
        Metric("data_wait_mean_ns", wait_mean, "ns", f"{len(steps)} steps"),
        Metric("step_mean_ns", step_mean, "ns", f"{fig.account_label}; the step time"),
        Metric("data_wait_median_ns", wait_med, "ns"),
        Metric("step_median_ns", fig.step.median_ns, "ns", f"{fig.account_label}; the spread, not the step"),
        Metric("per_batch_load_ns", int(load.load_ns), "ns"),
        Metric("compute_per_step_ns", int(compute_ns), "ns",
               f"per batch, warm: p{t.warm_compute_quantile_pct:g} of the steps' time outside the data wait" if warm
               else "per batch: the step less its data wait (mean; a busy machine)"),
        Metric("compute_mean_ns", int(mean_compute), "ns", "per batch: the step less its data wait (mean)"),
        Metric("load_kind", load.kind),
        Metric("suggested_num_workers", n, "count"),
        *([Metric("suggested_num_threads", plan.threads_after, "count",
                  f"torch.set_num_threads in the training process (now {threads_now})")]
          if plan.threads_after is not None and more else []),
        Metric("expected_step_ns", int(plan.step_after_ns), "ns", "per batch, by the model"),
    ]
    if comp is not None:
        metrics.append(Metric("compute_warm_ns", int(comp.warm_ns), "ns",
                              f"per batch: p{comp.quantile_pct:g} of the steps' time outside the data wait"))
        metrics.append(Metric("compute_median_ns", int(comp.cold_ns), "ns", "per batch, outside the data wait"))
        metrics.append(Metric("compute_least_ns", int(comp.least_ns), "ns", "per batch: the bound's floor"))
    if free is not None:
        metrics.append(Metric("free_cores", round(free, 2), "count", "the cores other processes left"))
    if load.cpu_ns is not None:
        metrics.append(Metric("load_cpu_ns", int(load.cpu_ns), "ns", "CPU time of one batch's loading"))
    if load.wanted_frac is not None:
        metrics.append(Metric("load_cpu_pct", round(100.0 * load.wanted_frac, 1), "%",
                              "the loading's wall time: the share in which it wants a core (on one, or waiting for one)"))
    if cores is not None:
        metrics.append(Metric("cpu_count", cores, "count"))
    if mem is not None:
        metrics.append(Metric("workers_memory_cap_count", mem[0], "count", mem[1]))
    if micro > 1:
        metrics.append(Metric("micro_batches_per_step", micro, "count", "backward() calls per optimizer step"))
        metrics.append(Metric("data_wait_per_batch_ns", wait_mean // micro, "ns", "mean"))
    fix = _fix(ctx, dl, instruction, changes, notes)
    finding = ctx.finding(
        message,
        fix,
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        settings=dataloader_settings(dl) if dl is not None else (),
        notes=notes,
        location=loc,
        gain_note=(
            "GPU idle time while the loop waited for data; workers hide it behind the step"
            if ledger is not None and ledger.basis == LedgerBasis.GPU
            else "time the loop waits for data; workers hide it behind the step"
        ),
        claims=_claims(ledger, cold_ns / mean_compute),
        ledger=ledger,
        # more workers: the model's; at the cap, a deeper queue and cheaper loading, which no model sizes
        expected=plan.expected_fraction if more else None,
        expected_note=f"{n} worker{'' if n == 1 else 's'} ({load.kind} load): {plan.model}" if more else "",
    )
    return RuleResult.fired(finding)


def _settled_wait_ns(ctx: RuleContext, micro: int) -> float | None:
    """The mean wait per batch over the later half of the run's steady steps (by index), where that half has
    at least 5 steps; None otherwise. Its unprofiled steps where it has 5 (``unprofiled_steps``): an instrument
    slows the training process's own receipt of a batch, not only its step (in a session, 2 workers that kept
    up waited 2.5 ms a step, 10-15 ms under cProfile, and 91 ms on one step while the trace was compressed
    beside); else all of them (a later half all under instruments: their waits are still the workers' pace)."""
    steady = sorted(ctx.steady_steps(), key=lambda s: s.index)
    late = steady[len(steady) // 2:]
    if len(late) < 5:
        return None
    unprofiled = {(s.rank, s.index) for s in ctx.figures.job.unprofiled}  # the run's figures' population
    bare = [s for s in late if (s.rank, s.index) in unprofiled]
    late = bare if len(bare) >= 5 else late
    return sum(min(s.data_wait_ns, s.wall_ns) for s in late) / (len(late) * max(1, micro))


def _machine_busy(ctx: RuleContext) -> tuple[str, float | None]:
    """GD205's case, in words ("" when not: the training process waited for cores while other processes held
    them), and the cores other processes left free (None unknown), over the steps, from the host samples."""
    t = ctx.thresholds
    steps = ctx.steps()
    if not steps or ctx.run.samples is None:
        return "", None
    load = ctx.figures.host.load  # over the steps (the run's figures)
    free = free_cores(load, ctx.cpu_count())
    if load is None or load.runq_wait_pct is None or load.others_cpu_pct is None:
        return "", free
    if load.runq_wait_pct < t.cpu_contention_wait_pct or load.others_cpu_pct < t.cpu_contention_others_pct:
        return "", free
    return (f"the machine was busy: the training process waited for a core {load.runq_wait_pct:.1f}% of the time "
            f"while other processes used {load.others_cpu_pct / 100:.2f} cores"), free


def _claims(ledger: Ledger | None, cold_share: float) -> list[tuple[Component, int | None]]:
    """The ledger parts the finding claims: the data wait, and on a run without a GPU the share ``cold_share``
    of the training process's own time that the compute ran beyond the least any step showed (it runs warm
    once the loop stops waiting: issue 42, a bound of 78.3% that --verify beat with 86.2%)."""
    out: list[tuple[Component, int | None]] = [(Component.DATA_LOADING, None)]
    if ledger is None or ledger.basis == LedgerBasis.GPU or cold_share <= 0:
        return out
    return out + [(c, int(ledger.ns(c) * min(1.0, cold_share))) for c in HOST_PARTS if ledger.ns(c) > 0]


def _cold_text(comp: StepCompute, warm: bool) -> str:
    """The step's own work warm and cold, in words; ``warm``: the model takes the warm figure (else the mean:
    a busy machine)."""
    return (f"the step's own work takes {fmt_ns(comp.warm_ns)} when its data is ready (p{comp.quantile_pct:g} of "
            f"{comp.steps} steps' time outside the wait), {fmt_ns(comp.cold_ns)} after a wait (median): "
            + ("the CPU goes cold while the loop waits; the model takes the warm figure" if warm else
               "on this busy machine it also waits for cores other processes hold, which workers do not give "
               "back; the model takes the mean")
            + f", the bound the least ({fmt_ns(comp.least_ns)})")


def _kind_text(load: Load) -> str:
    """The load's kind in a message."""
    if load.wanted_frac is None:
        return ""
    cpu = fmt_pct(100.0 * load.wanted_frac)
    if load.kind == WAITING:
        return f"the loading waits rather than computes (it keeps a core busy {cpu} of its time)"
    return f"the loading computes (it keeps a core busy {cpu} of its time)"


def _steps_text(ctx: RuleContext, steps: tuple[StepRecord, ...]) -> str:
    """Which steps the figures of the loop's waits are of: "8 unprofiled steps" where the account's steps
    leave the instrumented ones out, else "30 steps"."""
    bare = ctx.figures.job.account_is_unprofiled  # ``steps``: the account's window, which leaves them out
    return f"{len(steps)} {'unprofiled ' if bare else ''}step{'' if len(steps) == 1 else 's'}"


def _gpu_wait_text(ledger: Ledger | None) -> str:
    """On a GPU run: the share at stake, and which steps it is of (the account's window, which need not be
    the steps the waits are of)."""
    if ledger is None or ledger.basis != LedgerBasis.GPU:
        return ""
    scaled = ", scaled to the unprofiled step" if ledger.weight is not None and ledger.weight.scaled else ""
    return (
        f"; the GPU sat idle waiting for it {fmt_pct(ledger.pct(Component.DATA_LOADING))} of the "
        f"{ledger.window}{scaled} (the share at stake: what workers can win back)"
    )


_SINGLE = "_SingleProcessDataLoaderIter"
_MULTI = "_MultiProcessingDataLoaderIter"


def _from_trace(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    ledger = ctx.ledger(m)
    if ledger is None:
        return RuleResult.cannot_judge("no step ledger or DataLoader events in the trace")
    share = ledger.pct(Component.DATA_LOADING)
    window = ledger.window
    it = m.dataloader_iter
    if not it and share == 0.0:
        return RuleResult.not_applicable("no DataLoader iteration in the trace")
    if share <= t.dataloader_wait_share_pct:
        with_workers = " (workers: the trace shows _MultiProcessingDataLoaderIter)" if it == "multi-process" else ""
        return RuleResult.fine(
            f"the GPU waits for the DataLoader {fmt_pct(share)} of step time in the trace "
            f"(threshold {t.dataloader_wait_share_pct:g}%){with_workers}"
            if ledger.basis == LedgerBasis.GPU
            else f"DataLoader {fmt_pct(share)} of step time in the trace (threshold {t.dataloader_wait_share_pct:g}%)"
            f"{with_workers}",
            applied=it == "multi-process",
        )
    dl = ctx.main_dataloader()
    loc = location_of(dl.call_site) if dl is not None else None
    what = "step time" if m.steps else "the trace (no step markers)"
    waits = "the GPU sits idle waiting for the next batch" if ledger.basis == LedgerBasis.GPU else "the loop waits for the next batch"
    keep = "" if ctx.workers_caveat(dl) else "persistent_workers=True"  # the script's source may be against it
    if it == "multi-process":
        message = (
            f"{waits} {fmt_pct(share)} of {what} although the DataLoader has worker processes "
            f"({_MULTI}): they cannot keep up (window: {window})"
        )
        instruction = (
            "The DataLoader already loads in workers and they still fall behind: raise num_workers if cores are "
            "free (one per batch load time ÷ step compute time, up to the cores less one) and prefetch_factor"
            f"{', keep ' + keep if keep else ''}; if the cores are busy, make each "
            "batch cheaper (cache decoded data, "
            "move augmentation to the GPU). The trace does not record num_workers; `gpudoctor profile` derives a "
            "value from the settings."
        )
        changes: dict[str, object] = {"num_workers": 8, "prefetch_factor": 4, "persistent_workers": True}
    else:
        single = f" in the main process ({_SINGLE}: num_workers=0)" if it == "single-process" else ""
        message = f"{waits} {fmt_pct(share)} of {what}: the DataLoader loads{single or ' the batches'} (window: {window})"
        instruction = (
            "Load batches in worker processes: set num_workers > 0 (one per batch load time ÷ step compute time, "
            f"up to the cores less one),{' ' + keep + ',' if keep else ''} "
            "pin_memory=True. The trace does not record the "
            "DataLoader's settings; `gpudoctor profile` derives a value from them."
        )
        changes = {"num_workers": 4, "persistent_workers": True}
    part = ledger.get(Component.DATA_LOADING)
    notes = [f"iterator: {part.detail}"] if part is not None and part.detail else []
    expected = expected_note = None
    if it == "single-process" and m.steps and ledger.windows and part is not None and part.ns > 0:
        # workers hide the whole wait but the receipt of each batch (one batch per step assumed); a bare
        # trace records neither the cores nor what the loading does: enough of both is assumed
        wait_ns = part.ns / ledger.windows
        handover_ns = t.dataloader_handover_ms * 1e6
        expected = max(0.0, min(1.0, 1.0 - handover_ns / wait_ns))
        expected_note = (
            f"workers hide the {fmt_ns(wait_ns)} wait per step but the hand-over of its batch ({fmt_ns(handover_ns)}); "
            "assumes one batch per step and enough cores (or a load that waits): a bare trace records neither"
        )
    fix = _fix(ctx, dl, instruction, changes, notes)
    finding = ctx.finding(
        message,
        fix,
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=[
            Metric("data_wait_share_pct", round(share, 2), "%", window),
            Metric("dataloader_iterator", it or "unknown"),
        ],
        settings=dataloader_settings(dl) if dl is not None else (),
        notes=notes,
        location=loc,
        gain_note=(
            "GPU idle time while the loop waited in DataLoader.__next__"
            if ledger.basis == LedgerBasis.GPU
            else "time in DataLoader.__next__"
        ),
        rank=m.rank,
        claims=[(Component.DATA_LOADING, None)],
        ledger=ledger,
        expected=expected,
        expected_note=expected_note or "",
    )
    return RuleResult.fired(finding)


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: the DataLoader arguments of the fix, at the DataLoader the finding names."""
    dl = dataloader_of(ctx, finding)
    why = no_dataloader_reason(ctx, dl)
    if why:
        return why
    n = next((m.value for m in finding.evidence.metrics if m.name == "suggested_num_workers"), None)
    if not isinstance(n, int):
        return "the finding comes from a trace without per-step records: no num_workers was derived"
    caveat = ctx.workers_caveat(dl)
    if caveat is not None and caveat[1]:
        return f"the fix is left to the author: {caveat[0]}"
    threads = next((m.value for m in finding.evidence.metrics if m.name == "suggested_num_threads"), None)
    out = dataloader_injections(dl, _allowed(ctx, dl, _changes(ctx, dl, n)))
    if isinstance(threads, int):
        out = (*out, Injection("threads", "torch.set_num_threads", threads,
                               text=f"torch.set_num_threads({threads}) in the training process"))
    return out


def check(ctx: RuleContext) -> RuleResult:
    if ctx.steps():
        return _from_steps(ctx)
    if ctx.metrics:
        return ctx.per_trace(lambda m: _from_trace(ctx, m))
    return RuleResult.cannot_judge("no per-step records and no trace: nothing says how long the loop waited for data")


# --------------------------------------------------------------------------- `gpudoctor check`


def _no_workers(src: StaticContext, fn: Function, lf: LoaderFact) -> None:
    """A DataLoader that loads in the training process (num_workers 0 or not set), unless it
    indexes a TensorDataset already in memory."""
    nw_state, nw = src.loader_value(fn, lf, "num_workers")
    zero_workers = nw_state == "missing" or (
        nw_state == "set" and nw is not None and nw.known and nw.value == 0 and nw.value is not False
    )
    if not zero_workers or lf.in_memory:
        return
    loc = src.location(fn, lf.site)
    before = src.source(fn, lf.site)
    ev = Evidence(
        settings=(SettingRef("DataLoader.num_workers", nw.value if nw is not None else 0, loc),),
        notes=tuple(filter(None, [origin_note("num_workers", nw)])),
    )
    n, sizing = workers_here()
    sized = src.sized("num_workers", fn, lf.site)  # `check --workers N`, or what --verify measured (`--from RUN`)
    if sized.value is not None:
        n, sizing = sized.value, f"How many: {sized.value}, {sized.why}."
    flag = arg_fix(nw, str(n))
    # what the automatic fix would break: the author's to change (the finding stays, its evidence says why)
    pw_state, _pw = src.loader_value(fn, lf, "persistent_workers")
    changed = dataset_changed(src, fn, lf)
    manual = ""
    if lf.unpicklable:
        manual = (f"{lf.unpicklable}: worker processes started by spawn or forkserver (macOS, Windows; Linux from "
                  "Python 3.14) receive it pickled and cannot unpickle it; define it at the module's top level")
    elif changed is not None and changed[1]:
        manual = f"{changed[0]}: a worker holds its own copy of the dataset and would not see the change"
    keep = pw_state == "missing" and changed is None  # persistent workers keep their first copy of the dataset
    changes: dict[str, object] = {"num_workers": n, **({"persistent_workers": True} if keep else {})}
    instruction = (
        f"Load batches in worker processes: set num_workers on the DataLoader at {at(loc)}"
        + (", with persistent_workers=True" if keep else "")
        + (f" (or change the default of {flag[0]})" if flag else "") + f". {sizing}"
    )
    src.report(
        "GD201",
        Severity.WARNING,
        f"DataLoader at {at(loc)} loads every batch in the training process "
        f"({how('num_workers', nw_state, nw, '0')}): the step waits while the main process reads and collates "
        "each batch",
        Fix(instruction, before, with_kwargs(before, {k: str(v) for k, v in changes.items()}),
            # a count from a command-line flag: its default is the script's to change (the instruction says so)
            () if flag or sized.refused or manual else
            (dataloader_args(fn.file, lf.site.line, changes, col=lf.site.col),)),
        fn,
        lf.site,
        Evidence(ev.metrics, ev.time_ranges, ev.settings,
                 (*ev.notes, *filter(None, [sized.refused, manual_note(manual) if manual else ""]))),
    )


def workers_here(t: Thresholds | None = None) -> tuple[int, str]:
    """The num_workers a static fix suggests, and how it was chosen: GD201's bound for a loading that
    computes (the usable cores, at most ``dataloader_max_workers_count``), with the cores of the machine
    `gpudoctor check` runs on; `profile` sizes it from the measured load of a batch."""
    t = t or Thresholds()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    n = max(1, min(cores - t.dataloader_reserved_cores, t.dataloader_max_workers_count))
    return n, (
        f"How many: {n} here, the {cores} cores `gpudoctor check` sees less {t.dataloader_reserved_cores} for the "
        f"training process (at most {t.dataloader_max_workers_count}), the most a loading that computes can use; "
        "count the training machine's cores instead, or let `gpudoctor profile` size it from the measured load of "
        "a batch (a loading that waits on storage may use more)"
    )


def _hf_arguments(scan: Scan, node: ast.Call, q: str) -> None:
    """``TrainingArguments(...)``: the Trainer builds its DataLoaders with ``dataloader_num_workers``."""
    if any(k.arg is None for k in node.keywords):
        return  # **kwargs: not known here
    nw = scan.kwarg(node, "dataloader_num_workers")
    scan.record("hf_loader", node, scan.sym(nw) if nw is not None else None)


def _hf_state(src: StaticContext, fn: Function, f: Fact) -> tuple[str, Resolved | None]:
    return ("set", src.resolve(fn, f.value)) if f.value is not None else ("missing", None)


def _hf_no_workers(src: StaticContext, fn: Function, f: Fact) -> None:
    state, nw = _hf_state(src, fn, f)
    if not (state == "missing" or (nw is not None and nw.known and nw.value == 0 and nw.value is not False)):
        return
    loc = src.location(fn, f.site)
    before = src.source(fn, f.site)
    n, sizing = workers_here()
    sized = src.sized("num_workers", fn, f.site)
    if sized.value is not None:
        n, sizing = sized.value, f"How many: {sized.value}, {sized.why}."
    src.report(
        "GD201",
        Severity.WARNING,
        f"`{f.text.split('(', 1)[0]}(...)` at {at(loc)}: the Trainer loads every batch in the training process "
        f"({how('dataloader_num_workers', state, nw, '0')}): the step waits while the main process reads and "
        "collates each batch",
        Fix(
            f"Let the Trainer load batches in worker processes: dataloader_num_workers on the TrainingArguments "
            f"at {at(loc)}, with dataloader_persistent_workers=True. {sizing}",
            before,
            with_kwargs(before, {"dataloader_num_workers": str(n), "dataloader_persistent_workers": "True"}),
        ),
        fn,
        f.site,
        Evidence(settings=(SettingRef("TrainingArguments.dataloader_num_workers", nw.value if nw else 0, loc),)),
    )


def static_check(src: StaticContext) -> None:
    for fn, lf in src.loaders():
        _no_workers(src, fn, lf)
    for fn, f in src.facts("hf_loader"):
        if src.active(fn, f.ctx):
            _hf_no_workers(src, fn, f)


def _loader_settings(src: StaticContext) -> list[tuple[str, str, str]]:
    """(file:line, num_workers, prefetch_factor) of every DataLoader, as the checklist shows them."""
    out = []
    for fn, lf in src.loaders():
        loc = src.location(fn, lf.site)
        out.append((
            first_of([loc]),
            shown(*src.loader_value(fn, lf, "num_workers"), "0"),
            shown(*src.loader_value(fn, lf, "prefetch_factor"), "2"),
        ))
    for fn, f in src.facts("hf_loader"):  # the Trainer's DataLoaders, from its TrainingArguments
        if src.active(fn, f.ctx):
            out.append((first_of([src.location(fn, f.site)]), shown(*_hf_state(src, fn, f), "0"), "2 (default)"))
    return out


def _judge_workers(src: StaticContext) -> tuple[ChecklistStatus, str]:
    loaders = _loader_settings(src)
    if not loaders:
        return ChecklistStatus.NOT_APPLICABLE, NO_LOADER
    text = "; ".join(f"num_workers={workers} at {where}" for where, workers, _pf in loaders[:3])
    values = [workers for _where, workers, _pf in loaders]
    if all(not v.startswith(("0", "set", "decided")) for v in values):
        return ChecklistStatus.APPLIED, text
    if any(v.startswith("0") for v in values):
        return ChecklistStatus.NOT_APPLICABLE, (
            text + ": the dataset is a TensorDataset in memory, or the loader is not used by default"
        )
    return ChecklistStatus.NOT_MEASURABLE, text + " (computed at run time)"


def _judge_prefetch(src: StaticContext) -> tuple[ChecklistStatus, str]:
    loaders = _loader_settings(src)
    if not loaders:
        return ChecklistStatus.NOT_APPLICABLE, NO_LOADER
    with_workers = [(where, pf) for where, workers, pf in loaders if not workers.startswith("0")]
    if not with_workers:
        return ChecklistStatus.NOT_APPLICABLE, "num_workers=0: prefetching starts with workers (see num_workers > 0 above)"
    where, pf = with_workers[0]
    return ChecklistStatus.APPLIED, f"prefetch_factor={pf} per worker at {where}; raise it if load times vary"


STATIC = StaticCheck(
    check=static_check,
    watch=Watch(calls=dict.fromkeys(HF_TRAINING_ARGS, _hf_arguments)),
    judges={"dataloader-workers": _judge_workers, "prefetch": _judge_prefetch},
)


EXAMPLES = examples(
    bad_argparse_default="""\
# num_workers comes from a command-line flag whose default is 0.
import argparse

import torch
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=0)
args = parser.parse_args()

loader = DataLoader(dataset, batch_size=64, num_workers=args.workers)
for x, y in loader:
    loss = criterion(model(x.cuda()), y.cuda())
    loss.backward()
    optimizer.step()
""",
    bad_no_workers="""\
# The DataLoader reads and collates every batch in the training process.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(dataset, batch_size=64, shuffle=True)  # num_workers defaults to 0

for images, labels in loader:
    images = images.to(device)
    labels = labels.to(device)
    loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    good_workers="""\
# Batches are loaded by four worker processes while the GPU trains.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4,
                    persistent_workers=True, pin_memory=True)

for images, labels in loader:
    images = images.to(device, non_blocking=True)
    labels = labels.to(device, non_blocking=True)
    loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
)


RULE = Rule(
    code="GD201",
    name="dataloader-stall",
    title="The training loop waits for the next batch",
    doc=__doc__,
    check=check,
    needs={Need.STEPS},
    self_checked={Need.STEPS},
    inject=inject,
    static=STATIC,
    examples=EXAMPLES,
    autofix=True,
)
