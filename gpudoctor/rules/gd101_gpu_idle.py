"""GD101 gpu-idle: the GPU sits idle for a large share of each step.

What it detects
---------------
The share of step time in which no kernel, memory copy or memset runs on any
stream of the GPU (the union of their intervals), over the `ProfilerStep`
windows of the trace, or over the span from the first to the last GPU activity
when the trace has no step markers. Every idle gap is attributed to what the
host was doing meanwhile (waiting for the DataLoader, blocked in a
synchronization, busy launching, a short kernel-to-kernel gap, or other host
work), and the finding names the dominant cause and the rule that covers it.

Why it matters
--------------
An idle GPU is paid for and does nothing. Idle time is the upper bound of what
every host-side fix can win: removing it entirely would speed the step up by
`1 / (1 - idle share)`.

How to fix
----------
Follow the dominant cause named in the finding:

- `dataloader`: see GD201 (more DataLoader workers, prefetching);
- `sync`: see GD102 (remove `.item()`, `.cpu()`, `print(tensor)` from the step);
- `launch_bound`: see GD103 (larger batch, `torch.compile`, CUDA graphs);
- `other`: see GD203 (Python work in the training loop).

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
windows (`TraceMetrics.utilization`). The window of every percentage is named
in the evidence (`steps` or `span`).

Thresholds
----------
- `gpu_idle_share_pct` (20): fires above this idle share of step time.
- `error_share_pct`, `warning_share_pct`: the severity scale.

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

from gpudoctor.model.findings import Confidence, Fix, Metric
from gpudoctor.model.metrics import GapCause, TraceMetrics
from gpudoctor.rules.context import RuleContext, RuleResult, fmt_ns, fmt_pct
from gpudoctor.rules.registry import Rule

#: What each idle cause means to a user, and the rule that covers it.
CAUSES: dict[GapCause, tuple[str, str]] = {
    GapCause.DATALOADER: ("waiting for the DataLoader", "GD201"),
    GapCause.SYNC: ("host synchronization", "GD102"),
    GapCause.LAUNCH_BOUND: ("kernel launch overhead", "GD103"),
    GapCause.SHORT: ("short gaps between kernels", "GD103"),
    GapCause.OTHER: ("other host work (Python, CPU ops)", "GD203"),
}

_SNIPPETS: dict[str, tuple[str, str]] = {
    "GD201": (
        "loader = DataLoader(dataset, batch_size=64)",
        "loader = DataLoader(dataset, batch_size=64, num_workers=4,\n"
        "                    persistent_workers=True, pin_memory=True)",
    ),
    "GD102": (
        "for x, y in loader:\n    loss = step(x, y)\n    print(loss.item())",
        "for i, (x, y) in enumerate(loader):\n    loss = step(x, y)\n    if i % 100 == 0:\n        print(loss.item())",
    ),
    "GD103": (
        "model = Net().cuda()",
        "model = torch.compile(Net().cuda())  # and a larger batch",
    ),
    "GD203": (
        "for x, y in loader:\n    x = torch.stack([augment(i) for i in x])",
        "# augment in Dataset.__getitem__ (runs in the DataLoader workers)\nfor x, y in loader:\n    ...",
    ),
}


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    u = ctx.util(m)
    idle_pct, wname = ctx.idle(m)
    if u is None or idle_pct is None:
        return RuleResult.cannot_judge("the trace has no GPU utilization figures")
    window = u.steps_window if wname == "steps" and u.steps_window is not None else u.span
    window_text = (
        f"the {len(m.steps)} step windows" if wname == "steps" and m.steps else "the span of GPU activity"
    )
    if idle_pct <= t.gpu_idle_share_pct:
        return RuleResult.fine(
            f"GPU {u.device} idle {fmt_pct(idle_pct)} of {window_text} (threshold {t.gpu_idle_share_pct:g}%)"
        )
    causes = sorted(u.gap_causes, key=lambda c: (-c.total_ns, c.cause.value))
    idle_ns = int(window.dur_ns * idle_pct / 100.0)
    parts = [f"{CAUSES[c.cause][0]} {c.share_of_idle_pct:.0f}%" for c in causes if c.share_of_idle_pct >= 0.5]
    cause_text = f"; idle causes: {', '.join(parts)}" if parts else ""
    message = (
        f"GPU {u.device} idle {fmt_pct(idle_pct)} of {window_text} ({fmt_ns(idle_ns)} of "
        f"{fmt_ns(window.dur_ns)}){cause_text}"
    )
    metrics = [
        Metric("gpu_idle_pct", round(idle_pct, 2), "%", wname),
        Metric("gpu_idle_ns", idle_ns, "ns", wname),
        Metric("window_ns", window.dur_ns, "ns", wname),
        Metric("gpu_idle_pct_span", round(u.idle_pct_span, 2), "%", "span"),
        Metric("idle_gaps", u.gap_count, "count", u.gaps_window.value),
        Metric("idle_gaps_over_1ms", u.gaps_over_1ms, "count", u.gaps_window.value),
    ]
    if u.idle_pct_hta is not None:
        metrics.append(Metric("gpu_idle_pct_hta", round(u.idle_pct_hta, 2), "%", "hta"))
    for c in causes:
        metrics.append(
            Metric(f"idle_{c.cause.value}_ns", c.total_ns, "ns", u.gaps_window.value)
        )
        metrics.append(
            Metric(f"idle_{c.cause.value}_share_of_idle", round(c.share_of_idle_pct, 1), "%", "idle time")
        )
    notes = [f"window: {window.description or wname}"]
    for c in causes:
        if c.total_ns > 0:
            label, code = CAUSES[c.cause]
            detail = f" (mostly {c.top_detail})" if c.top_detail else ""
            notes.append(f"{label}: {c.count} gaps, {fmt_ns(c.total_ns)}{detail}; see {code}")
    if causes and causes[0].total_ns > 0:
        label, code = CAUSES[causes[0].cause]
        instruction = (
            f"Remove the dominant idle cause, {label} ({causes[0].share_of_idle_pct:.0f}% of the idle time): "
            f"see {code} (`gpudoctor explain {code}`) and the findings of that rule in this report."
        )
        before, after = _SNIPPETS.get(code, ("", ""))
    else:
        instruction = "Find what the host does while the GPU waits: the idle gaps of the evidence show where."
        before, after = "", ""
    finding = ctx.finding(
        message,
        Fix(instruction, before, after),
        share_pct=idle_pct,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        time_ranges=ctx.gap_ranges(m),
        notes=notes,
        gain_note=f"the GPU idle time of the {wname} window; an upper bound of what host-side fixes can win",
        rank=m.rank,
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    if not ctx.has_gpu():
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    return ctx.per_trace(lambda m: _judge(ctx, m))


RULE = Rule(
    code="GD101",
    name="gpu-idle",
    title="The GPU is idle for a large share of each step",
    doc=__doc__,
    check=check,
    needs=("gpu", "trace"),
)
