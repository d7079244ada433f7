"""GD202 worker-restart: DataLoader workers are started again at every epoch.

What it detects
---------------
A DataLoader with `num_workers > 0` and `persistent_workers=False` iterated
for several epochs, where the first step of each epoch waits for data much
longer than the other steps: the workers are being forked, re-import their
state and refill the prefetch queue before the first batch arrives.

Why it matters
--------------
Without persistent workers, every `iter(loader)` shuts the worker processes
down and starts new ones. With a Dataset that is expensive to construct or
copy into a worker, and with short epochs (validation loops, small datasets),
this start-up stall repeats every epoch.

How to fix
----------
Keep the workers alive across epochs.

Before:

```python
loader = DataLoader(ds, batch_size=64, num_workers=8)
for epoch in range(epochs):
    for x, y in loader: ...
```

After:

```python
loader = DataLoader(ds, batch_size=64, num_workers=8, persistent_workers=True)
for epoch in range(epochs):
    for x, y in loader: ...
```

Evidence used
-------------
Per-step records with their epoch (`steps.jsonl`: `data_wait_ns`, `epoch`),
the DataLoader's settings (`num_workers`, `persistent_workers`,
`iterations_started`) with their `file:line`. The stalls are a share of the
run's step time outside the steady steps the account of the step covers
(docs/account.md): the finding puts no share of *step* time on them and is
not in the projection; the share sets its severity.

Thresholds
----------
- `worker_startup_stall_steps` (1): the first step of an epoch must wait at
  least this many median steps longer than the other steps.
- `error_share_pct`, `warning_share_pct`: severity from the stalls' share of
  step time.

Known limits
------------
Needs the run's per-step records with epochs (`gpudoctor profile`); a bare
trace holds one profiling window and cannot show epochs. Persistent workers
keep their memory between epochs; a Dataset that changes between epochs must
do so through shared state or `worker_init_fn`.

References
----------
- `torch.utils.data.DataLoader` (`persistent_workers`):
  https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Finding, Fix, Metric
from gpudoctor.model.run import Injection, StepRecord
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
)
from gpudoctor.rules.registry import Rule


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    s = ctx.settings
    if s is None:
        return RuleResult.cannot_judge("no DataLoader settings: analyse a run directory from `gpudoctor profile`")
    if not s.dataloaders:
        return RuleResult.not_applicable("no DataLoader in this run")
    with_workers = [d for d in s.dataloaders if d.num_workers > 0]
    if not with_workers:
        return RuleResult.not_applicable("num_workers=0: no worker processes to restart (see GD201)")
    restarting = [d for d in with_workers if not d.persistent_workers]
    if not restarting:
        d = with_workers[0]
        return RuleResult.fine(f"persistent_workers=True at {location_of(d.call_site) or 'the DataLoader'}", applied=True)
    dl = max(restarting, key=lambda d: d.iterations_started)
    loc = location_of(dl.call_site)
    if dl.iterations_started < 2:
        return RuleResult.not_applicable(
            f"the DataLoader at {loc or '?'} was iterated {dl.iterations_started} time(s): no restart to pay"
        )
    steps = ctx.steps()
    if not steps:
        return RuleResult.cannot_judge("no per-step records to see the start-up stalls in")
    if all(st.epoch is None for st in steps):
        return RuleResult.cannot_judge("the per-step records carry no epoch numbers")
    epochs: dict[int, list[StepRecord]] = {}
    for st in steps:
        if st.epoch is not None:
            epochs.setdefault(st.epoch, []).append(st)
    order = sorted(epochs)
    if len(order) < 2:
        return RuleResult.not_applicable("the recorded steps cover one epoch: no restart seen")
    firsts = {e: min(epochs[e], key=lambda st: st.index) for e in order}
    first_ids = {st.index for st in firsts.values()}
    # the other steps: the steady ones (without the workers' first batches either) when there are,
    # whose median step is the one the summary prints
    others = list(ctx.steady_steps()) or [st for st in steps if st.index not in first_ids]
    base_wait = median_int(st.data_wait_ns for st in others) or 0
    step_med = median_int(st.wall_ns for st in others) or 0
    later = [firsts[e] for e in order[1:]]  # the first epoch's start-up is paid with or without persistence
    excess = [max(0, st.data_wait_ns - base_wait) for st in later]
    excess_med = median_int(excess) or 0
    total_wall = sum(st.wall_ns for st in steps)
    share = 100.0 * sum(excess) / total_wall if total_wall else 0.0
    if step_med == 0 or excess_med < t.worker_startup_stall_steps * step_med:
        return RuleResult.fine(
            f"the first step of epochs 2..{len(order)} waits {fmt_ns(excess_med)} longer for data than other steps "
            f"(under {t.worker_startup_stall_steps:g} median step of {fmt_ns(step_med)})"
        )
    message = (
        f"DataLoader workers restart every epoch: the first step of epochs 2..{len(order)} waits "
        f"{fmt_ns(excess_med)} longer for data than other steps ({fmt_pct(share)} of step time); "
        f"persistent_workers=False, num_workers={dl.num_workers} at {loc or 'the DataLoader'}"
    )
    instruction = f"Set persistent_workers=True on the DataLoader{' at ' + str(loc) if loc else ''}."
    metrics = [
        Metric("epochs", len(order), "count"),
        Metric("startup_stall_median_ns", excess_med, "ns"),
        Metric("startup_stall_total_ns", sum(excess), "ns"),
        Metric("startup_stall_share_pct", round(share, 2), "%", f"{len(steps)} steps"),
        Metric("step_median_ns", step_med, "ns"),
        Metric("iterations_started", dl.iterations_started, "count"),
    ]
    finding = ctx.finding(
        message,
        Fix(instruction, dataloader_call(dl), dataloader_call(dl, persistent_workers=True)),
        share_pct=None,
        severity_pct=share,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        settings=dataloader_settings(dl),
        location=loc,
        gain_note=f"the start-up stalls of epochs after the first: {fmt_pct(share)} of the run's step time, outside "
        "the steady steps the account covers",
    )
    return RuleResult.fired(finding)


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: persistent_workers=True at the DataLoader the finding names."""
    dl = dataloader_of(ctx, finding)
    why = no_dataloader_reason(ctx, dl)
    if why:
        return why
    return dataloader_injections(dl, {"persistent_workers": True})


RULE = Rule(
    code="GD202",
    name="worker-restart",
    title="DataLoader workers are re-created every epoch",
    doc=__doc__,
    check=check,
    needs=("steps", "settings"),
    inject=inject,
    verify_statistic="epoch",  # the restarts cost the first step of each epoch, which the steady steps leave out
)
