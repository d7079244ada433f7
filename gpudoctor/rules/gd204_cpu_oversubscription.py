"""GD204 cpu-oversubscription: DataLoader workers and intra-op threads want more cores than there are.

What it detects
---------------
The training process and its DataLoader workers keep more threads runnable
than the machine has cores. gpudoctor measures that demand directly: for each
process, the time its threads ran (psutil CPU %) plus the time they were
runnable but waited in the kernel's run queue for a core (Linux schedstat),
summed over the process tree. Each worker that uses torch, NumPy/BLAS or
OpenCV brings its own thread pool unless told otherwise.

Why it matters
--------------
With more runnable threads than cores, the OS time-slices them: caches are
thrashed, OpenMP threads spin waiting for each other, and the training
process's compute threads lose their cores to the workers. Throughput drops
while CPU usage shows 100%.

How to fix
----------
Give each worker one thread and leave the rest to the training process:
`OMP_NUM_THREADS` before start-up, `torch.set_num_threads` in the worker's
`worker_init_fn`, and a `num_workers` that fits next to the main process.

Before:

```python
loader = DataLoader(ds, batch_size=64, num_workers=16)   # on an 8-core machine
```

After:

```python
def worker_init_fn(_):
    torch.set_num_threads(1)              # and cv2.setNumThreads(0) with OpenCV

torch.set_num_threads(4)
loader = DataLoader(ds, batch_size=64, num_workers=3, worker_init_fn=worker_init_fn)
```

Evidence used
-------------
psutil samples of the training process and its workers during the steps:
`cpu_pct` and `runq_wait_pct` (time runnable but waiting for a core, from
`/proc/<pid>/task/<tid>/schedstat`); the median over sample instants of their
sum is the number of threads that wanted a core. Settings: `cpu_count`,
`num_threads`, the DataLoaders' `num_workers` and `worker_init_fn`,
`OMP_NUM_THREADS`. The unserved share of the threads' CPU demand sets the
severity; it is not a share of step time, so the finding claims no part of
the step's ledger (docs/account.md).

Thresholds
----------
- `oversubscription_ratio` (1.5): runnable threads / cores above which it
  fires.
- `error_share_pct`, `warning_share_pct`: severity from the share of the
  threads' demand the cores cannot serve, (demand − cores) / demand.

Known limits
------------
The run-queue wait is read from Linux's schedstat: elsewhere (macOS, Windows)
or on a run directory without it, the rule says it cannot judge. A CPU %
alone cannot show more demand than there are cores. Other processes on the
machine lengthen the wait but not the demand of the training's own threads,
which is what the rule compares with the cores; they are not counted. The time
at stake is inferred from the excess of demand over cores, not measured as
step time.

References
----------
- PyTorch CPU threading and TorchScript inference (intra-op threads, OMP_NUM_THREADS):
  https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html
- PyTorch performance tuning guide, CPU-specific optimizations:
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
- Linux scheduler statistics (`/proc/<pid>/schedstat`: time on the CPU, time waiting on a run queue):
  https://docs.kernel.org/scheduler/sched-stats.html
"""

from __future__ import annotations

from gpudoctor.config import Thresholds
from gpudoctor.model.findings import Confidence, Finding, Fix, Metric, SettingRef
from gpudoctor.model.run import Injection
from gpudoctor.rules.context import RuleContext, RuleResult, location_of
from gpudoctor.rules.helpers import (
    Demand,
    dataloader_call,
    dataloader_injections,
    dataloader_of,
    no_dataloader_reason,
    runnable_demand,
)
from gpudoctor.rules.registry import Rule

# a worker whose threads want more than this many cores runs a thread pool of its own
_POOL_PER_WORKER = 1.25

