"""GD102 host-sync: the host blocks in synchronizations with the GPU inside the step.

What it detects
---------------
Time the training process spends blocked waiting for the GPU:
`cudaStreamSynchronize`, `cudaDeviceSynchronize`, synchronous `cudaMemcpy`,
`aten::item` / `aten::_local_scalar_dense`, `aten::nonzero`, boolean-mask
indexing. When the trace has Python stacks, the finding names the lines of
your code that caused them (`.item()`, `.cpu()`, `.tolist()`, `print(tensor)`,
`float(tensor)`, `if tensor:` …).

Why it matters
--------------
A synchronization drains the GPU's queue: the host waits until every queued
kernel has finished, then needs time to launch the next ones while the GPU has
nothing to run. The GPU idle time that follows each sync is what it costs.
A sync while the GPU is saturated costs little; the rule measures both.

How to fix
----------
Keep values on the device and bring them to the host every N steps, or
accumulate metrics as tensors.

Before:

```python
for x, y in loader:
    loss = step(x, y)
    total += loss.item()                  # blocks every step
```

After:

```python
total = torch.zeros((), device="cuda")
for i, (x, y) in enumerate(loader):
    loss = step(x, y)
    total += loss.detach()                # stays on the GPU
    if i % 100 == 0:
        print(f"mean loss {total.item() / (i + 1):.4f}")
```

Evidence used
-------------
Trace: host synchronization events and the Python frame that caused each
(`TraceMetrics.syncs`), and the GPU idle gaps attributed to syncs
(`utilization.gap_causes`). The share at stake is the GPU idle time after
syncs, the `sync_wait` part of the step's ledger (docs/account.md); the message
gives the host time blocked as well. GD102 owns that part: the sync-related
findings GD302, GD303 and GD702 show "included in GD102" for what it already
claims.

Thresholds
----------
- `sync_share_pct` (5): fires when the host is blocked in syncs above this
  share of step time.
- `error_share_pct`, `warning_share_pct`: severity from the GPU idle time the
  syncs cause.

Known limits
------------
Names Python lines only when the trace was recorded with stacks
(`gpudoctor profile` records them by default; `--no-stack` turns them off).
Some syncs are needed (gradient clipping with `error_if_nonfinite`, dynamic
shapes); the fix is to make them rarer, not always to remove them.

References
----------
- PyTorch CUDA semantics, asynchronous execution:
  https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution
- `torch.cuda.set_sync_debug_mode`: https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html
- PyTorch performance tuning guide:
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Fix, Metric, TimeRange
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.rules.context import RuleContext, RuleResult, fmt_ns, fmt_pct
from gpudoctor.rules.helpers import parse_frame
from gpudoctor.rules.registry import Rule

_BEFORE = """for x, y in loader:
    loss = step(x, y)
    total += loss.item()          # waits for the GPU every step"""
_AFTER = """total = torch.zeros((), device="cuda")
for i, (x, y) in enumerate(loader):
    loss = step(x, y)
    total += loss.detach()        # stays on the GPU
    if i % 100 == 0:
        print(total.item() / (i + 1))"""


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    s = m.syncs
    if s is None:
        return RuleResult.cannot_judge("the trace has no host-side runtime events to find synchronizations in")
    # of the window every step-time share of this trace is of (GD302 prints the same figure)
    share = ctx.trace_share(m, s.total_ns)
    if share is None:
        return RuleResult.cannot_judge("no step window to put the synchronization time in")
    if share <= t.sync_share_pct:
        return RuleResult.fine(
            f"host blocked {fmt_pct(share)} of step time in {s.count} synchronizations "
            f"(threshold {t.sync_share_pct:g}%)"
        )
    ledger = ctx.ledger(m)
    claims: list[tuple[Component, int | None]] = []
    if ledger is not None:
        lost_ns = ledger.ns(Component.SYNC_WAIT)
        at_stake = ledger.pct(Component.SYNC_WAIT)
        confidence = Confidence.MEASURED
        gain_note = "GPU idle time after synchronizations"
        claims = [(Component.SYNC_WAIT, None)]
    else:
        lost_ns = 0
        at_stake = share
        confidence = Confidence.INFERRED
        gain_note = "host time blocked in synchronizations (no ledger of the step)"
    top_frame = s.by_frame[0] if s.by_frame else None
    location = parse_frame(top_frame.name) if top_frame is not None else None
    what = ", ".join(f"{n.name} ×{n.count}" for n in s.by_name[:3])
    where = f"; most from {top_frame.name} (×{top_frame.count})" if top_frame is not None else ""
    message = (
        f"host blocked {fmt_ns(s.total_ns)} in {s.count} synchronizations, {fmt_pct(share)} of step time "
        f"({what}){where}; GPU idle after them: {fmt_pct(at_stake)} of step time"
    )
    metrics = [
        Metric("sync_share_pct", round(share, 2), "%", "steps" if m.steps else "span"),
        Metric("sync_count", s.count, "count"),
        Metric("sync_total_ns", s.total_ns, "ns"),
        Metric("gpu_idle_after_sync_ns", lost_ns, "ns"),
        Metric("gpu_idle_after_sync_pct", round(at_stake, 2), "%", "steps" if m.steps else "span"),
    ]
    notes = [f"{n.name}: {n.count} calls, {fmt_ns(n.total_ns)}" for n in s.by_name[:5]]
    notes += [f"caused at {n.name}: {n.count} syncs, {fmt_ns(n.total_ns)}" for n in s.by_frame[:5]]
    if not m.has_stacks:
        notes.append("no Python stacks in the trace: record with stacks (gpudoctor profile --stack) to name the lines")
    ranges = tuple(
        TimeRange(h.ts_ns, h.ts_ns + h.dur_ns, f"{h.name}{' at ' + h.frame if h.frame else ''}") for h in s.top[:5]
    )
    lines = ", ".join(n.name for n in s.by_frame[:3])
    instruction = (
        f"Remove the per-step synchronizations at {lines}: keep values on the GPU and read them every N steps."
        if lines
        else "Find the synchronizations (`.item()`, `.cpu()`, `print(tensor)`, `nonzero`, boolean masks) in the "
        "step and keep those values on the GPU; `torch.cuda.set_sync_debug_mode(\"warn\")` names them."
    )
    finding = ctx.finding(
        message,
        Fix(instruction, _BEFORE, _AFTER),
        share_pct=at_stake,
        confidence=confidence,
        metrics=metrics,
        time_ranges=ranges,
        notes=notes,
        location=location,
        gain_note=gain_note,
        rank=m.rank,
        claims=claims,
        ledger=ledger,
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    if not ctx.has_gpu():
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    return ctx.per_trace(lambda m: _judge(ctx, m))


RULE = Rule(
    code="GD102",
    name="host-sync",
    title="The host blocks in synchronizations during the step",
    doc=__doc__,
    check=check,
    needs=("gpu", "trace"),
    not_injectable="removing a host synchronization (.item(), .cpu(), printing a tensor) is a code change",
)
