"""GD104 batch-too-small: the GPU is under-used and most of its memory is free.

What it detects
---------------
The peak GPU memory of the run (from the allocator events of the trace or the
NVML samples) stays below half of the device's memory while the GPU is idle
for a large share of the step or most kernels are tiny.

Why it matters
--------------
A batch that fills a small part of the GPU gives each kernel little work: the
per-step fixed costs (launches, Python, optimizer, syncs) weigh more, and the
GPU waits between kernels. A larger batch amortizes them.

How to fix
----------
Raise the batch size until memory is better used. Scale the learning rate with
it (linear scaling) and add a warm-up; where memory runs out first, use
gradient accumulation to reach the effective batch you want.

Before:

```python
loader = DataLoader(ds, batch_size=16, shuffle=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
```

After:

```python
loader = DataLoader(ds, batch_size=128, shuffle=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1 * 128 / 16)  # linear scaling; warm up the LR
```

Evidence used
-------------
Peak memory against the device's total (`TraceMetrics.memory`, NVML
`mem_used_bytes` samples), GPU idle share (`utilization`), share of kernels
under 10 µs, and the DataLoader's `batch_size` with its call site.

Thresholds
----------
- `batch_memory_share_pct` (50): peak memory below this share of the device.
- `batch_gpu_idle_share_pct` (20): GPU idle share that counts as under-used
  (or `launch_short_kernel_share_pct` of kernels under 10 µs).
- `error_share_pct`, `warning_share_pct`: severity from the share of step time
  granted: the ledger's launch and dispatch overhead (the GPU idle time between
  kernels a larger batch fills), after GD103, which claims it first
  (docs/account.md).

Known limits
------------
The batch size is also a modelling choice: a larger batch changes the
optimization (generalization, learning-rate schedule). The rule says the
hardware has room; whether the model wants it is yours to decide. Needs memory
figures: run with NVML available or `--memory`.

References
----------
- torch-tb-profiler's "low utilization" recommendation: https://github.com/pytorch/kineto/tree/main/tb_plugin
- Goyal et al., Accurate, Large Minibatch SGD (linear scaling, warm-up): https://arxiv.org/abs/1706.02677
- NVIDIA, Deep Learning Performance guide: https://docs.nvidia.com/deeplearning/performance/index.html
"""

from __future__ import annotations

import math

from gpudoctor.model.findings import Confidence, Fix, Metric, SettingRef
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.rules.context import RuleContext, RuleResult, fmt_bytes, fmt_pct, location_of
from gpudoctor.rules.helpers import memory_peak
from gpudoctor.rules.registry import Rule


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    peak = memory_peak(ctx, m)
    if peak is None:
        return RuleResult.cannot_judge(
            "no GPU memory figures: no allocator events in the trace (profile with --memory) and no NVML samples"
        )
    if peak.pct >= t.batch_memory_share_pct:
        return RuleResult.fine(
            f"peak GPU memory {fmt_pct(peak.pct)} of the device (threshold {t.batch_memory_share_pct:g}%)",
            applied=True,
        )
    idle_pct, wname = ctx.idle(m)
    short = m.kernels.under_10us_pct if m.kernels is not None else None
    idle_under = idle_pct is not None and idle_pct >= t.batch_gpu_idle_share_pct
    short_under = short is not None and short >= t.launch_short_kernel_share_pct
    if idle_pct is None and short is None:
        return RuleResult.cannot_judge("no GPU utilization figures in the trace")
    if not (idle_under or short_under):
        return RuleResult.fine(
            f"peak memory {fmt_pct(peak.pct)} of the device, but the GPU is busy "
            f"(idle {fmt_pct(idle_pct)} of step time)"
        )
    factor = max(2, 2 ** int(math.log2(max(1.0, t.memory_near_limit_pct / max(peak.pct, 1e-9)))))
    dl = ctx.main_dataloader()
    bs = dl.batch_size if dl is not None else None
    location = location_of(dl.call_site) if dl is not None else None
    settings = [SettingRef("DataLoader.batch_size", bs, location)] if dl is not None else []
    why = f"GPU idle {fmt_pct(idle_pct)} of step time" if idle_under else f"{fmt_pct(short)} of kernels under 10 µs"
    message = (
        f"peak GPU memory {fmt_bytes(peak.peak_bytes)} is {fmt_pct(peak.pct)} of the device's "
        f"{fmt_bytes(peak.total_bytes)} while the GPU is under-used ({why})"
        + (f"; batch_size={bs}" if bs else "")
    )
    target = f"batch_size={bs * factor}" if bs else f"a batch {factor}× larger"
    instruction = (
        f"Raise the batch size toward {target} (memory grows at most linearly with the batch, so {factor}× "
        f"stays under {t.memory_near_limit_pct:g}% of the device); scale the learning rate with it and warm up; "
        "use gradient accumulation where memory ends first."
    )
    before = f"loader = DataLoader(dataset, batch_size={bs or 32})\nopt = torch.optim.SGD(model.parameters(), lr=lr)"
    after = (
        f"loader = DataLoader(dataset, batch_size={(bs or 32) * factor})\n"
        f"opt = torch.optim.SGD(model.parameters(), lr=lr * {factor})  # linear scaling, with warm-up"
    )
    metrics = [*peak.metrics()]
    if idle_pct is not None:
        metrics.append(Metric("gpu_idle_pct", round(idle_pct, 2), "%", wname))
    if short is not None:
        metrics.append(Metric("kernels_under_10us_pct", round(short, 1), "%", "kernels"))
    ledger = ctx.ledger(m)
    if ledger is not None:
        metrics.append(Metric("launch_overhead_pct", round(ledger.pct(Component.LAUNCH_OVERHEAD), 2), "%", wname))
    finding = ctx.finding(
        message,
        Fix(instruction, before, after),
        share_pct=None,
        confidence=Confidence.INFERRED,
        metrics=metrics,
        settings=settings,
        location=location,
        gain_note="the GPU idle time between kernels that larger kernels would fill (launch and dispatch overhead); "
        "an upper bound",
        rank=m.rank,
        claims=[(Component.LAUNCH_OVERHEAD, None)],
        ledger=ledger,
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    if not ctx.has_gpu():
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    return ctx.per_trace(lambda m: _judge(ctx, m))


RULE = Rule(
    code="GD104",
    name="batch-too-small",
    title="GPU memory mostly unused while the GPU is under-used",
    doc=__doc__,
    check=check,
    needs=("gpu", "memory"),
    not_injectable="a larger batch changes the optimization (learning rate, convergence): a code change to make deliberately",
)
