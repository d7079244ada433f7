"""GD603 straggler: one rank is consistently slower and every other rank waits for it.

What it detects
---------------
A rank whose own work per step is consistently above the other ranks'. In DDP
every rank's step lasts as long as the slowest's: the others wait in the
all-reduce. So the rule compares each rank's **work** per profiled step (step
time minus exposed communication, GD602), step by step on the ProfilerStep
numbers, and names the slowest rank when the others wait for it at least
`straggler_delay_share_pct` of the step, in at least `straggler_consistency_pct`
of the steps, and its excess stands out of the others' own variation.
Without traces with collectives from two or more ranks it compares step wall
times (steps.jsonl), which cannot see a straggler behind a per-step all-reduce,
and says so instead of passing the run.

Why it matters
--------------
The job runs at its slowest rank's speed: every step, the N-1 others idle for
the straggler's excess.

How to fix
----------
Find what that rank does that the others do not, and even it out:

- work one rank does in the step (logging, evaluation on rank 0): do it rarely;
- uneven data (`DistributedSampler`, length-bucketed batches, `drop_last=True`);
- a slower input pipeline, device or host on that rank (fewer workers, a slower
  disk, a throttled GPU, another process on its cores, a NUMA-remote CPU).

Before:

```python
for step, (x, y) in enumerate(loader):
    train_step(model, x, y)
    if rank == 0:
        log_metrics(model, val_loader)   # every step, on one rank: the others wait
```

After:

```python
for step, (x, y) in enumerate(loader):
    train_step(model, x, y)
    if rank == 0 and step % 500 == 0:  # rarely; or in a background thread
        log_metrics(model, val_loader)
```

Evidence used
-------------
Trace: every rank's ProfilerStep windows and the exposed communication inside
each (`TraceMetrics.comm[].per_step`); run directory: every rank's step
records (`steps.rank<R>.jsonl`). The per-rank table of the report
(`Report.ranks`) shows the same figures. The straggler's excess over the
others' median, as a share of the step, is what they wait: time in *their*
ledgers, so the finding claims no part of its own; the share sets its severity.

Thresholds
----------
- `straggler_delay_share_pct` (5): the others wait for the slowest rank at
  least this share of the step.
- `straggler_consistency_pct` (80): ... in at least this share of the steps.
- `straggler_min_steps` (3): fewer compared steps cannot show a pattern.
- `straggler_excess_to_jitter_ratio` (3): ... and its excess is this many times
  the others' step-to-step variation (median absolute deviation).
- `error_share_pct`, `warning_share_pct`: severity from the waiting share.

Known limits
------------
Needs traces of two or more ranks of one job, with collectives (`gpudoctor
profile --nproc-per-node N`, or `analyze` on a folder of per-rank traces),
matched by ProfilerStep numbers. It names the rank, not the cause (its trace,
`gpudoctor view`, shows where the time goes). A rank slow only now and then (a
periodic checkpoint) is not flagged.

References
----------
- Holistic Trace Analysis, straggler and communication–computation overlap analysis:
  https://hta.readthedocs.io/en/latest/
- PyTorch DDP design: https://pytorch.org/docs/stable/notes/ddp.html
- `DistributedSampler`: https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Fix, Metric
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.distributed import figures, is_distributed
from gpudoctor.rules.formatting import fmt_ns, fmt_pct
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult

_BEFORE = """for step, (x, y) in enumerate(loader):
    train_step(model, x, y)
    if rank == 0:
        log_metrics(model, val_loader)   # every step, on one rank: the others wait"""
