"""GD204 cpu-oversubscription: DataLoader workers and intra-op threads want more cores than there are.

What it detects
---------------
The training process and its DataLoader workers keep more threads runnable
than the machine has cores: per process, the time its threads ran (psutil) plus
the time they waited in the run queue for a core (schedstat), summed over the
process tree. Each worker using torch, BLAS or OpenCV brings its own thread pool.

Why it matters
--------------
The OS time-slices the threads: caches thrash, OpenMP threads spin, the
training loses its cores to the workers; throughput drops at 100% CPU.

How to fix
----------
Give each worker one thread (`torch.set_num_threads(1)` in `worker_init_fn`),
the rest to the training process, and a `num_workers` that fits beside it.
**The sizes**, from the measured demand: a worker wanting over 1.25 cores gets
one thread; the training keeps the cores the workers leave; `num_workers` drops
where the workers alone want more than the cores less one.

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

Expected gain
-------------
Per batch, over the unprofiled steady steps. At stake: the loop's wait for the
starved workers (`data_loading`, which GD201 leaves here) and, without a GPU,
the compute stretched by waiting for a core:

    compute_after = compute × cores_got ÷ cores_after        (no GPU; else compute)
    step_after    = max(compute_after + h, (load_cpu + h) ÷ workers_after,
                        (load_cpu + h) ÷ cores_left_to_workers)     (h: the hand-over)
    expected      = (step_now − step_after) ÷ at_stake, clipped to [0, 1]

with the warm compute where the loop waits for data (as GD201). Where workers
run thread pools of their own and the loop waits, their CPU is mostly spinning:
the bound is the whole step, no expected gain (`gpudoctor verify` measures it).
Terms, sources and calibration runs: docs/account.md, "GD204".

Evidence used
-------------
psutil samples of the process tree (`cpu_pct` + `runq_wait_pct`); `cpu_count`,
`num_threads`, `num_workers`, `worker_init_fn`, `OMP_NUM_THREADS`; per-step
records and the ledger (without them no part of a ledger is claimed).

Thresholds
----------
- `oversubscription_ratio` (1.5): runnable threads / cores above which it fires.
- `dataloader_handover_ms` (1): the hand-over of a batch in the model.
- `warm_compute_quantile_pct` (10): the warm compute's quantile.
- `error_share_pct`, `warning_share_pct`: the severity scale.

Known limits
------------
Needs Linux's schedstat (else it cannot judge): a CPU % alone cannot show more
demand than cores. Other processes lengthen the wait, not the training's demand,
and are not counted (GD205). The time at stake is inferred from the cores the
training gets and would get (`--verify` measures it): an OpenMP step stalled at
barriers can gain more, a step that does not scale with cores less.

References
----------
- PyTorch CPU threading: https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html
- PyTorch tuning guide, CPU: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
- Linux scheduler statistics: https://docs.kernel.org/scheduler/sched-stats.html
"""

from __future__ import annotations

import ast
import re
import statistics
from dataclasses import dataclass

from gpudoctor.analysis.load import step_compute
from gpudoctor.analysis.loader import Demand
from gpudoctor.config import Thresholds
from gpudoctor.model.findings import (
    Confidence,
    Evidence,
    Finding,
    Fix,
    Metric,
    SettingRef,
    Severity,
)
from gpudoctor.model.metrics import Component
from gpudoctor.model.run import Injection
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.dataloader import (
    dataloader_call,
    dataloader_injections,
    dataloader_of,
    no_dataloader_reason,
)
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of
from gpudoctor.rules.load_model import host_claims, loader_of, loader_step_ns
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.static_api import (
    POSITIVE_VALUE,
    UNKNOWN,
    Function,
    LoaderFact,
    Scan,
    StaticCheck,
    StaticContext,
    Watch,
    examples,
)
from gpudoctor.rules.static_api.text import at

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


@dataclass(frozen=True, slots=True)
class Stake:
    """What the oversubscription costs a step (per batch, means over the steady steps), and what the
    model expects after the fix."""

    claims: tuple[tuple[Component, int | None], ...]  # ledger parts and the ns of each claimed (None: whole)
    stake_ns: float  # per batch: the data wait + the training process's compute stretched by its run-queue wait
    step_now_ns: float
    step_after_ns: float
    expected_fraction: float | None  # None: no model holds (the workers' pools spin: their CPU is not their work)
    model: str


