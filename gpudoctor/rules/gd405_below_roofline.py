"""GD405 below-roofline: kernels far below the GPU's peak: FP32 math capped by precision, unfused elementwise chains.

What it detects
---------------
Each matmul, convolution and attention op's FLOPs and bytes (from its shapes)
over its kernels' time, against the device's peaks. Two findings:

- **FP32 compute-bound work far below peak**: float32 (or TF32) matmul,
  convolution and attention ops on the compute roof of their precision, under a
  quarter of the BF16/FP16 Tensor Core peak of a GPU that has one. Precision
  caps them: GD401's fix (AMP), or GD402's (TF32) where FP32 must stay.
- **Memory-bound elementwise chains**: three or more ATen elementwise kernels
  back to back on one stream, each reading and writing memory in full, where
  `torch.compile` would fuse them into one kernel.

Why it matters
--------------
A busy GPU is not a fast one: FP32 matrix math on an A100 reaches 6% of its
BF16 peak; three elementwise kernels move the same tensors three times. The idle
findings cannot see this time; where the device limits the loop, it is the step.

How to fix
----------
FP32 work: `torch.autocast` with bfloat16 (GD401's fix); where FP32 inputs must
stay, `torch.set_float32_matmul_precision("high")` (GD402's). Elementwise chains:
compile the model; when it is compiled already, the chains run outside it (a
graph break, or a loss or post-processing left eager).

Before:

```python
model = Net().cuda()
for x, y in loader:
    loss = loss_fn(model(x), y)
```

After:

```python
model = torch.compile(Net().cuda())           # fuses elementwise chains
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):   # Tensor Cores for the math
        loss = loss_fn(model(x), y)
```

Expected gain
-------------
FP32 work: `time × (1 − 1/s)`, s the Tensor Core peak over today's precision's,
capped as GD401's model. Elementwise chains: fused, a run takes about its longest
kernel: the chains' time less the longest kernel of each. The bounds are the
flagged kernels' whole time. The FP32 finding heads the time GD401 and GD402
claim and claims none itself (docs/account.md, "GD405").

Evidence used
-------------
Trace: the ops' shapes, dtypes, Concrete Inputs (`TraceMetrics.roofline`),
kernel names and streams; settings: `torch.compile` use.

Thresholds
----------
- `roofline_fp32_share_pct` (10): compute-bound FP32/TF32 work, % of step time.
- `roofline_far_below_peak_pct` (25): "far below" this % of the Tensor Core peak.
- `elementwise_chain_share_pct` (10): elementwise chains, % of step time.
- `tensor_core_speedup_max_ratio` (3): the FP32 gain's cap.
- `error_share_pct`, `warning_share_pct`: severity from the flagged share.

Known limits
------------
Needs recorded shapes for the FLOPs (the chains need only kernel names). FLOPs
are model FLOPs, bytes the least traffic. Unmodelled ops (einsum, custom, fused)
show as unmodelled; peaks are datasheet figures at boost clocks; chains are read
from kernel order and tensor sizes, not data flow (docs/account.md, "GD405").

References
----------
- Williams, Waterman, Patterson, Roofline (CACM 2009): https://doi.org/10.1145/1498765.1498785
- NVIDIA GPU background: https://docs.nvidia.com/deeplearning/performance/dl-performance-gpu-background/index.html
- PaLM, appendix B (model FLOPs utilization): https://arxiv.org/abs/2204.02311
- PyTorch 2 (Ansel et al., ASPLOS 2024): https://pytorch.org/assets/pytorch2-2.pdf
- `torch.autocast`: https://pytorch.org/docs/stable/amp.html
"""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.model.findings import Confidence, Finding, Fix, Metric, SettingRef, SummaryStat
from gpudoctor.model.metrics import Component, Roofline, RooflineRow, TraceMetrics
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult, Verdict
from gpudoctor.rules.speedups import won_fraction

_COMPUTE = ("matmul", "conv", "attention")
_FP32 = ("fp32", "tf32")

_BEFORE_FP32 = """for x, y in loader:
    loss = loss_fn(model(x), y)"""
