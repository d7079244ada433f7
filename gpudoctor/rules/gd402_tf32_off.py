"""GD402 tf32-off: float32 matrix multiplications on Ampere or later run without TF32.

What it detects
---------------
An Ampere-or-later GPU (compute capability 8.0+) running float32 matmul or
convolution kernels while the script left TF32 off for matmuls
(`torch.backends.cuda.matmul.allow_tf32` False and
`torch.get_float32_matmul_precision()` "highest", the default since
PyTorch 1.12; on PyTorch 2.9 and later also
`torch.backends.cuda.matmul.fp32_precision` not "tf32").

Why it matters
--------------
TF32 runs float32 matmuls on Tensor Cores with a 10-bit mantissa, several
times faster than full FP32, with accuracy that suffices for most training.
It is a one-line change where AMP is not wanted.

How to fix
----------
Allow TF32 for matmuls (cuDNN convolutions already use it by default).

Before:

```python
model = Net().cuda()
```

After:

```python
torch.set_float32_matmul_precision("high")   # TF32 for float32 matmuls
model = Net().cuda()
```

Expected gain
-------------
TF32 shortens the FP32 matmul kernels it claims by the datasheet's TF32/FP32
peak ratio of the GPU, at most `tensor_core_speedup_max_ratio` (3x realized:
kernels partly bound by memory reach less than the peak): the expected gain is
`matmul_time × (1 − 1/s)`; 3x on A100 and H100 (peak ratio 8x), 2x on GA10x
parts (A10, RTX 30). Figures and sources: `gpudoctor/rules/speedups.py`.

Evidence used
-------------
The device's compute capability (trace or manifest); settings: the TF32 flags
and `float32_matmul_precision` with the `file:line` that set them; trace:
FP32 Tensor-Core-eligible kernel time and whether TF32 kernels already run.
The gain is the `gpu_fp32_matmul` part of the step's ledger, after GD401
(docs/account.md).

Thresholds
----------
- `tf32_min_compute_capability` (8.0).
- `tf32_fp32_share_pct` (10): FP32 eligible kernel time, % of kernel time.
- `tensor_core_speedup_max_ratio` (3): the most a kernel is expected to speed up
  on Tensor Cores (the expected gain's cap).
- `error_share_pct`, `warning_share_pct`: severity from that time's share of
  step time (an upper bound).

Known limits
------------
Needs the run's settings (`gpudoctor profile`): a trace does not record the
flags. Not for code that needs full FP32 precision (some scientific models);
with AMP in use the rule matters less.

References
----------
- PyTorch CUDA semantics, TF32 on Ampere:
  https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices
- `torch.set_float32_matmul_precision`:
  https://pytorch.org/docs/stable/generated/torch.set_float32_matmul_precision.html
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Finding, Fix, Metric
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.model.run import Injection
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.flags import flag_ref, flag_text
from gpudoctor.rules.formatting import fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.speedups import is_amd, kernel_speedup, matmul_tf32_flags, won_fraction


def _judge(ctx: RuleContext, m: TraceMetrics, refs, name: str, cc: float) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    k = m.kernels
    if k is None or not k.eligible_dtypes_known or k.fp32_eligible_pct_of_gpu is None:
        return RuleResult.cannot_judge("no input dtypes in the trace: record shapes to see FP32 matmuls")
    fp32_ns = int(k.total_ns * k.fp32_eligible_pct_of_gpu / 100.0)
    # cuDNN convolutions use TF32 by default already: the kernels their ops launched (the layout kernels
    # too, whose names say no convolution), else those named as convolutions
    conv_ns = k.fp32_conv_op_ns if k.fp32_conv_op_ns is not None else (k.conv_kernel_ns or 0)
    matmul_ns = max(0, fp32_ns - conv_ns)
    matmul_pct = 100.0 * matmul_ns / k.total_ns if k.total_ns else 0.0
    if matmul_pct <= t.tf32_fp32_share_pct:
        return RuleResult.fine(
            f"FP32 matmul kernels {fmt_pct(matmul_pct)} of kernel time (threshold {t.tf32_fp32_share_pct:g}%)"
        )
    share = ctx.trace_share(m, matmul_ns)
    speedup = kernel_speedup(cc, "fp32", "tf32", t.tensor_core_speedup_max_ratio, amd=is_amd(name))
    message = (
        f"{fmt_pct(matmul_pct)} of kernel time is FP32 matmul on {name or 'an'} (compute capability {cc:g}) "
        "with TF32 off: " + "; ".join(flag_text(f) for f in refs)
    )
    loc = next((location_of(f.call_site) for f in refs if f.call_site is not None), None)
    finding = ctx.finding(
        message,
        Fix(
            "Call `torch.set_float32_matmul_precision(\"high\")` at start-up (TF32 for float32 matmuls)"
            + (f", replacing the setting at {loc}" if loc else "")
            + ".",
            "model = Net().cuda()",
            "torch.set_float32_matmul_precision(\"high\")\nmodel = Net().cuda()",
        ),
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=[
            Metric("fp32_matmul_kernel_ns", matmul_ns, "ns"),
            Metric("fp32_matmul_kernel_pct", round(matmul_pct, 1), "%", "kernel time"),
            Metric("compute_capability", cc, ""),
        ],
        settings=[flag_ref(f) for f in refs],
        location=loc,
        notes=["convolution kernels are left out: cuDNN runs them in TF32 unless cudnn.allow_tf32 is False"],
        gain_note="GPU time of FP32 matmul kernels; TF32 shortens it (upper bound)",
        rank=m.rank,
        claims=[(Component.GPU_FP32_MATMUL, None)],
        ledger=ctx.ledger(m),
        expected=won_fraction(speedup),
        expected_note=(f"TF32 Tensor Cores ~{speedup:.1f}x on FP32 matmul kernels (the datasheet's TF32/FP32 "
                       f"ratio, at most {t.tensor_core_speedup_max_ratio:g}x realized)") if speedup else "",
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    name, cc = ctx.device_cc()
    if cc is None:
        return RuleResult.cannot_judge("the compute capability of the GPU is not known")
    if cc < t.tf32_min_compute_capability:
        return RuleResult.not_applicable(f"{name or 'the GPU'} (compute capability {cc:g}) has no TF32")
    if ctx.settings is None:
        return RuleResult.cannot_judge("the TF32 flags are not recorded in a trace: run `gpudoctor profile`")
    on, enabling, refs = matmul_tf32_flags(ctx.settings)
    if on is None:
        return RuleResult.cannot_judge("the run's settings do not record the TF32 flags")
    if enabling:
        # applied when the script set a flag that enables it; on by default (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE, a
        # build's default) it is in use, but not the script's choice
        chosen = [f for f in enabling if f.call_site is not None]
        return RuleResult.fine(f"TF32 on: {flag_text((chosen or enabling)[0])}", applied=bool(chosen))
    autocast = [a for a in ctx.settings.autocast if a.enabled and a.device_type == "cuda"]
    if autocast:
        return RuleResult.not_applicable(
            f"autocast({autocast[0].dtype}) at {location_of(autocast[0].call_site) or '?'} runs the matmuls in half precision"
        )
    if not ctx.gpu_traces():
        return RuleResult.cannot_judge("no trace with GPU kernels to measure FP32 matmul time")
    return ctx.per_trace(lambda m: _judge(ctx, m, refs, name, cc), use="shapes")  # the dtypes: the detailed window


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: torch.set_float32_matmul_precision("high") before the script, kept when it writes the
    TF32 flags (TF32 changes float32 matmul rounding, which is this fix's purpose, not a side effect)."""
    return (Injection("flag", "torch.float32_matmul_precision", "high",
                      text='torch.set_float32_matmul_precision("high"), kept when the script changes the TF32 flags'),)


RULE = Rule(
    code="GD402",
    name="tf32-off",
    title="FP32 matmuls on Ampere+ with TF32 disabled",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.SETTINGS},
    self_checked={Need.SETTINGS},
    inject=inject,
)
