"""GD204 cpu-oversubscription: DataLoader workers and intra-op threads want more cores than there are.

What it detects
---------------
The training process's intra-op threads (`torch.get_num_threads()`) plus the
DataLoader workers times their own threads exceed the cores available, while
the process tree keeps the machine's CPUs saturated. Each worker that uses
torch, NumPy/BLAS or OpenCV brings its own thread pool unless told otherwise.

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
Settings: `num_threads`, `cpu_count`, the DataLoaders' `num_workers` and
`worker_init_fn`, `OMP_NUM_THREADS`; psutil samples of the main process and
the workers (`cpu_pct`, `threads`).

Thresholds
----------
- `oversubscription_ratio` (1.0): busy threads / cores above which it fires.
- `cpu_saturation_pct` (90): the process tree's CPU as a % of all cores.
- `error_share_pct`, `warning_share_pct`: severity from the share of CPU time
  the threads cannot get (an inferred figure).

Known limits
------------
Threads counted by psutil include idle helper threads; the rule counts a
worker's threads only when its samples show it busy. The time at stake is
inferred from the excess of threads over cores, not measured.

References
----------
- PyTorch CPU threading and TorchScript inference (intra-op threads, OMP_NUM_THREADS):
  https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html
- PyTorch performance tuning guide, CPU-specific optimizations:
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from gpudoctor.model.findings import Confidence, Fix, Metric, SettingRef
from gpudoctor.rules.context import RuleContext, RuleResult, location_of
from gpudoctor.rules.helpers import dataloader_call
from gpudoctor.rules.registry import Rule


def tree_cpu_pct(ctx: RuleContext) -> float | None:
    """Median over sample instants of the CPU % of the training process and its workers (100 = one core)."""
    by_t: dict[int, float] = defaultdict(float)
    for p in ctx.samples_process():
        by_t[p.t_ns] += p.cpu_pct
    if not by_t:
        return None
    steps = ctx.steps()
    if steps:
        lo, hi = steps[0].start_ns, max(s.start_ns + s.wall_ns for s in steps)
        inside = {t: v for t, v in by_t.items() if lo <= t <= hi}
        by_t = inside or by_t
    return statistics.median(by_t.values())


def worker_threads(ctx: RuleContext) -> dict[int, int]:
    """Busy threads per worker pid: the worker's median CPU in whole cores (at least 1)."""
    per_pid: dict[int, list[float]] = defaultdict(list)
    for p in ctx.samples_process("worker"):
        per_pid[p.pid].append(p.cpu_pct)
    return {pid: max(1, round(statistics.median(v) / 100.0)) for pid, v in per_pid.items()}


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
    per_worker = worker_threads(ctx)
    if per_worker:
        worker_demand = round(statistics.median(per_worker.values()) * workers)
        how = f"{workers} workers × {statistics.median(per_worker.values()):g} busy thread(s) (psutil)"
    else:
        worker_demand = workers
        how = f"{workers} workers × 1 thread (torch's default in workers; no worker samples)"
    demand = s.num_threads + worker_demand
    ratio = demand / cores
    if ratio <= t.oversubscription_ratio:
        return RuleResult.fine(
            f"{s.num_threads} intra-op threads + {how} = {demand} threads on {cores} cores"
        )
    tree = tree_cpu_pct(ctx)
    if tree is None:
        return RuleResult.cannot_judge(
            f"{demand} threads on {cores} cores, but no CPU samples to see whether the machine is saturated"
        )
    saturation = tree / cores
    if saturation < t.cpu_saturation_pct:
        return RuleResult.fine(
            f"{demand} threads on {cores} cores, but the processes use {saturation:.0f}% of the cores: no contention"
        )
    excess_pct = 100.0 * (demand - cores) / demand
    loc = location_of(dl.call_site) if dl is not None else None
    new_workers = min(workers, max(1, cores - 1))
    new_threads = max(1, cores - new_workers)
    omp = s.env.get("OMP_NUM_THREADS")
    message = (
        f"CPU oversubscribed: {s.num_threads} intra-op threads + {how} = {demand} busy threads on {cores} cores "
        f"({ratio:.1f}×), processes at {saturation:.0f}% of all cores"
    )
    instruction = (
        f"Give each DataLoader worker one thread (`torch.set_num_threads(1)` in `worker_init_fn`, and "
        f"`cv2.setNumThreads(0)` with OpenCV), set `torch.set_num_threads({new_threads})` in the training process "
        f"(or OMP_NUM_THREADS={new_threads})"
        + (f", and num_workers={new_workers}" if new_workers != workers else "")
        + (f" at {loc}" if loc else "")
        + "."
    )
    before = f"{dataloader_call(dl)}"
    after = (
        "def worker_init_fn(_):\n    torch.set_num_threads(1)\n\n"
        f"torch.set_num_threads({new_threads})\n"
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
        Metric("busy_threads", demand, "count"),
        Metric("cpu_count", cores, "count"),
        Metric("oversubscription_ratio", round(ratio, 2), "ratio"),
        Metric("process_tree_cpu_pct", round(saturation, 1), "%", "all cores"),
        Metric("cpu_time_short_pct", round(excess_pct, 1), "%", "the threads' CPU demand"),
    ]
    finding = ctx.finding(
        message,
        Fix(instruction, before, after),
        share_pct=excess_pct,
        confidence=Confidence.INFERRED,
        metrics=metrics,
        settings=settings,
        location=loc,
        gain_note="share of the threads' CPU demand the cores cannot serve; inferred, not measured",
    )
    return RuleResult.fired(finding)


RULE = Rule(
    code="GD204",
    name="cpu-oversubscription",
    title="More busy threads than cores",
    doc=__doc__,
    check=check,
    needs=("settings", "samples"),
)