_AFTER = """for step, (x, y) in enumerate(loader):
    train_step(model, x, y)
    if rank == 0 and step % 500 == 0:    # rarely; or in a background thread
        log_metrics(model, val_loader)"""


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    fig = figures(ctx)
    s = fig.summary
    if s is None:
        if is_distributed(ctx):
            return RuleResult.cannot_judge("no per-rank steps or traces: pass every rank's traces or run directory")
        return RuleResult.not_applicable("single process: no ranks to compare")
    if s.ranks < 2 or s.slowest_rank is None:
        of = f" of {s.world_size}" if s.world_size else ""
        return RuleResult.cannot_judge(
            f"{s.ranks} rank{'' if s.ranks == 1 else 's'}{of} with steps to compare: a straggler needs two or more "
            "(pass every rank's trace, or profile with --nproc-per-node)"
        )
    basis = "work per step (step time minus exposed communication)" if s.basis == "work" else "step time"
    rows = {r.rank: r for r in fig.rows if r.world_size == s.world_size}
    slow = rows.get(s.slowest_rank)
    consistency = (
        f"behind by {t.straggler_delay_share_pct:g}% of the step or more in {s.slowest_in_steps} of "
        f"{s.compared_steps} compared steps"
    )
    if s.straggler_rank is None:
        reason = (
            f"rank {s.slowest_rank} is the slowest by {fmt_ns(s.slowest_excess_ns)} per step "
            f"({fmt_pct(s.slowest_excess_pct)} of step time, threshold {t.straggler_delay_share_pct:g}%; "
            f"{consistency}, {t.straggler_consistency_pct:g}% needed"
            + (f"; the others vary by {fmt_ns(s.jitter_ns)} from step to step, {t.straggler_excess_to_jitter_ratio:g}× "
               "that needed" if s.jitter_ns is not None else "")
            + f") on {basis} across {s.ranks} ranks"
        )
        if s.basis == "step":
            return RuleResult.cannot_judge(
                reason + "; without traces of two or more ranks with collectives a straggler behind a "
                "per-step all-reduce does not show in step times"
            )
        return RuleResult.fine(reason)
    imbalance = s.work_imbalance if s.basis == "work" else s.step_imbalance
    message = (
        f"rank {s.straggler_rank} is the straggler: its {basis} is {fmt_ns(s.slowest_excess_ns)} above the "
        f"{'other rank' if s.ranks == 2 else f'median of the other {s.ranks - 1} ranks'}, who "
        f"wait{'s' if s.ranks == 2 else ''} for it {fmt_pct(s.slowest_excess_pct)} of every "
        f"step ({consistency}"
        + (f"; imbalance max/median {imbalance:.2f}×" if imbalance is not None else "")
        + ")"
    )
    metrics = [
        Metric("straggler_rank", s.straggler_rank),
        Metric("straggler_excess_per_step_ns", s.slowest_excess_ns, "ns"),
        Metric("straggler_delay_pct", s.slowest_excess_pct, "%", "steps"),
        Metric("slowest_in_steps", s.slowest_in_steps, "count"),
        Metric("compared_steps", s.compared_steps, "count"),
        Metric("ranks_compared", s.ranks, "count"),
        Metric("basis", s.basis),
    ]
    if s.jitter_ns is not None:
        metrics.append(Metric("others_jitter_ns", s.jitter_ns, "ns", "median absolute deviation"))
    if s.work_imbalance is not None:
        metrics.append(Metric("work_imbalance", s.work_imbalance, "ratio", "max / median"))
    if s.step_imbalance is not None:
        metrics.append(Metric("step_imbalance", s.step_imbalance, "ratio", "max / median"))
    notes = []
    for r in sorted(rows.values(), key=lambda r: r.rank):
        value = r.work_median_ns if s.basis == "work" else r.step_median_ns
        exposed = f", exposed communication {fmt_pct(r.comm_exposed_pct)}" if r.comm_exposed_pct is not None else ""
        notes.append(f"rank {r.rank}: {'work' if s.basis == 'work' else 'step'} {fmt_ns(value)} per step{exposed}")
    notes.extend(s.notes)
    if slow is not None and slow.traces:
        notes.append(f"rank {s.straggler_rank}'s trace(s): {', '.join(slow.traces[:4])} (`gpudoctor view` shows where its time goes)")
    finding = ctx.finding(
        message,
        Fix(
            f"Find what rank {s.straggler_rank} does that the other ranks do not (work only it does in the step, "
            "uneven data shards or lengths, a slower input pipeline, a throttled or shared device) and even it out.",
            _BEFORE,
            _AFTER,
        ),
        share_pct=None,
        severity_pct=s.slowest_excess_pct,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        notes=notes[:24],
        gain_note=f"the other ranks wait for it {fmt_pct(s.slowest_excess_pct)} of every step (its excess over "
        "their median): time in their ledgers, not in its own",
        rank=s.straggler_rank,
    )
    return RuleResult.fired(finding)


RULE = Rule(
    code="GD603",
    name="straggler",
    title="One rank is consistently slower and the others wait for it",
    technique="Balance the work across ranks",
    doc=__doc__,
    check=check,
    needs={Need.TRACE},
    self_checked={Need.TRACE},
    not_injectable="trials of distributed jobs are not supported",
)
