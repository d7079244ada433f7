"""GD201 dataloader-stall: the training loop waits for the next batch.

What it detects
---------------
The time each step spends blocked in `DataLoader.__next__` waiting for the
next batch, as a share of step time: from gpudoctor's per-step records (every
step of the run), or from the `enumerate(DataLoader)#…__next__` events of a
trace. The first step of each epoch is left out (worker start-up is GD202), and
with N workers the steps that receive the first N batches of an epoch whose
workers start (the first epoch; every epoch without `persistent_workers`): each
is its own worker's first batch, and waits for that worker to start.
With gradient accumulation a step is one optimizer step: its wait is that of
all its micro-batches, judged against the whole step, and the finding gives the
wait per batch too.

The share it gains is the `data_loading` part of the step's ledger
(docs/account.md): on a GPU run, the time the GPU sat idle while the loop
waited for data (a wait while the GPU still ran queued work costs nothing); on
a CPU run, the wait itself. A bare trace names the DataLoader's iterator:
`_SingleProcessDataLoaderIter` means the main process loads every batch (set
`num_workers`), `_MultiProcessingDataLoaderIter` means workers exist and still
cannot keep up (more workers if cores allow, else a cheaper pipeline).

Why it matters
--------------
While the loop waits for data, neither the CPU's compute threads nor the GPU
do useful work. With `num_workers=0` the main process loads and transforms
every batch itself, serially with the training step.

How to fix
----------
Load batches in worker processes, in parallel with the step. The finding
derives a `num_workers` value from the measured per-batch load time, the
compute time of a step and the cores available; also keep workers alive
across epochs (`persistent_workers=True`), and raise `prefetch_factor` when
load times vary.

Before:

```python
loader = DataLoader(ds, batch_size=64, shuffle=True)
```

After:

```python
loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=4,
                    persistent_workers=True, prefetch_factor=4, pin_memory=True)
```

Evidence used
-------------
Per-step records (`steps.jsonl`: `wall_ns`, `data_wait_ns`, `micro_batches`), or the trace's
DataLoader share; the DataLoader's settings (`num_workers`, `prefetch_factor`,
`persistent_workers`, `pin_memory`) with their `file:line`; the cores
available (`settings.cpu_count`). With workers, the run-queue figures of the
process tree (see GD204): when the workers are short of CPU rather than of
numbers, the rule leaves the case to GD204, since more workers would only
deepen the oversubscription.

Thresholds
----------
- `dataloader_wait_share_pct` (5): fires above this share of step time.
- `dataloader_reserved_cores` (1): cores left to the training process when
  deriving `num_workers`.
- `dataloader_spare_workers_count` (1): workers added for load-time jitter.
- `dataloader_handover_ms` (1): what receiving one batch from a worker
  costs the loop; a mean wait per batch under it is not a stall workers can
  win back (the rule says so and stays silent).
- `error_share_pct`, `warning_share_pct`: the severity scale.

Known limits
------------
The suggested `num_workers` assumes the per-batch load time stays the same in
a worker and that workers scale until the cores run out; disk or network
bandwidth may end the scaling first. If the derived value exceeds the cores,
the data pipeline itself must get cheaper (cache decoded data, move
augmentation to the GPU). Even workers that keep up cost the loop the receipt
of each batch (unpickling, mapping its shared memory): about 1–3 ms on a small
2-core VM, which on steps under ~40 ms alone crosses the 5% threshold. A mean
wait per batch under `dataloader_handover_ms` is therefore not reported: on a
fast host, where a hand-over costs a few hundred µs, a loader of 0.5–1 ms per
batch that workers could still halve goes unreported.

References
----------
- PyTorch, single- and multi-process data loading:
  https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading
- PyTorch performance tuning guide:
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
- torch-tb-profiler's DataLoader recommendation (5% of step time):
  https://github.com/pytorch/kineto/tree/main/tb_plugin
"""

from __future__ import annotations

import math

from gpudoctor.model.findings import Confidence, Finding, Fix, Metric
from gpudoctor.model.metrics import Component, Ledger, TraceMetrics
from gpudoctor.model.run import DataLoaderSetting, Injection
from gpudoctor.rules.context import (
    RuleContext,
    RuleResult,
    fmt_ns,
    fmt_pct,
    location_of,
    median_int,
)
from gpudoctor.rules.helpers import (
    dataloader_call,
    dataloader_injections,
    dataloader_of,
    dataloader_settings,
    no_dataloader_reason,
    runnable_demand,
)
from gpudoctor.rules.registry import Rule


