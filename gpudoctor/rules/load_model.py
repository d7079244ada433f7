"""GD201's worker-sizing model (also GD204's step model): the workers a measured load calls for, the step
they give, what memory holds, and the ledger parts a fix that warms the compute claims.

The load itself (its wall and CPU time per batch, its kind, the readings and samples behind them) is part of
the run's figures (``analysis.loader``, ``RuleContext.figures.loader``); the sizing stays with the rules: it
applies the diagnosis's thresholds (hand-over, reserved and spare workers, the most workers, the memory share)
and writes the recommendation, which is GD201's, not a figure of the run."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from gpudoctor.analysis.load import StepCompute
from gpudoctor.analysis.loader import COMPUTING, UNMEASURED, WAITING, Load, LoaderFigures
from gpudoctor.config import Thresholds
from gpudoctor.model.metrics import Component, Ledger
from gpudoctor.model.run import DataLoaderSetting
from gpudoctor.rules.context import RuleContext, fmt_bytes, fmt_ns, fmt_pct


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

        step = max(compute + handover, load ÷ workers, load_cpu ÷ usable_cores,
                   (main_cpu + handover + load_cpu) ÷ cores)

    A pipeline runs at the rate of its slowest stage. The loop takes a batch every ``compute`` (the
    step less its data wait) plus the hand-over of the batch from a worker (unpickling it, mapping its
    shared memory: the training process's own work, so it adds to the loop's stage and its CPU, not to
    the workers'); ``workers`` deliver ``workers`` batches per ``load`` (the wall time of one batch in
    one worker), in parallel with the loop; the workers' CPU per batch cannot run faster than the cores
    left to them allow, nor can the training process's and the workers' CPU together exceed all the
    cores. Terms whose figures are unknown (None) are left out. (Until issue 37 the hand-over was added
    after the max: where the workers set the pace, it was counted twice, and a held-out loader that
    waits 30 ms per batch, 14 workers, measured 2.27 ms per step against the 3.17 ms expected.)"""
    terms = [compute_ns + handover_ns, load_ns / max(1, workers)]
    if load_cpu_ns is not None and usable_cores:
        terms.append(load_cpu_ns / usable_cores)
    if load_cpu_ns is not None and main_cpu_ns is not None and cores:
        terms.append((main_cpu_ns + handover_ns + load_cpu_ns) / cores)
    return max(terms)


def host_claims(ledger: Ledger, share: float) -> list[tuple[Component, int | None]]:
    """The share ``share`` of each of the training process's own parts of ``ledger`` (``HOST_PARTS``)."""
    return [(c, int(ledger.ns(c) * share)) for c in HOST_PARTS if ledger.ns(c) > 0]


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


def plan_workers(load: Load, *, compute_ns: float, wait_ns: float, workers_now: int, cores: int | None,
                 main_cpu_ns: float | None, mem_cap: tuple[int, str] | None, t: Thresholds,
                 basis: str = "", noise_ns: float = 0.0, now_compute_ns: float | None = None,
                 stake_ns: float | None = None, free_cores: float | None = None) -> WorkerPlan:
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
    them); a computing load's workers and the model's CPU terms get no more than those."""
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
    after = loader_step_ns(compute_ns=compute_ns, load_ns=load.load_ns, load_cpu_ns=cpu, workers=running,
                           usable_cores=usable, main_cpu_ns=main_cpu_ns, handover_ns=handover,
                           # all the CPU, the workers' too (even a waiting load's), runs on the cores others leave
                           cores=max(1.0, min(cores, free_cores)) if cores and free_cores is not None else cores)
    now = (compute_ns if now_compute_ns is None else now_compute_ns) + wait_ns
    stake = wait_ns if stake_ns is None else stake_ns
    # a win per batch under the hand-over is within what the model can tell (its smallest term; a wait under it
    # is no stall the rule reports either), and so is one under the noise of the step's mean: none is promised
    resolution = max(handover, noise_ns)
    fraction = max(0.0, min(1.0, (now - after) / stake)) if stake > 0 and now - after >= resolution else 0.0
    terms = [f"compute {fmt_ns(compute_ns)} + hand-over {fmt_ns(handover)}",
             f"load {fmt_ns(load.load_ns)} ÷ {running} worker(s)"]
    if cpu is not None and usable:
        terms.append(f"load CPU {fmt_ns(cpu)} ÷ {usable} usable core(s)")
        if main_cpu_ns is not None and cores:
            cpu_cores = max(1.0, min(cores, free_cores)) if free_cores is not None else cores
            terms.append(f"(training CPU {fmt_ns(main_cpu_ns)} + hand-over + load CPU) ÷ {cpu_cores:.3g}"
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
    return WorkerPlan(n, needed, cap if limited else None, why if limited else "", now, wait_ns, after, fraction,
                      after <= (compute_ns + handover) * 1.01, model)


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