def stake(ctx: RuleContext, d: Demand, cores: int, workers_after: int, threads_after: int | None,
          pools: bool) -> Stake | None:
    """The model (see the docs), from the run's figures (the step time and the data wait of the account's
    steps, the unprofiled ones where there are enough: ``analysis.figures``); None without per-step records
    or a ledger."""
    fig = ctx.figures.job
    steps = fig.account
    ledger = ctx.ledger()
    if not fig.account or not fig.step.step_ns or ledger is None or ledger.total_ns <= 0:
        return None
    micro = ctx.micro_batches() or 1
    step = fig.step.step_ns / micro
    wait = (fig.step.data_wait_ns or 0) / micro
    compute = max(1.0, step - wait)
    # a loop that waits for data: its compute, once the workers keep up, runs warm (a low quantile of the steps'
    # time outside the wait, analysis.load.step_compute); the bound takes the least any step showed
    comp = step_compute(steps, micro, ctx.thresholds.warm_compute_quantile_pct) if wait > 0 else None
    warm = min(compute, max(1.0, comp.warm_ns)) if comp is not None else compute
    handover = ctx.thresholds.dataloader_handover_ms * 1e6
    # the workers after one thread each want about the CPU they get now (their threads spun or waited)
    worker_need = min(d.workers_cpu, float(workers_after)) if pools else d.workers
    # the cores the training process gets while it computes: its CPU time over the steps' time outside the
    # data wait (getrusage), else what the samples say it got over the whole span (its waits for data included)
    readings = [r for r in loader_of(ctx).readings if r.wall_ns > r.wait_ns]  # of the account's steps
    if readings:
        main_got = max(0.05, statistics.median(r.cpu_ns / (r.wall_ns - r.wait_ns) for r in readings))
    else:
        main_got = max(0.05, d.main - d.main_wait)
    main_after = max(1.0, min(float(threads_after or d.main), cores - min(worker_need, cores - 1.0)))
    cpu_run = not ctx.has_gpu()
    # on a run without a GPU the step's compute is the training process's CPU work: it runs on the cores it
    # gets, so it shortens as they grow; on a GPU run the compute is left as it is
    compute_after = warm * min(1.0, main_got / main_after) if cpu_run else warm
    terms = [f"compute {fmt_ns(compute_after)}"]
    after = compute_after
    if wait > 0:
        load_cpu = d.workers_cpu * step  # CPU per batch now (spinning included: an upper bound)
        usable = max(1, round(cores - main_after)) if cores > main_after else 1
        after = loader_step_ns(compute_ns=compute_after, load_ns=load_cpu, load_cpu_ns=load_cpu,
                               workers=max(1, workers_after), usable_cores=usable, cores=None, main_cpu_ns=None,
                               handover_ns=handover)
        terms = [f"compute {fmt_ns(compute_after)} + hand-over {fmt_ns(handover)}",
                 f"(load CPU {fmt_ns(load_cpu)} + hand-over) ÷ {max(1, workers_after)} worker(s)",
                 f"÷ {usable} core(s) left to them"]
    after = min(after, step)
    compute_stake = compute - (min(compute_after, comp.least_ns) if comp is not None and cpu_run else compute_after)
    if pools and wait > 0:
        # spinning pools stretch the training's compute in ways its run-queue figures do not show (the planted
        # sample: 250 ms of compute per step beside them, 40-60 ms with the fix, no run-queue wait measured),
        # every step's alike: no step of the run shows what the compute needs without them (the least any showed
        # made a bound of 11.78x that --verify beat with 27.65x on Python 3.12), so all of it is at stake
        compute_stake = compute
    claims: list[tuple[Component, int | None]] = [(Component.DATA_LOADING, None)]
    if compute_stake > 0:
        # the training process's own time, outside the data wait: every host part but communication
        share = compute_stake / compute
        claims += host_claims(ledger, share)
    at_stake = wait + compute_stake
    if pools and wait > 0:
        # threads of a worker's own pool spin at OpenMP barriers while its other threads wait for a core:
        # the CPU the workers get now is mostly spinning, and says nothing of the work one thread each
        # will do (the planted sample: 1.83 s of worker CPU per batch now, ~0.1 s of step after the fix)
        model = (f"no expected gain: the workers' thread pools spin while they wait for a core, so their CPU now "
                 f"({fmt_ns(d.workers_cpu * step)} per batch) measures spinning, not the work one thread each will "
                 "do; `gpudoctor verify` measures the fix")
        return Stake(tuple(claims), at_stake, step, step, None, model)
    fraction = max(0.0, min(1.0, (step - after) / at_stake)) if at_stake > 0 else 0.0
    model = (f"step per batch = max({', '.join(terms)}) = {fmt_ns(after)} against {fmt_ns(step)} now "
             f"({'warm ' if warm < compute else ''}compute {fmt_ns(warm)} × {main_got:.2f} cores now ÷ "
             f"{main_after:.2f} after"
             + ("" if cpu_run else ", not shortened: a GPU run") + f"): {fmt_pct(100.0 * fraction)} of the "
             f"{fmt_ns(at_stake)} at stake won")
    return Stake(tuple(claims), at_stake, step, after, fraction, model)


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: one thread per DataLoader worker, and the training-process threads and
    num_workers the finding gives (the same derivation as ``check``)."""
    dl = dataloader_of(ctx, finding)
    why = no_dataloader_reason(ctx, dl)
    if why:
        return why
    cores = ctx.cpu_count()
    d = loader_of(ctx).demand
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
    assert s is not None  # Rule.needs
    cores = ctx.cpu_count()
    if cores is None or s.num_threads is None:
        return RuleResult.cannot_judge("the core count or torch's thread count was not recorded")
    dl = ctx.main_dataloader()
    workers = dl.num_workers if dl is not None else 0
    if workers == 0:
        return RuleResult.not_applicable(
            f"no DataLoader workers: {s.num_threads} intra-op threads on {cores} cores"
        )
    d = loader_of(ctx).demand
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
    st = stake(ctx, d, cores, new_workers, new_threads, pools)
    if st is None:
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
    metrics.append(Metric("at_stake_per_batch_ns", int(st.stake_ns), "ns", "data wait + compute stretched by waiting"))
    if st.expected_fraction is not None:
        metrics.append(Metric("expected_step_ns", int(st.step_after_ns), "ns", "per batch, by the model"))
    finding = ctx.finding(
        message,
        Fix(instruction, before, after),
        share_pct=None,
        confidence=Confidence.INFERRED,
        metrics=metrics,
        settings=settings,
        location=loc,
        gain_note=(f"the loop's wait for starved workers and its compute stretched by waiting for a core "
                   f"({excess_pct:.1f}% of the threads' CPU demand the cores cannot serve)"
                   + (f"; {st.model}" if st.expected_fraction is None else "")),
        claims=list(st.claims),
        ledger=ctx.ledger(),
        expected=st.expected_fraction,
        expected_note=st.model,
    )
    return RuleResult.fired(finding)


# --------------------------------------------------------------------------- `gpudoctor check`


def _watch_threads(scan: Scan, node: ast.Call, q: str) -> None:
    scan.record("set_num_threads", node, scan.sym(node.args[0]) if node.args else UNKNOWN)


def _worker_threads(src: StaticContext, fn: Function, lf: LoaderFact, workers: str) -> None:
    """A worker_init_fn that gives every worker all the cores' worth of intra-op threads."""
    if lf.worker_init is None:
        return
    ref, bound_args, bound_kwargs = lf.worker_init
    init = src.callee(fn, ref)
    if init is None:
        return
    for f in init.facts:
        if f.kind != "set_num_threads" or f.value is None or not src.active(init, f.ctx):
            continue
        r = src.resolve_bound(init, f.value, fn, bound_args, bound_kwargs)
        if r.value is not POSITIVE_VALUE:
            continue  # a fixed count may fit the machine; only "all the cores" per worker surely does not
        loc = src.location(fn, lf.site)
        line = src.line(init, f.site.line)
        src.report(
            "GD204",
            Severity.WARNING,
            f"DataLoader at {at(loc)} starts {workers} workers whose worker_init_fn `{init.name}` sets "
            f"torch.set_num_threads to the core count ({init.file}:{f.site.line}): each worker runs as "
            "many intra-op threads as the machine has cores, next to the training process's own",
            Fix(
                "Give each worker one intra-op thread (torch.set_num_threads(1) in worker_init_fn, PyTorch's "
                "default for workers) and leave the cores to the training process",
                line,
                re.sub(r"set_num_threads\(.*\)", "set_num_threads(1)", line),
            ),
            fn,
            lf.site,
            Evidence(notes=(f"worker_init_fn: {init.name} at {init.file}:{init.line}",)),
        )
        return