def suggest_num_workers(
    dl: DataLoaderSetting | None,
    wait_ns: int,
    step_ns: int,
    cores: int | None,
    reserved_cores: int,
    spare: int = 0,
) -> tuple[int, int, int, str]:
    """(suggested num_workers, estimated per-batch load time, compute time per step, how it was derived).

    With ``num_workers=0`` the main process loads each batch inside ``__next__``: the
    per-batch load time is the wait itself. With ``n`` workers that cannot keep up, they
    deliver ``n`` batches per load time, one per step: load ≈ n × step time. Enough
    workers deliver one batch per compute time: ``ceil(load / compute)``, plus ``spare``
    workers for load-time jitter; capped at the cores left after the training process.
    """
    compute_ns = max(step_ns - wait_ns, 1)
    workers = dl.num_workers if dl is not None else 0
    load_ns = wait_ns if workers == 0 else workers * step_ns
    needed = max(1, math.ceil(load_ns / compute_ns)) + spare
    if workers > 0:
        needed = max(needed, workers + 1)
    how = f"per-batch load {fmt_ns(load_ns)} ÷ compute {fmt_ns(compute_ns)} per step"
    if spare:
        how += f", +{spare} spare"
    if cores is not None:
        cap = max(1, cores - reserved_cores)
        if needed > cap:
            how += f", capped at {cap} ({cores} cores, {reserved_cores} left to the training process)"
            needed = cap
        else:
            how += f", within {cores} cores"
    return needed, load_ns, compute_ns, how


def _changes(ctx: RuleContext, dl: DataLoaderSetting | None, n: int) -> dict[str, object]:
    """The DataLoader arguments the fix sets, for ``n`` suggested workers."""
    workers = dl.num_workers if dl is not None else None
    changes: dict[str, object] = {"num_workers": n, "persistent_workers": True}
    if workers and workers >= n:
        # already as many workers as cores allow: deepen the queue instead
        changes = {"prefetch_factor": (dl.prefetch_factor or 2) * 2, "persistent_workers": True}
    elif workers:
        changes["prefetch_factor"] = max(dl.prefetch_factor or 2, 2)
    if ctx.has_gpu() and dl is not None and not dl.pin_memory:
        changes["pin_memory"] = True
    return changes


