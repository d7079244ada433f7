"""The cores the training process and its workers wanted (on a core or waiting for one), from the
samples' CPU and run-queue wait (GD201, GD203, GD204, GD205)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from gpudoctor.rules.context import RuleContext


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


def runnable_demand(ctx: RuleContext) -> Demand | None:
    """CPU + run-queue wait of the training process and its workers, in threads, over the
    steps' span (every sample without steps); None without run-queue figures."""
    per_t: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    per_worker: dict[int, list[float]] = defaultdict(list)
    steps = ctx.steps()
    lo, hi = (steps[0].start_ns, max(s.start_ns + s.wall_ns for s in steps)) if steps else (None, None)
    for p in ctx.samples_process():
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
