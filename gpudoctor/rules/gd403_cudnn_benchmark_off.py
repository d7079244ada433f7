"""GD403 cudnn-benchmark-off: convolutions with fixed input shapes run with `cudnn.benchmark` off.

What it detects
---------------
A run whose GPU time includes convolution kernels, whose convolution input
shapes do not change from step to step, and where
`torch.backends.cudnn.benchmark` was left False.

Why it matters
--------------
With `benchmark=True`, cuDNN times the available convolution algorithms for
each new input shape once and keeps the fastest; with it off, a heuristic
picks one, often slower. For fixed shapes the autotuning cost is paid once.

How to fix
----------
Turn it on at start-up, unless input shapes vary (every new shape is
re-benchmarked) or bit-wise determinism is required.

Before:

```python
model = ResNet50().cuda()
```

After:

```python
torch.backends.cudnn.benchmark = True
model = ResNet50().cuda()
```

Expected gain
-------------
cuDNN's heuristics usually pick an algorithm near the fastest; autotuning
wins the rest. There is no published figure for it: the expected gain is
gpudoctor's conservative estimate, 10% of the convolution time it claims
(`gpudoctor/rules/speedups.py`), and `--verify` measures it (the flag is
injectable). The bound is the whole convolution time.

Evidence used
-------------
Settings: `torch.backends.cudnn.benchmark` and
`torch.backends.cudnn.deterministic` with the `file:line` that set them;
trace: convolution kernel time and the number of distinct convolution input
shapes (needs recorded shapes). The gain is the `gpu_conv` and `gpu_fp32_conv`
parts of the step's ledger, the latter after GD401 (docs/account.md).

Thresholds
----------
- `cudnn_conv_share_pct` (5): convolution kernel time, % of kernel time.
- `error_share_pct`, `warning_share_pct`: severity from the convolution
  time's share of step time (an upper bound: autotuning speeds convolutions
  up, it does not remove them).

Known limits
------------
Needs the run's settings (a trace does not record the flag). Without
recorded shapes, fixed shapes are inferred from the DataLoader (`drop_last`).
Not when `cudnn.deterministic` is required.

References
----------
- PyTorch performance tuning guide, `cudnn.benchmark`:
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
- PyTorch reproducibility notes: https://pytorch.org/docs/stable/notes/randomness.html
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Finding, Fix, Metric
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.model.run import Injection
from gpudoctor.rules.context import RuleContext, RuleResult, fmt_pct, location_of
from gpudoctor.rules.helpers import find_flag, flag_ref, flag_text
from gpudoctor.rules.registry import Rule
from gpudoctor.rules.speedups import CUDNN_BENCHMARK_FRACTION


def _judge(ctx: RuleContext, m: TraceMetrics, bench) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    k = m.kernels
    if k is None or k.count == 0 or k.conv_kernel_ns is None:
        return RuleResult.cannot_judge("convolution kernel time is not measured in this trace")
    conv_pct = 100.0 * k.conv_kernel_ns / k.total_ns if k.total_ns else 0.0
    if conv_pct < t.cudnn_conv_share_pct:
        return RuleResult.not_applicable(
            f"convolutions take {fmt_pct(conv_pct)} of kernel time (threshold {t.cudnn_conv_share_pct:g}%)"
        )
    notes: list[str] = []
    confidence = Confidence.MEASURED
    if m.conv_shapes_total is not None and m.conv_shapes_max_per_step:
        variety = m.conv_shapes_total / m.conv_shapes_max_per_step
        if variety > t.cudnn_shape_variety_ratio:
            return RuleResult.not_applicable(
                f"convolution input shapes vary ({m.conv_shapes_total} distinct, {m.conv_shapes_max_per_step} in "
                "one step): benchmark mode would re-tune for each new shape"
            )
        notes.append(
            f"fixed shapes: {m.conv_shapes_total} distinct convolution input shapes, {m.conv_shapes_max_per_step} per step"
        )
    else:
        dl = ctx.main_dataloader()
        confidence = Confidence.INFERRED
        notes.append("input shapes not recorded: fixed shapes assumed (batches of one size"
                     + (", drop_last=True" if dl is not None and dl.drop_last else "") + ")")
    share = ctx.trace_share(m, k.conv_kernel_ns)
    message = (
        f"convolutions take {fmt_pct(conv_pct)} of kernel time with fixed input shapes and "
        f"{flag_text(bench)}: cuDNN picks algorithms by heuristic instead of timing them"
    )
    loc = location_of(bench.call_site)
    finding = ctx.finding(
        message,
        Fix(
            "Set `torch.backends.cudnn.benchmark = True` at start-up"
            + (f" (now False at {loc})" if loc else "")
            + "; not when input shapes vary or bit-wise determinism is required.",
            "model = ResNet50().cuda()",
            "torch.backends.cudnn.benchmark = True\nmodel = ResNet50().cuda()",
        ),
        share_pct=share,
        confidence=confidence,
        metrics=[
            Metric("conv_kernel_ns", k.conv_kernel_ns, "ns"),
            Metric("conv_kernel_pct", round(conv_pct, 1), "%", "kernel time"),
        ],
        settings=[flag_ref(bench)],
        notes=notes,
        location=loc,
        gain_note="GPU time of convolution kernels; autotuning shortens it (upper bound)",
        rank=m.rank,
        claims=[(Component.GPU_CONV, None), (Component.GPU_FP32_CONV, None)],
        ledger=ctx.ledger(m),
        expected=CUDNN_BENCHMARK_FRACTION,
        expected_note=f"autotuning wins ~{CUDNN_BENCHMARK_FRACTION:.0%} of convolution time over cuDNN's heuristic "
        "choice (gpudoctor's conservative estimate; --verify measures it)",
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    if not ctx.has_gpu():
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    if ctx.settings is None:
        return RuleResult.cannot_judge("cudnn.benchmark is not recorded in a trace: run `gpudoctor profile`")
    bench = find_flag(ctx, "cudnn.benchmark")
    if bench is None:
        return RuleResult.cannot_judge("the run's settings do not record cudnn.benchmark")
    if bench.value is True:  # applied when the script set it; on by default (a build, the environment) it is no choice
        return RuleResult.fine(flag_text(bench), applied=bench.call_site is not None)
    det = find_flag(ctx, "cudnn.deterministic")
    if det is not None and det.value is True:
        return RuleResult.not_applicable(f"determinism required: {flag_text(det)}")
    if not ctx.gpu_traces():
        return RuleResult.cannot_judge("no trace with GPU kernels to measure convolution time")
    return ctx.per_trace(lambda m: _judge(ctx, m, bench))


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: torch.backends.cudnn.benchmark = True before the script, kept when it writes the flag."""
    return (Injection("flag", "torch.backends.cudnn.benchmark", True,
                      text="torch.backends.cudnn.benchmark = True, kept when the script sets it"),)


RULE = Rule(
    code="GD403",
    name="cudnn-benchmark-off",
    title="Convolutions with fixed shapes and cudnn.benchmark off",
    doc=__doc__,
    check=check,
    needs=("gpu", "settings"),
    inject=inject,
)