def _from_steps(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    steps = ctx.steady_steps()
    share = ctx.data_wait_share_pct()
    dl = ctx.main_dataloader()
    if share is None:
        return RuleResult.cannot_judge("no per-step records")
    wait_med = median_int(s.data_wait_ns for s in steps) or 0
    step_med = median_int(s.wall_ns for s in steps) or 0
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
    cores = ctx.cpu_count()
    if dl is not None and dl.num_workers and cores:
        demand = runnable_demand(ctx)
        if demand is not None and demand.tree / cores > t.oversubscription_ratio:
            return RuleResult.not_applicable(
                f"the loop waits {fmt_pct(share)} of step time for data, but the workers are short of CPU, not of "
                f"numbers: {demand.tree:.1f} runnable threads on {cores} cores (GD204); more workers would make it worse"
            )
    workers = dl.num_workers if dl is not None else None
    # the mean, not the median: a loader that falls behind now and then waits long on a few steps
    per_batch_ns = sum(s.data_wait_ns for s in steps) // max(1, len(steps) * micro)
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
    # one batch at a time: with gradient accumulation a step receives `micro` batches
    n, load_ns, compute_ns, how = suggest_num_workers(
        dl,
        wait_med // micro,
        step_med // micro,
        cores,
        t.dataloader_reserved_cores,
        t.dataloader_spare_workers_count,
    )
    if micro > 1:
        per = (f"{fmt_ns(wait_med)} of a {fmt_ns(step_med)} optimizer step over its {micro} micro-batches, "
               f"{fmt_ns(wait_med // micro)} per batch; median over {len(steps)} steps")
    else:
        per = f"{fmt_ns(wait_med)} of a {fmt_ns(step_med)} step, median over {len(steps)} steps"
    ledger = ctx.ledger()
    gpu_wait = _gpu_wait_text(ledger)
    message = (
        f"the loop waits {fmt_pct(share)} of step time for the next batch ({per})"
        + gpu_wait
        + (f"; DataLoader{where} has num_workers={workers}" if dl is not None else "")
    )
    changes = _changes(ctx, dl, n)
    extra = ""
    if workers and workers >= n:
        pf = changes["prefetch_factor"]
        extra = f"; the cores allow no more workers than {workers}: raise prefetch_factor to {pf} and make loading cheaper"
    args = ", ".join(f"{k}={v}" for k, v in changes.items())
    instruction = f"Set {args} on the DataLoader{where} ({how}){extra}."
    if cores is not None and math.ceil(load_ns / compute_ns) > max(1, cores - t.dataloader_reserved_cores):
        extra_note = "loading one batch takes longer than all cores can hide: cache decoded data or move augmentation to the GPU"
    else:
        extra_note = ""
    metrics = [
        Metric("data_wait_share_pct", round(share, 2), "%", f"{len(steps)} steps"),
        Metric("data_wait_median_ns", wait_med, "ns"),
        Metric("step_median_ns", step_med, "ns"),
        Metric("per_batch_load_ns", load_ns, "ns"),
        Metric("compute_per_step_ns", compute_ns, "ns"),
        Metric("suggested_num_workers", n, "count"),
    ]
    if cores is not None:
        metrics.append(Metric("cpu_count", cores, "count"))
    if micro > 1:
        metrics.append(Metric("micro_batches_per_step", micro, "count", "backward() calls per optimizer step"))
        metrics.append(Metric("data_wait_per_batch_ns", wait_med // micro, "ns"))
    notes = ["first step of each epoch, and each worker's first batch where workers start, left out "
             "(worker start-up is GD202)"]
    if extra_note:
        notes.append(extra_note)
    finding = ctx.finding(
        message,
        Fix(instruction, dataloader_call(dl), dataloader_call(dl, **changes)),
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        settings=dataloader_settings(dl) if dl is not None else (),
        notes=notes,
        location=loc,
        gain_note=(
            "GPU idle time while the loop waited for data; workers hide it behind the step"
            if ledger is not None and ledger.basis == "gpu"
            else "time the loop waits for data; workers hide it behind the step"
        ),
        claims=[(Component.DATA_LOADING, None)],
        ledger=ledger,
    )
    return RuleResult.fired(finding)


def _gpu_wait_text(ledger: Ledger | None) -> str:
    if ledger is None or ledger.basis != "gpu":
        return ""
    return (
        f"; the GPU sat idle waiting for it {fmt_pct(ledger.pct(Component.DATA_LOADING))} of the "
        f"{ledger.window} (what workers can win back)"
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
            if ledger.basis == "gpu"
            else f"DataLoader {fmt_pct(share)} of step time in the trace (threshold {t.dataloader_wait_share_pct:g}%)"
            f"{with_workers}",
            applied=it == "multi-process",
        )
    dl = ctx.main_dataloader()
    loc = location_of(dl.call_site) if dl is not None else None
    what = "step time" if m.steps else "the trace (no step markers)"
    waits = "the GPU sits idle waiting for the next batch" if ledger.basis == "gpu" else "the loop waits for the next batch"
    if it == "multi-process":
        message = (
            f"{waits} {fmt_pct(share)} of {what} although the DataLoader has worker processes "
            f"({_MULTI}): they cannot keep up (window: {window})"
        )
        instruction = (
            "The DataLoader already loads in workers and they still fall behind: raise num_workers if cores are "
            "free (one per batch load time ÷ step compute time, up to the cores less one) and prefetch_factor, "
            "keep persistent_workers=True; if the cores are busy, make each batch cheaper (cache decoded data, "
            "move augmentation to the GPU). The trace does not record num_workers; `gpudoctor profile` derives a "
            "value from the settings."
        )
        after = dataloader_call(dl, num_workers=8, prefetch_factor=4, persistent_workers=True)
    else:
        single = f" in the main process ({_SINGLE}: num_workers=0)" if it == "single-process" else ""
        message = f"{waits} {fmt_pct(share)} of {what}: the DataLoader loads{single or ' the batches'} (window: {window})"
        instruction = (
            "Load batches in worker processes: set num_workers > 0 (one per batch load time ÷ step compute time, "
            "up to the cores less one), persistent_workers=True, pin_memory=True. The trace does not record the "
            "DataLoader's settings; `gpudoctor profile` derives a value from them."
        )
        after = dataloader_call(dl, num_workers=4, persistent_workers=True)
    part = ledger.get(Component.DATA_LOADING)
    notes = [f"iterator: {part.detail}"] if part is not None and part.detail else []
    finding = ctx.finding(
        message,
        Fix(instruction, dataloader_call(dl), after),
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
            if ledger.basis == "gpu"
            else "time in DataLoader.__next__"
        ),
        rank=m.rank,
        claims=[(Component.DATA_LOADING, None)],
        ledger=ledger,
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
    return dataloader_injections(dl, _changes(ctx, dl, n))


def check(ctx: RuleContext) -> RuleResult:
    if ctx.steps():
        return _from_steps(ctx)
    if ctx.metrics:
        return ctx.per_trace(lambda m: _from_trace(ctx, m))
    return RuleResult.cannot_judge("no per-step records and no trace: nothing says how long the loop waited for data")


RULE = Rule(
    code="GD201",
    name="dataloader-stall",
    title="The training loop waits for the next batch",
    doc=__doc__,
    check=check,
    needs=("steps",),
    inject=inject,
)
