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

Expected gain
-------------
Without the syncs the host no longer waits for the queue to drain: it runs
ahead and launches the next work while the GPU still runs the last. A step then
takes the longer of the GPU's busy time and the host's own time (today's step
less the time the host sat blocked in syncs), so the expected gain is today's
step less that, at most the share at stake:
`step_after = max(GPU busy, step − blocked)`. When the host's own time exceeds
the GPU's, removing syncs wins little: the loop is launch- or Python-bound
(GD103, GD203) and those fixes come first. Source: CUDA's asynchronous
execution model (PyTorch CUDA semantics, below).

Evidence used
-------------
Trace: host synchronization events and the Python frame that caused each
(`TraceMetrics.syncs`), and the step's ledger (docs/account.md). The share at
stake is the GPU idle time in and after syncs: the `sync_wait` part (instants
the host was still blocked while the GPU had nothing to run) and, of the
`launch_overhead` and `other_cpu` parts, the instants of the idle gaps a sync
began (the queue drained; `after_sync_ns`), which GD103 and GD203 own first
where they fire. The message gives the host time blocked as well. GD102 owns
`sync_wait`: the sync-related findings GD302, GD303 and GD702 show "included in
GD102" for what it already claims.

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
from gpudoctor.rules.speedups import runs_ahead_fraction

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
    expected = expected_note = None
    if ledger is not None:
        # the GPU idle inside the syncs, and the drain after them: the host's launches and Python
        # until the GPU had work again (the parts' after_sync_ns, GD103 and GD203 own the rest)
        drained = {c: (ledger.get(c).after_sync_ns if ledger.get(c) is not None else 0) for c in _DRAIN}
        lost_ns = ledger.ns(Component.SYNC_WAIT) + sum(drained.values())
        at_stake = 100.0 * lost_ns / ledger.total_ns if ledger.total_ns else 0.0
        confidence = Confidence.MEASURED
        gain_note = "GPU idle time in and after synchronizations (the queue drained)"
        claims = [(Component.SYNC_WAIT, None), *((c, ns) for c, ns in drained.items() if ns > 0)]
        expected, expected_note = _expected(ledger, share, at_stake)
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
        expected=expected,
        expected_note=expected_note or "",
    )
    return RuleResult.fired(finding)


_DRAIN = (Component.LAUNCH_OVERHEAD, Component.OTHER_CPU)


def _expected(ledger, blocked_pct: float, at_stake_pct: float) -> tuple[float | None, str]:
    """The "Expected gain" model: the host runs ahead once it no longer blocks (``rules.speedups``)."""
    busy = sum(sl.pct for sl in ledger.slices if sl.side == "device")
    return runs_ahead_fraction(busy, blocked_pct, at_stake_pct)


def check(ctx: RuleContext) -> RuleResult:
    if not ctx.has_gpu():
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    return ctx.per_trace(lambda m: _judge(ctx, m))


RULE = Rule(
    code="GD102",
    name="host-sync",
    title="The host blocks in synchronizations during the step",
    technique="No host-device synchronization inside the step (.item(), .cpu(), printing tensors)",
    doc=__doc__,
    check=check,
    needs=("gpu", "trace"),
    not_injectable="removing a host synchronization (.item(), .cpu(), printing a tensor) is a code change",
)