_AFTER_BF16 = """for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)"""
_AFTER_FP16 = """scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()"""
_BEFORE_EAGER = "model = Net().cuda()"
_AFTER_COMPILE = "model = torch.compile(Net().cuda())  # Inductor fuses each elementwise run into one kernel"
_BEFORE_BREAK = "model = torch.compile(model)\nloss = loss_fn(model(x), y)"
_AFTER_BREAK = ("model = torch.compile(model)\nloss_fn = torch.compile(loss_fn)  # the eager tail too\n"
                "# TORCH_LOGS=graph_breaks python train.py   names the breaks")


def _fp32_rows(r: Roofline) -> list[RooflineRow]:
    return [x for x in r.rows if x.op_class in _COMPUTE and x.dtype in _FP32]


def _half_pct(row: RooflineRow, half_tflops: float) -> float | None:
    return 100.0 * row.achieved_tflops / half_tflops if row.achieved_tflops is not None and half_tflops else None


def _claims(ledger, parts: list[tuple[Component, int]], fallback: Component) -> list[tuple[Component, int]]:
    """Claim up to ``ns`` of each part; what a part lacks (kernels the ledger filed elsewhere) from
    ``fallback``."""
    out: list[tuple[Component, int]] = []
    rest = 0
    for comp, ns in parts:
        if ns <= 0:
            continue
        have = ledger.ns(comp) if ledger is not None else ns
        out.append((comp, ns))
        rest += max(0, ns - have)
    if rest:
        out.append((fallback, rest))
    return out


