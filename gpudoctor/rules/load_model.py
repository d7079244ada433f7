"""GD201's worker-sizing model (also GD204's step model): the workers a measured load calls for, the step
they give, what memory holds, and the ledger parts a fix that warms the compute claims.

The load itself (its wall and CPU time per batch, its kind, the readings and samples behind them) is part of
the run's figures (``analysis.loader``, ``RuleContext.figures.loader``); the sizing stays with the rules: it
applies the diagnosis's thresholds (hand-over, reserved and spare workers, the most workers, the memory share)
and writes the recommendation, which is GD201's, not a figure of the run."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from gpudoctor.analysis.load import StepCompute
from gpudoctor.analysis.loader import COMPUTING, UNMEASURED, WAITING, Load, LoaderFigures
from gpudoctor.config import Thresholds
from gpudoctor.model.findings import Finding, Metric
from gpudoctor.model.metrics import Component, Ledger, LedgerBasis
from gpudoctor.model.run import DataLoaderSetting, Injection
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_bytes, fmt_ns, fmt_pct


def loader_of(ctx: RuleContext) -> LoaderFigures:
    """The run's DataLoader figures (``RunFigures.loader``: a diagnosis's figures always carry them)."""
    loader = ctx.figures.loader
    assert loader is not None, "RuleContext.figures is computed with the diagnosis's thresholds"
    return loader


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


def host_claims(ledger: Ledger, share: float) -> list[tuple[Component, int | None]]:
    """The share ``share`` of each of the training process's own parts of ``ledger`` (``HOST_PARTS``)."""
    return [(c, int(ledger.ns(c) * share)) for c in HOST_PARTS if ledger.ns(c) > 0]


def wait_claims(ledger: Ledger | None, cold_share: float) -> list[tuple[Component, int | None]]:
    """The ledger parts GD201's finding claims: the data wait, and on a run without a GPU the share ``cold_share``
    of the training process's own time that the compute ran beyond the least any step showed (it runs warm
    once the loop stops waiting: issue 42, a bound of 78.3% that --verify beat with 86.2%)."""
    out: list[tuple[Component, int | None]] = [(Component.DATA_LOADING, None)]
    if ledger is None or ledger.basis == LedgerBasis.GPU or cold_share <= 0:
        return out
    return out + host_claims(ledger, min(1.0, cold_share))


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


def memory_cap(ctx: RuleContext, dl: DataLoaderSetting | None) -> tuple[int, str] | None:
    """How many workers the machine's memory holds (``dataloader_worker_memory_share_pct`` of it, less the
    training process), each at the median worker's RSS (the training process's when no worker ran: a
    forked worker maps its pages, and holds prefetch_factor batches besides); None without the figures."""
    t = ctx.thresholds
    total = ctx.figures.memory.host_total_bytes
    use = loader_of(ctx).workers
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


def threads_text(plan: WorkerPlan, threads_now: int | None, cores: int | None) -> str:
    """The fix's sentence for the training's threads where the plan sets them ("" where it leaves them)."""
    if plan.threads_after is None:
        return ""
    return (f" Call torch.set_num_threads({plan.threads_after}) in the training process (or "
            f"OMP_NUM_THREADS={plan.threads_after}): its {threads_now} intra-op threads beside {plan.workers} "
            f"computing worker(s) would want more than the {cores} cores, and an op waits at its barrier "
            "for a thread that lost its core.")


def threads_metrics(plan: WorkerPlan, threads_now: int | None) -> tuple[Metric, ...]:
    """The finding's record of the threads the plan sets (read back by ``threads_injections``)."""
    if plan.threads_after is None:
        return ()
    return (Metric("suggested_num_threads", plan.threads_after, "count",
                   f"torch.set_num_threads in the training process (now {threads_now})"),)


def threads_injections(finding: Finding) -> tuple[Injection, ...]:
    """--verify: the training's threads a GD201 finding sets, as its fix says."""
    n = next((m.value for m in finding.evidence.metrics if m.name == "suggested_num_threads"), None)
    if not isinstance(n, int):
        return ()
    return (Injection("threads", "torch.set_num_threads", n, text=f"torch.set_num_threads({n}) in the training process"),)


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


def cold_text(comp: StepCompute, warm: bool) -> str:
    """The step's own work warm and cold, in words; ``warm``: the model takes the warm figure (else the mean:
    a busy machine)."""
    return (f"the step's own work takes {fmt_ns(comp.warm_ns)} when its data is ready (p{comp.quantile_pct:g} of "
            f"{comp.steps} steps' time outside the wait), {fmt_ns(comp.cold_ns)} after a wait (median): "
            + ("the CPU goes cold while the loop waits; the model takes the warm figure" if warm else
               "on this busy machine it also waits for cores other processes hold, which workers do not give "
               "back; the model takes the mean")
            + f", the bound the least ({fmt_ns(comp.least_ns)})")
