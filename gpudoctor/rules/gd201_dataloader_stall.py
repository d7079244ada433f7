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

from __future__ import annotations

import math
import statistics

from gpudoctor.analysis.load import step_compute
from gpudoctor.analysis.loader import COMPUTING, WAITING
from gpudoctor.model.findings import Confidence, Finding, Metric
from gpudoctor.model.metrics import Component, Ledger, LedgerBasis, TraceMetrics
from gpudoctor.model.run import Injection, StepRecord
from gpudoctor.model.steady import data_wait_share_pct, median_int
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.dataloader import (
    allowed_changes,
    dataloader_injections,
    dataloader_of,
    dataloader_settings,
    no_dataloader_reason,
    worker_changes,
    workers_fix,
)
from gpudoctor.rules.dataloader_source import (
    judge_prefetch,
    judge_workers,
    no_workers,
    trainer_no_workers,
)
from gpudoctor.rules.device import device_limited
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of
from gpudoctor.rules.load_model import (
    cold_text,
    loader_of,
    memory_cap,
    plan_workers,
    threads_injections,
    threads_metrics,
    threads_text,
    wait_claims,
)
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.static_api import StaticCheck, StaticContext, examples


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
        demand = loader_of(ctx).demand
        if demand is not None and demand.tree / cores > t.oversubscription_ratio:
            return RuleResult.not_applicable(
                f"the loop waits {fmt_pct(share)} of step time for data, but the workers are short of CPU, not of "
                f"numbers: {demand.tree:.1f} runnable threads on {cores} cores (GD204); more workers would make it worse"
            )
    lf = loader_of(ctx)  # the DataLoader's load, over the account's steps (analysis.loader)
    busy, free = lf.busy, lf.free_cores
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
    settled = lf.settled_wait_ns
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
    load, main_cpu = lf.load, lf.main_cpu_ns
    main_got = main_cpu / mean_compute if main_cpu is not None else None  # the cores the compute keeps busy
    assert load is not None  # the run has a step time
    if main_cpu is not None:
        main_cpu *= compute_ns / mean_compute  # the training's own CPU per batch shrinks with its compute
    # without a GPU the step's compute is the training process's intra-op threads: workers share their cores
    threads_now = ctx.settings.num_threads if ctx.settings is not None and not ctx.has_gpu() else None
    on_gpu = ledger is not None and ledger.basis == LedgerBasis.GPU
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
    kind_text = load.kind_text
    message = (
        f"the loop waits {fmt_pct(share)} of step time for the next batch ({per})"
        + gpu_wait
        + (f"; DataLoader{where} has num_workers={workers}" if dl is not None else "")
        + (f"; {kind_text}" if kind_text else "")
        + (f"; {busy} (GD205)" if busy else "")
    )
    changes = allowed_changes(ctx, dl, worker_changes(ctx, dl, n))
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
    instruction += threads_text(plan, threads_now, cores) if more else ""
    notes = ["first step of each epoch, and each worker's first batch where workers start, left out "
             "(worker start-up is GD202)", *load.evidence]
    if comp is not None and comp.cold_ratio >= t.cold_compute_ratio:
        notes.append(cold_text(comp, warm))
    if busy and load.kind != WAITING:
        notes.append(f"sized to the cores other processes left free ({free:.2f} of {cores}): {busy}"
                     if free is not None else busy)
    if not plan.hides and load.kind != WAITING:
        hot = load.hot_text
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
        *(threads_metrics(plan, threads_now) if more else ()),
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
    fix = workers_fix(ctx, dl, instruction, changes, notes)
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
        claims=wait_claims(ledger, cold_ns / mean_compute),
        ledger=ledger,
        # more workers: the model's; at the cap, a deeper queue and cheaper loading, which no model sizes
        expected=plan.expected_fraction if more else None,
        expected_note=f"{n} worker{'' if n == 1 else 's'} ({load.kind} load): {plan.model}" if more else "",
    )
    return RuleResult.fired(finding)


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
    fix = workers_fix(ctx, dl, instruction, changes, notes)
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
    return (*dataloader_injections(dl, allowed_changes(ctx, dl, worker_changes(ctx, dl, n))),
            *threads_injections(finding))


def check(ctx: RuleContext) -> RuleResult:
    if ctx.steps():
        return _from_steps(ctx)
    if ctx.metrics:
        return ctx.per_trace(lambda m: _from_trace(ctx, m))
    return RuleResult.cannot_judge("no per-step records and no trace: nothing says how long the loop waited for data")


# --------------------------------------------------------------------------- `gpudoctor check`


def static_check(src: StaticContext) -> None:
    for fn, lf in src.loaders():
        no_workers(src, fn, lf)
    for fn, f in src.facts("hf_loader"):
        if src.active(fn, f.ctx):
            trainer_no_workers(src, fn, f)


STATIC = StaticCheck(
    check=static_check,
    judges={"dataloader-workers": judge_workers, "prefetch": judge_prefetch},
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