def _fp32_finding(ctx: RuleContext, m: TraceMetrics, r: Roofline, cc: float | None) -> tuple[Finding | None, str, Verdict]:
    t = ctx.thresholds
    rows = _fp32_rows(r)
    if not r.rows:
        return None, "no FLOPs estimated (no recorded shapes of matmul/conv/attention ops)", Verdict.CANNOT_JUDGE
    if not rows:
        return None, f"no FP32 matmul/conv/attention work (the FLOPs are {r.dtype or 'other precisions'})", Verdict.FINE
    peak = r.peak
    if peak is None:
        return None, (f"{r.device_name or 'the GPU'} is not in the table of GPU peaks: its FP32 work cannot be "
                      "compared with its Tensor Core peak"), Verdict.CANNOT_JUDGE
    if peak.half_tflops <= peak.fp32_tflops:
        return None, f"{peak.name} has no Tensor Cores faster than its FP32 units", Verdict.NOT_APPLICABLE
    flagged = [x for x in rows if x.bound == "compute"
               and (_half_pct(x, peak.half_tflops) or 0.0) < t.roofline_far_below_peak_pct]
    ns = sum(x.kernel_ns for x in flagged)
    share = ctx.trace_share(m, ns)
    if not flagged or share is None or share < t.roofline_fp32_share_pct:
        total = ctx.trace_share(m, sum(x.kernel_ns for x in rows))
        return None, (f"compute-bound FP32 work far below the Tensor Core peak: {fmt_pct(share or 0.0)} of step time "
                      f"(threshold {t.roofline_fp32_share_pct:g}%; all FP32 matmul/conv/attention "
                      f"{fmt_pct(total or 0.0)})"), Verdict.FINE
    ledger = ctx.ledger(m)  # the parts the flagged kernels are in (the ledger files some elsewhere)
    # measured over this trace's windows: in the account's terms (its windows may be another trace's)
    mm_ns = ctx.ns_on_ledger(m, sum(x.kernel_ns for x in flagged if x.op_class != "conv"), ledger)
    conv_ns = ctx.ns_on_ledger(m, sum(x.kernel_ns for x in flagged if x.op_class == "conv"), ledger)
    claims = _claims(ledger, [(Component.GPU_FP32_MATMUL, mm_ns)], Component.GPU_COMPUTE) + _claims(
        ledger, [(Component.GPU_FP32_CONV, conv_ns)], Component.GPU_CONV)
    # the kernels' durations summed count twice where they overlap (streams); the ledger's parts charge each
    # instant once: the share is at most the parts it heads, each up to what it holds
    summed = share
    if ledger is not None and ledger.total_ns > 0:
        held = sum(min(ns_, ledger.ns(comp)) for comp, ns_ in claims)
        share = min(share, 100.0 * held / ledger.total_ns)
        if share < t.roofline_fp32_share_pct:
            return None, (f"compute-bound FP32 work far below the Tensor Core peak: {fmt_pct(share)} of step time "
                          f"(threshold {t.roofline_fp32_share_pct:g}%; {fmt_pct(summed)} with overlapping kernels "
                          "counted twice)"), Verdict.FINE
    flops = sum(x.estimated_flops for x in flagged)
    tflops = flops / ns / 1e3 if ns else 0.0
    half_pct = 100.0 * tflops / peak.half_tflops
    tf32 = all(x.dtype == "tf32" for x in flagged)
    classes = "/".join(c for c in _COMPUTE if any(x.op_class == c for x in flagged))
    cap = t.tensor_core_speedup_max_ratio
    won = 0.0
    for x in flagged:
        s = max(1.0, min(peak.half_tflops / x.peak_tflops, cap)) if x.peak_tflops else 1.0
        won += x.kernel_ns * (won_fraction(s) or 0.0)
    expected = won / ns if ns else None
    src = "TF32" if tf32 else "FP32"
    bf16 = cc is None or cc >= t.bf16_min_compute_capability or peak.name.startswith("Instinct")
    message = (
        f"{fmt_pct(share)} of step time is compute-bound {src} {classes} at {tflops:.1f} TFLOP/s: "
        f"{half_pct:.1f}% of the {peak.name}'s BF16/FP16 Tensor Core peak ({peak.half_tflops:g} TFLOP/s); "
        "precision, not memory, caps it"
    )
    instruction = (
        "Run the forward pass and the loss under `torch.autocast(\"cuda\", dtype="
        + ("torch.bfloat16)`" if bf16 else "torch.float16)` with `torch.amp.GradScaler(\"cuda\")`")
        + " (GD401's fix: AMP)"
        + ("" if tf32 else "; where full FP32 inputs must stay, `torch.set_float32_matmul_precision(\"high\")` "
           "(GD402's fix: TF32)")
        + "."
    )
    top = max(flagged, key=lambda x: x.kernel_ns)
    metrics = [
        Metric("achieved_tflops", round(tflops, 2), "TFLOP/s", "the flagged kernels"),
        Metric("tensor_core_peak_pct", round(half_pct, 2), "%", f"{peak.name} BF16/FP16 peak"),
        Metric("precision_peak_pct", round(100.0 * tflops / (top.peak_tflops or peak.fp32_tflops), 2), "%",
               f"{peak.name} {src} peak"),
        Metric("intensity_flop_per_byte", top.intensity_flop_per_byte, "FLOP/B", top.top_op),
        Metric("flagged_kernel_ns", ns, "ns"),
        Metric("flagged_share_pct", round(share, 2), "%", ctx.window_label(ctx.window(m))),
    ]
    finding = ctx.finding(
        message,
        Fix(instruction, _BEFORE_FP32, _AFTER_BF16 if bf16 else _AFTER_FP16),
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        notes=[f"FLOPs estimated from the ops' input shapes; peaks: {peak.source}",
               *([f"the flagged kernels' durations sum to {fmt_pct(summed)} of step time; where they overlap "
                  f"(streams) each instant counts once: {fmt_pct(share)}, the account's parts they are in"]
                 if share < summed - 0.05 else []),
               f"compute-bound: intensity at or above {src} peak ÷ memory bandwidth "
               f"({peak.memory_gbps:g} GB/s)"],
        gain_note=(f"GPU time of the compute-bound {src} kernels (upper bound): the findings whose fixes lower "
                   "their precision (GD401, GD402) claim it"),
        rank=m.rank,
        expected=expected,
        expected_note=(f"half-precision Tensor Cores on the {peak.name}: the peak ratio over {src}, at most "
                       f"{cap:g}x realized"),
    )
    # the headline of the precision-capped kernel time: it claims none of it (GD401's and GD402's fixes
    # lower the precision and claim it), its severity is the share at stake (as GD101's is the idle share)
    heads = tuple(dict.fromkeys(c.value for c, _ in claims))
    finding = replace(finding, severity=ctx.severity(share), gain=replace(finding.gain, heads=heads))
    return finding, "", Verdict.FIRED


