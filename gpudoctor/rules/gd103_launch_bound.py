"""GD103 launch-bound: the kernels are so short that the host cannot launch them fast enough.

What it detects
---------------
Most kernels run for less than 10 µs and a launch call (`cudaLaunchKernel`
and friends) takes about as long as a typical kernel runs: the mean launch
call against the median kernel (Holistic Trace Analysis's kernel launch
statistics compare each kernel with its launch). The GPU then waits for the
next launch between kernels.

Why it matters
--------------
Each launch costs the host a few microseconds; a kernel shorter than that
leaves the GPU idle until the next one arrives. The step time is then set by
Python and launch overhead, not by the GPU, and a faster GPU does not help.

How to fix
----------
Give each kernel more work or launch fewer of them: a larger batch size,
`torch.compile` (fuses elementwise kernels; `mode="reduce-overhead"` adds CUDA
graphs), CUDA graphs directly, a fused or foreach optimizer (see GD404).

Before:

```python
model = Net().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(ds, batch_size=8)
```

After:

```python
model = torch.compile(Net().cuda())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
loader = DataLoader(ds, batch_size=64)   # scale the learning rate with the batch
```

Evidence used
-------------
Trace: kernel count and duration distribution, share of kernels under 10 µs,
the launch calls' count and time against the kernels' (`TraceMetrics.kernels`),
and the GPU idle time attributed to launch-bound and short gaps.

Thresholds
----------
- `launch_short_kernel_share_pct` (50): share of kernels (by count) under 10 µs.
- `launch_to_kernel_min_ratio` (0.8): mean launch call / median kernel.
- `launch_gap_min_share_pct` (1): the GPU idle time in launch-bound and short
  gaps must reach this share of step time.
- `error_share_pct`, `warning_share_pct`: severity from the GPU idle time in
  launch-bound and short gaps.

Known limits
------------
The 10 µs cut is fixed by the metric. A model that is genuinely small may stay
launch-bound whatever is done; then CUDA graphs are the remaining lever.

References
----------
- Holistic Trace Analysis, CUDA kernel launch statistics:
  https://hta.readthedocs.io/en/latest/source/features/cuda_kernel_launch_stats.html
- `torch.compile`: https://pytorch.org/docs/stable/generated/torch.compile.html
- CUDA graphs in PyTorch: https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Fix, Metric, SettingRef
from gpudoctor.model.metrics import GapCause, TraceMetrics
from gpudoctor.rules.context import RuleContext, RuleResult, fmt_ns, fmt_pct, location_of
from gpudoctor.rules.registry import Rule


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    k = m.kernels
    if k is None or k.count == 0:
        return RuleResult.cannot_judge("no kernels in the trace")
    short = k.under_10us_pct
    if short < t.launch_short_kernel_share_pct:
        return RuleResult.fine(
            f"{fmt_pct(short)} of {k.count} kernels are under 10 µs (threshold {t.launch_short_kernel_share_pct:g}%)"
        )
    if not k.launch_count or not k.launch_total_ns or not k.p50_ns:
        return RuleResult.cannot_judge(
            f"{fmt_pct(short)} of kernels are under 10 µs, but the trace has no launch calls to compare them with"
        )
    # A typical launch call against a typical kernel (HTA compares each kernel with its launch);
    # the ratio of totals is kept as evidence: a few long kernels dominate it.
    launch_mean_ns = k.launch_total_ns / k.launch_count
    ratio = launch_mean_ns / k.p50_ns
    if ratio < t.launch_to_kernel_min_ratio:
        return RuleResult.fine(
            f"{fmt_pct(short)} of kernels are under 10 µs but a launch call takes {fmt_ns(launch_mean_ns)}, "
            f"{ratio:.2f}× the median kernel (threshold {t.launch_to_kernel_min_ratio:g}×): the host keeps up"
        )
    u = ctx.util(m)
    lost_ns = ctx.gap_cause_ns(m, GapCause.LAUNCH_BOUND, GapCause.SHORT)
    if u is not None and u.gap_causes:
        at_stake = ctx.trace_share(m, lost_ns)
        confidence = Confidence.MEASURED
        gain_note = "GPU idle time in launch-bound and short gaps"
        if at_stake is not None and at_stake < t.launch_gap_min_share_pct:
            return RuleResult.fine(
                f"{fmt_pct(short)} of kernels are under 10 µs and launches are slow ({ratio:.2f}×), but launch gaps "
                f"idle the GPU only {fmt_pct(at_stake)} of step time (threshold {t.launch_gap_min_share_pct:g}%)"
            )
    else:
        idle_pct, _ = ctx.idle(m)
        at_stake = idle_pct
        confidence = Confidence.INFERRED
        gain_note = "GPU idle share (no idle-gap causes in the trace)"
    message = (
        f"launch-bound: {fmt_pct(short)} of {k.count} kernels run under 10 µs (median {fmt_ns(k.p50_ns)}) while a "
        f"launch call takes {fmt_ns(launch_mean_ns)} ({ratio:.2f}×); GPU idle in launch gaps {fmt_pct(at_stake)} "
        "of step time"
    )
    metrics = [
        Metric("kernel_count", k.count, "count"),
        Metric("kernels_under_10us_pct", round(short, 1), "%", "kernels"),
        Metric("kernel_median_ns", k.p50_ns, "ns"),
        Metric("kernel_total_ns", k.total_ns, "ns"),
        Metric("launch_count", k.launch_count, "count"),
        Metric("launch_total_ns", k.launch_total_ns, "ns"),
        Metric("launch_mean_ns", int(launch_mean_ns), "ns"),
        Metric("launch_to_median_kernel_ratio", round(ratio, 3), "ratio"),
        Metric("gpu_idle_launch_ns", lost_ns, "ns"),
    ]
    if k.launch_to_kernel_ratio is not None:
        metrics.append(Metric("launch_to_kernel_time_ratio", round(k.launch_to_kernel_ratio, 3), "ratio"))
    if k.median_launch_delay_ns is not None:
        metrics.append(Metric("median_launch_delay_ns", k.median_launch_delay_ns, "ns"))
    settings = []
    location = None
    compiled = [w for w in (ctx.settings.wrappers if ctx.settings else ()) if w.kind == "torch.compile"]
    dl = ctx.main_dataloader()
    if dl is not None:
        settings.append(SettingRef("DataLoader.batch_size", dl.batch_size, location_of(dl.call_site)))
    if compiled:
        settings.append(SettingRef("torch.compile", compiled[0].options.get("mode", "default"), location_of(compiled[0].call_site)))
        instruction = (
            "The model is already compiled: add CUDA graphs (`torch.compile(model, mode=\"reduce-overhead\")`), "
            "raise the batch size, and use a fused optimizer (GD404)."
        )
        before = "model = torch.compile(model)"
        after = "model = torch.compile(model, mode=\"reduce-overhead\")  # CUDA graphs"
        location = location_of(compiled[0].call_site)
    else:
        bs = dl.batch_size if dl is not None and dl.batch_size else None
        bigger = f" (batch_size={bs} now)" if bs else ""
        instruction = (
            f"Give the GPU more work per launch: raise the batch size{bigger}, compile the model with "
            "`torch.compile`, use a fused optimizer (GD404); CUDA graphs for what remains."
        )
        before = "model = Net().cuda()\nopt = torch.optim.AdamW(model.parameters())"
        after = "model = torch.compile(Net().cuda())\nopt = torch.optim.AdamW(model.parameters(), fused=True)"
        if dl is not None:
            location = location_of(dl.call_site)
    finding = ctx.finding(
        message,
        Fix(instruction, before, after),
        share_pct=at_stake,
        confidence=confidence,
        metrics=metrics,
        time_ranges=ctx.gap_ranges(m, GapCause.LAUNCH_BOUND, GapCause.SHORT),
        settings=settings,
        location=location,
        gain_note=gain_note,
        rank=m.rank,
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    if not ctx.has_gpu():
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    return ctx.per_trace(lambda m: _judge(ctx, m))


RULE = Rule(
    code="GD103",
    name="launch-bound",
    title="Kernels are too short for the host to keep the GPU fed",
    doc=__doc__,
    check=check,
    needs=("gpu", "trace"),
)
