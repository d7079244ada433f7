"""GD101 gpu-idle: the GPU sits idle for a large share of each step (the headline of the account).

What it detects
---------------
The share of step time in which no kernel, memory copy or memset runs on any
stream of the GPU (the union of their intervals), over the `ProfilerStep`
windows of the trace, or over the span from the first to the last GPU activity
when the trace has no step markers. Every idle gap is attributed to what the
host was doing meanwhile (waiting for the DataLoader, blocked in a
synchronization, busy launching, inside the optimizer, other host work, or
queued work waiting on a dependency): these are the host-side parts of the
step's ledger (docs/account.md), the same numbers the cause findings claim.
Where the account is scaled to the unprofiled step (docs/account.md, "The
accounting window"), so are its figures, and the message says so.

GD101 is the headline, not a competitor of its causes: it claims no share of
the step itself, ranks after every cause finding, and names the findings that
were granted its causes.

Why it matters
--------------
An idle GPU is paid for and does nothing. Idle time is the upper bound of what
every host-side fix can win: removing it entirely would speed the step up by
`1 / (1 - idle share)`. Faster kernels win none of it.

How to fix
----------
Fix its causes, largest first; the finding names the findings that claim them:

- waiting for the DataLoader: GD201 (more DataLoader workers, prefetching);
- host synchronizations: GD102 (remove `.item()`, `.cpu()`, `print(tensor)` from the step);
- launch and dispatch overhead: GD103 (larger batch, `torch.compile`, CUDA graphs);
- the optimizer on the host: GD404 (a fused optimizer);
- other host work: GD203 (Python work in the training loop).

Before:

```python
for x, y in loader:                      # num_workers=0, and a sync every step
    loss = loss_fn(model(x.cuda()), y.cuda())
    loss.backward(); opt.step(); opt.zero_grad()
    print(f"loss {loss.item():.4f}")
```

After:

```python
loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True)
for i, (x, y) in enumerate(loader):
    loss = loss_fn(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    if i % 100 == 0:
        print(f"loss {loss.item():.4f}")
```

Evidence used
-------------
Trace: GPU busy and idle per device, the idle gaps with their causes, the step
windows (`TraceMetrics.utilization`), and the step's ledger (`TraceMetrics.ledger`)
whose host-side parts split the idle time; each percentage names its window.

Thresholds
----------
- `gpu_idle_share_pct` (20): fires above this idle share of step time.
- `error_share_pct`, `warning_share_pct`: the severity scale, applied to the
  idle share (GD101 gains nothing itself: its causes do).

Known limits
------------
Needs a trace with GPU activity; on a CPU-only run it says so. Idle time is
not all recoverable: the data dependencies of the model may forbid some
overlap. Multi-GPU traces are judged per device; the busiest device is shown.

References
----------
- Holistic Trace Analysis, temporal breakdown and idle time:
  https://hta.readthedocs.io/en/latest/source/features/idle_time_breakdown.html
- torch-tb-profiler, GPU utilization: https://github.com/pytorch/kineto/tree/main/tb_plugin
- Amazon SageMaker Debugger, LowGPUUtilization rule:
  https://docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-profiler-rules.html
"""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.model.findings import Confidence, Fix, Metric
from gpudoctor.model.metrics import TraceMetrics
from gpudoctor.rules.account import label
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_ns, fmt_pct
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    u = ctx.util(m)
    trace_idle, wname = ctx.idle(m)
    ledger = ctx.ledger(m)
    if u is None or trace_idle is None or ledger is None:
        return RuleResult.cannot_judge("the trace has no GPU utilization figures")
    window = u.steps_window if wname == "steps" and u.steps_window is not None else u.span
    # the idle share of the process's ledger (all its traces): the figure its causes split
    idle_pct = ledger.idle_pct
    window_text = (
        f"the {len(m.steps)} step windows" if wname == "steps" and m.steps and ledger.windows == len(m.steps)
        else ledger.window if wname == "steps" else "the span of GPU activity"
    )
    if idle_pct <= t.gpu_idle_share_pct:
        return RuleResult.fine(
            f"GPU {u.device} idle {fmt_pct(idle_pct)} of {window_text} (threshold {t.gpu_idle_share_pct:g}%)"
        )
    causes = sorted((s for s in ledger.slices if s.side == "host"), key=lambda s: (-s.ns, s.component))
    idle_ns = sum(s.ns for s in causes)
    parts = [f"{label(s.component)} {s.pct:.1f}%" for s in causes if s.pct >= 0.05]
    cause_text = f"; of step time: {', '.join(parts)}" if parts else ""
    w = ledger.weight
    # an account scaled to the unprofiled step (analysis.weight.reweigh) is no longer the windows' time as
    # recorded: say so, with what they recorded (the figures must agree with the evidence's)
    scaled = (f", scaled to the unprofiled step: the windows recorded {fmt_ns(ledger.total_ns + w.removed_ns)}, "
              f"{fmt_ns(w.removed_ns)} of it the profiler's weight" if w is not None and w.scaled else "")
    message = (
        f"GPU {u.device} idle {fmt_pct(idle_pct)} of {window_text} ({fmt_ns(idle_ns)} of "
        f"{fmt_ns(ledger.total_ns)}{scaled}){cause_text}"
    )
    metrics = [
        Metric("gpu_idle_pct", round(idle_pct, 2), "%", wname),
        Metric("gpu_idle_ns", idle_ns, "ns", wname),
        Metric("window_ns", ledger.total_ns, "ns", wname),
        Metric("gpu_idle_pct_span", round(u.idle_pct_span, 2), "%", "span"),
        Metric("idle_gaps", u.gap_count, "count", u.gaps_window.value),
        Metric("idle_gaps_over_1ms", u.gaps_over_1ms, "count", u.gaps_window.value),
    ]
    if w is not None and w.scaled:
        metrics.append(Metric("window_recorded_ns", ledger.total_ns + w.removed_ns, "ns",
                              "the windows as recorded; window_ns and the idle figures are scaled to the unprofiled step"))
    if u.idle_pct_hta is not None:
        metrics.append(Metric("gpu_idle_pct_hta", round(u.idle_pct_hta, 2), "%", "hta"))
    for s in causes:
        metrics.append(Metric(f"idle_{s.component}_ns", s.ns, "ns", wname))
        metrics.append(Metric(f"idle_{s.component}_pct", round(s.pct, 2), "%", wname))
    notes = [f"window: {window.description or wname}"]
    for s in causes:
        detail = f" (mostly {s.detail})" if s.detail else ""
        notes.append(f"{label(s.component)}: {fmt_ns(s.ns)}, {fmt_pct(s.pct)} of step time{detail}")
    finding = ctx.finding(
        message,
        Fix("Fix the causes of the idle time, largest first: the idle gaps of the evidence show what the host did."),
        share_pct=None,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        time_ranges=ctx.gap_ranges(m),
        notes=notes,
        gain_note=(
            f"the GPU idle time, {fmt_pct(idle_pct)} of step time ({wname} window), is the sum of its causes: "
            "each cause finding gains its own part"
        ),
        rank=m.rank,
    )
    return RuleResult.fired(replace(finding, severity=ctx.severity(idle_pct)))


def check(ctx: RuleContext) -> RuleResult:
    return ctx.per_trace(lambda m: _judge(ctx, m))


RULE = Rule(
    code="GD101",
    name="gpu-idle",
    title="The GPU is idle for a large share of each step",
    technique="Keep the GPU busy through each step (remove what it waits for)",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.TRACE},
    not_injectable="GPU idle is the headline the other findings explain: their fixes are the ones to verify",
)