def _compiled(ctx: RuleContext, m: TraceMetrics) -> SettingRef | None:
    """torch.compile in use: the setting, or Inductor's kernels among the trace's heaviest."""
    s = ctx.settings
    if s is not None:
        for w in s.wrappers:
            if w.kind == "torch.compile":
                return SettingRef("torch.compile", w.options.get("mode", "default"), location_of(w.call_site))
    st = getattr(m, "compiled", None)  # analysis.compiled: regions, compiled functions, generated kernels
    if st is not None and st.compiled:
        return SettingRef("torch.compile", "compiled code in the trace", None)
    names = [k.name for k in (m.kernels.top if m.kernels is not None else ())]
    if any(n.startswith(("triton_", "triton__")) for n in names):
        return SettingRef("torch.compile", "Inductor's triton_ kernels in the trace", None)
    return None


def _chain_finding(ctx: RuleContext, m: TraceMetrics, r: Roofline) -> tuple[Finding | None, str, Verdict]:
    t = ctx.thresholds
    if not r.chains:
        return None, (f"no runs of {r.chain_min_kernels}+ elementwise kernels in a row "
                      f"({r.elementwise_kernels} elementwise kernels)"), Verdict.FINE
    share = ctx.trace_share(m, r.chain_ns)
    if share is None or share < t.elementwise_chain_share_pct:
        return None, (f"elementwise chains {fmt_pct(share or 0.0)} of step time "
                      f"(threshold {t.elementwise_chain_share_pct:g}%)"), Verdict.FINE
    compiled = _compiled(ctx, m)
    ew = [x for x in r.rows if x.op_class == "elementwise" and x.achieved_gbps is not None]
    bw = ""
    if ew:
        top = max(ew, key=lambda x: x.kernel_ns)
        bw = f", {top.achieved_gbps:.0f} GB/s" + (
            f" ({fmt_pct(top.bandwidth_pct)} of the {r.peak.name}'s {r.peak.memory_gbps:g} GB/s)"
            if r.peak is not None and top.bandwidth_pct is not None else "")
    message = (f"{fmt_pct(share)} of step time runs in {r.chains} chains of back-to-back elementwise kernels "
               f"({r.chain_kernels} kernels, memory-bound{bw}); fused, each chain would take about its longest "
               f"kernel ({fmt_ns(r.chain_fused_ns)} instead of {fmt_ns(r.chain_ns)})")
    if compiled is None:
        fix = Fix("Compile the model with `torch.compile(model)`: Inductor fuses each run of elementwise ops into one "
                  "kernel that reads its inputs and writes its result once (the checklist's torch.compile item).",
                  _BEFORE_EAGER, _AFTER_COMPILE)
    else:
        fix = Fix("The model is compiled, yet these chains run as eager ATen kernels: find the graph breaks "
                  "(`TORCH_LOGS=graph_breaks`, `torch._dynamo.explain`) and compile the code left outside the "
                  "compiled module (the loss, post-processing).", _BEFORE_BREAK, _AFTER_BREAK)
    ledger = ctx.ledger(m)
    expected = 1.0 - r.chain_fused_ns / r.chain_ns if r.chain_ns else None
    finding = ctx.finding(
        message,
        fix,
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=[
            Metric("elementwise_chains", r.chains, "count"),
            Metric("chain_kernels", r.chain_kernels, "count"),
            Metric("chain_kernel_ns", r.chain_ns, "ns"),
            Metric("chain_fused_ns", r.chain_fused_ns, "ns", "the longest kernel of each chain"),
            Metric("chain_share_pct", round(share, 2), "%", ctx.window_label(ctx.window(m))),
        ],
        settings=[compiled] if compiled is not None else [],
        notes=[f"a chain: {r.chain_min_kernels} or more ATen elementwise kernels in a row on one stream, read from "
               "kernel names and order"],
        gain_note="GPU time of the chains' kernels (upper bound)",
        rank=m.rank,
        claims=[(Component.GPU_COMPUTE, r.chain_ns)],
        ledger=ledger,
        source=m,
        expected=expected,
        expected_note="a fused chain moves about its largest member's bytes: it takes about its longest kernel",
    )
    return finding, "", Verdict.FIRED