def _remedy(t: Thresholds, d: Demand, cores: int, workers: int) -> tuple[bool, int | None, int]:
    """(workers run thread pools, training-process threads to set or None, num_workers to keep)."""
    pools = d.per_worker > _POOL_PER_WORKER
    # After one thread per worker, a worker wants about the CPU it gets now (its threads are
    # spinning or waiting otherwise); what remains over the cores comes out of the training
    # process's threads, and then out of the workers.
    worker_need = min(d.workers_cpu, float(workers)) if pools else d.workers
    main_cores = max(1, round(cores - worker_need))
    over_after = d.main + worker_need > cores * t.oversubscription_ratio
    new_threads = main_cores if over_after and d.main > main_cores + 0.5 else None
    new_workers = workers
    if over_after and worker_need > cores - 1 and workers > 1:
        per = worker_need / workers
        new_workers = max(1, min(workers - 1, int((cores - 1) / per) if per > 0 else workers - 1))
    return pools, new_threads, new_workers


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: one thread per DataLoader worker, and the training-process threads and
    num_workers the finding gives (the same derivation as ``check``)."""
    dl = dataloader_of(ctx, finding)
    why = no_dataloader_reason(ctx, dl)
    if why:
        return why
    cores = ctx.cpu_count()
    d = runnable_demand(ctx)
    if cores is None or d is None:
        return "the run-queue figures behind the finding are missing"
    pools, new_threads, new_workers = _remedy(ctx.thresholds, d, cores, dl.num_workers)
    out: list[Injection] = []
    if pools or not dl.has_worker_init_fn:
        out.append(Injection("worker_threads", "torch.set_num_threads", 1, dl.call_site,
                             text=f"torch.set_num_threads(1) in each worker of the DataLoader at {dl.call_site}"))
    if new_threads is not None:
        out.append(Injection("threads", "torch.set_num_threads", new_threads,
                             text=f"torch.set_num_threads({new_threads}) in the training process"))
    if new_workers != dl.num_workers:
        out.extend(dataloader_injections(dl, {"num_workers": new_workers}))
    return tuple(out) or "the finding suggests no change gpudoctor can make"


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    s = ctx.settings
    if s is None:
        return RuleResult.cannot_judge("no thread settings: analyse a run directory from `gpudoctor profile`")
    cores = ctx.cpu_count()
    if cores is None or s.num_threads is None:
        return RuleResult.cannot_judge("the core count or torch's thread count was not recorded")
    dl = ctx.main_dataloader()
    workers = dl.num_workers if dl is not None else 0
    if workers == 0:
        return RuleResult.not_applicable(
            f"no DataLoader workers: {s.num_threads} intra-op threads on {cores} cores"
        )
    d = runnable_demand(ctx)
    if d is None:
        return RuleResult.cannot_judge(
            f"{s.num_threads} intra-op threads and {workers} workers on {cores} cores, but no run-queue wait was "
            "recorded (Linux schedstat): CPU % alone cannot show more demand than there are cores"
        )
    ratio = d.tree / cores
    how = (
        f"training process {d.main:.1f} + {workers} workers {d.workers:.1f} "
        f"= {d.tree:.1f} runnable threads on {cores} cores ({ratio:.2f}×, median of {d.ticks} samples)"
    )
    if ratio <= t.oversubscription_ratio:
        return RuleResult.fine(f"{how}; threshold {t.oversubscription_ratio:g}×")
    excess_pct = 100.0 * (d.tree - cores) / d.tree
    loc = location_of(dl.call_site) if dl is not None else None
    pools, new_threads, new_workers = _remedy(t, d, cores, workers)
    omp = s.env.get("OMP_NUM_THREADS")
    message = (
        f"CPU oversubscribed: {how}; on average {d.main_wait:.1f} of the training process's threads "
        "are waiting for a core"
    )
    parts = []
    if pools or not dl.has_worker_init_fn:
        parts.append(
            "give each DataLoader worker one thread (`torch.set_num_threads(1)` in `worker_init_fn`, and "
            "`cv2.setNumThreads(0)` with OpenCV)"
            + (f": each worker now keeps {d.per_worker:.1f} threads busy" if pools else "")
        )
    if new_threads is not None:
        parts.append(f"set `torch.set_num_threads({new_threads})` in the training process (or OMP_NUM_THREADS={new_threads})")
    if new_workers != workers:
        parts.append(f"lower num_workers to {new_workers}")
    if not parts:
        parts.append(f"lower num_workers or torch's threads until they fit the {cores} cores")
    instruction = "; ".join(parts)
    instruction = instruction[0].upper() + instruction[1:] + (f" (DataLoader at {loc})" if loc else "") + "."
    before = dataloader_call(dl)
    after = (
        "def worker_init_fn(_):\n    torch.set_num_threads(1)\n\n"
        + (f"torch.set_num_threads({new_threads})\n" if new_threads is not None else "")
        + dataloader_call(dl, num_workers=new_workers, worker_init_fn="worker_init_fn").replace(
            "'worker_init_fn'", "worker_init_fn"
        )
    )
    settings = [
        SettingRef("torch.get_num_threads()", s.num_threads),
        SettingRef("cpu_count", cores),
        SettingRef("DataLoader.num_workers", workers, loc),
        SettingRef("DataLoader.worker_init_fn", dl.has_worker_init_fn if dl is not None else None, loc),
    ]
    if omp is not None:
        settings.append(SettingRef("OMP_NUM_THREADS", omp))
    metrics = [
        Metric("runnable_threads", round(d.tree, 2), "count", "training process and workers, on a core or waiting"),
        Metric("main_runnable_threads", round(d.main, 2), "count"),
        Metric("workers_runnable_threads", round(d.workers, 2), "count"),
        Metric("runnable_threads_per_worker", round(d.per_worker, 2), "count", "median worker"),
        Metric("main_runq_wait_threads", round(d.main_wait, 2), "count", "training process, waiting for a core"),
        Metric("cpu_count", cores, "count"),
        Metric("oversubscription_ratio", round(ratio, 2), "ratio"),
        Metric("cpu_demand_unserved_pct", round(excess_pct, 1), "%", "the threads' CPU demand"),
    ]
    finding = ctx.finding(
        message,
        Fix(instruction, before, after),
        share_pct=None,
        severity_pct=excess_pct,
        confidence=Confidence.INFERRED,
        metrics=metrics,
        settings=settings,
        location=loc,
        gain_note=f"{excess_pct:.1f}% of the threads' CPU demand the cores cannot serve; not a share of step time",
    )
    return RuleResult.fired(finding)


RULE = Rule(
    code="GD204",
    name="cpu-oversubscription",
    title="More busy threads than cores",
    doc=__doc__,
    check=check,
    needs=("settings", "samples"),
    inject=inject,
)