def static_check(src: StaticContext) -> None:
    """DataLoaders with workers whose worker_init_fn sets torch.set_num_threads to the core count."""
    for fn, lf in src.loaders():
        nw_state, nw = src.loader_value(fn, lf, "num_workers")
        positive = nw_state == "set" and nw is not None and (
            nw.value is POSITIVE_VALUE
            or (nw.known and isinstance(nw.value, int) and not isinstance(nw.value, bool) and nw.value > 0)
        )
        if positive:
            _worker_threads(src, fn, lf, str(nw.value) if nw is not None and nw.known else "its")


STATIC = StaticCheck(check=static_check, watch=Watch(calls={"torch.set_num_threads": _watch_threads}))


EXAMPLES = examples(
    bad_threads_per_worker="""\
# Every worker is told to use all the cores for its own intra-op threads.
import os

import torch
from torch.utils.data import DataLoader


def worker_init(worker_id):
    torch.set_num_threads(os.cpu_count())


loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True,
                    persistent_workers=True, worker_init_fn=worker_init)
for x, y in loader:
    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    good_one_thread_per_worker="""\
# One intra-op thread per worker (PyTorch's default); the cores stay with the training process.
import torch
from torch.utils.data import DataLoader


def worker_init(worker_id):
    torch.set_num_threads(1)


loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True,
                    persistent_workers=True, worker_init_fn=worker_init)
for x, y in loader:
    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
)


RULE = Rule(
    code="GD204",
    name="cpu-oversubscription",
    title="More busy threads than cores",
    doc=__doc__,
    check=check,
    needs={Need.SETTINGS, Need.SAMPLES},
    self_checked={Need.SAMPLES},
    needs_reasons={Need.SETTINGS: "no thread settings: analyse a run directory from `gpudoctor profile`"},
    inject=inject,
    static=STATIC,
    examples=EXAMPLES,
    not_autofix="the thread count is the script's worker_init_fn's choice, and the right one depends on the machine that trains: a change to make by hand",
)