def _judge(ctx: RuleContext, m: TraceMetrics, cc: float | None) -> RuleResult:
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    r = m.roofline
    if r is None:
        return RuleResult.cannot_judge("no kernels in the trace's windows")
    parts = [_fp32_finding(ctx, m, r, cc), _chain_finding(ctx, m, r)]
    findings = [f for f, _, _ in parts if f is not None]
    if findings:
        return RuleResult.fired(findings)
    reason = "; ".join(why for _, why, _ in parts if why)
    verdicts = {v for _, _, v in parts}
    if Verdict.FINE in verdicts:
        return RuleResult.fine(reason)
    if Verdict.NOT_APPLICABLE in verdicts:
        return RuleResult.not_applicable(reason)
    return RuleResult.cannot_judge(reason)


def check(ctx: RuleContext) -> RuleResult:
    if not ctx.gpu_traces():
        return RuleResult.cannot_judge("no trace with GPU kernels in this run")
    _, cc = ctx.device_cc()
    return ctx.per_trace(lambda m: _judge(ctx, m, cc), use="shapes")  # FLOPs and chains: the detailed window


# --------------------------------------------------------------------------- the summary's figures


# The share of kernel time the shapes must model before the summary states an MFU (the share of peak is
# of the modelled kernels, and says so):
# below it the figures are of a sliver of the work (a PyTorch 1.x trace models its backward convolutions
# only), not of the model. gpudoctor's choice: most of the kernel time.
SUMMARY_MIN_MODELLED_PCT = 50.0


def roofline_summary(m: TraceMetrics | None) -> list[SummaryStat]:
    """The headline figures of a trace's roofline: achieved TFLOP/s of the matmul/conv/attention
    kernels, their share of the device's peak and the MFU (or why there is no share of peak)."""
    r = m.roofline if m is not None else None
    if r is None or not r.estimated_flops or r.achieved_tflops is None:
        return []
    what = f"{fmt_pct(r.modelled_pct)} of kernel time" if r.modelled_pct is not None else "their kernels"
    out = [SummaryStat("roofline_tflops", "matmul/conv/attention throughput", r.achieved_tflops, "TFLOP/s",
                       f"their kernels, {what}")]
    if r.peak is None:
        why = (f"{r.device_name} is not in gpudoctor's table of GPU peaks" if r.device_name
               else "the trace does not name its GPU")
        out.append(SummaryStat("roofline_peak", "share of the device's peak", f"unknown: {why}"))
        return out
    dtypes = sorted({x.dtype for x in r.rows if x.op_class in _COMPUTE and x.peak_tflops})
    if len(dtypes) == 1:
        pk = next(x.peak_tflops for x in r.rows if x.op_class in _COMPUTE and x.dtype == dtypes[0])
        of = f"the {r.peak.name}'s {dtypes[0].upper()} peak, {pk:g} TFLOP/s"
    else:
        of = f"the {r.peak.name}'s peak of each precision"
    of = f"{of}; the modelled kernels, {what}"
    if r.peak_pct is not None:
        out.append(SummaryStat("roofline_peak_pct", "share of the device's peak", round(r.peak_pct, 3), "%", of))
    if r.mfu_pct is not None:
        if r.modelled_pct is not None and r.modelled_pct < SUMMARY_MIN_MODELLED_PCT:
            # the FLOPs of a sliver of the kernels over the whole step would read as the model's utilization
            out.append(SummaryStat("mfu", "model FLOPs utilization (MFU)",
                                   f"not stated: the shapes model {fmt_pct(r.modelled_pct)} of kernel time "
                                   f"(under {SUMMARY_MIN_MODELLED_PCT:g}%)"))
        else:
            out.append(SummaryStat("mfu", "model FLOPs utilization (MFU)", round(r.mfu_pct, 3), "%",
                                   "steps" if r.window.value == "steps" else "span"))
    return out


RULE = Rule(
    code="GD405",
    name="below-roofline",
    title="Kernels far below the device's peak: FP32 math capped by precision, unfused elementwise chains",
    technique="Kernels near the device's roofline (Tensor Cores for FP32 math, fused elementwise chains)",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.TRACE, Need.SHAPES},
    self_checked={Need.TRACE, Need.SHAPES},
    not_injectable=("AMP changes numerics and torch.compile changes the code: try them in the script and compare "
                    "two runs"),
)
