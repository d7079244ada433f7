"""GD104 batch-too-small: the GPU is under-used and most of its memory is free.

What it detects
---------------
Peak GPU memory (trace allocator events or NVML) below half the device while
the GPU idles much of the step or most kernels are tiny. Where the device limits
every profiled step (docs/account.md, "Two timelines") it stays quiet; where
it limits some, the GPU-idle share must fire it.

Why it matters
--------------
A small batch gives each kernel little work: the per-step fixed costs
(launches, Python, optimizer, syncs) weigh more; a larger batch amortizes them.

How to fix
----------
Raise the batch size; scale the learning rate with it (linear scaling, with a
warm-up); where memory runs out, accumulate gradients.

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

**How much larger.** Memory = fixed (parameter count × 4 bytes × (2 + state
tensors: 2 Adam, 1 Adagrad/RMSprop, 0 SGD)) + a part linear in the batch, so
memory_factor = (`memory_near_limit_pct` × device − fixed) ÷ (peak − fixed).
The factor: the largest power of two within it, at most the first one ≥ (busy
+ overhead) ÷ busy, at least 2 (1.5× or less where memory_factor is under 2).

Expected gain
-------------
Per sample: the host issues the same ops whatever the batch; the rest grows:

    per_sample_after = max((busy + overhead) ÷ factor, busy) + rest
    expected         = (step − per_sample_after) ÷ overhead, clipped to [0, 1]

with busy the ledger's device-side parts, overhead its `launch_overhead` (the
time at stake), rest the other host parts. Launch overhead hides once GPU work
outlasts its issue (CUDA Graphs post); activations grow linearly with the batch
(Korthikanti et al.). A per-sample gain: the step itself gets longer.

Evidence used
-------------
Peak memory (trace, NVML), GPU idle share, kernels under 10 µs, the ledger, the
optimizers' parameter counts, and the DataLoader's `batch_size` and call site.

Thresholds
----------
- `batch_memory_share_pct` (50): peak memory below this share of the device.
- `batch_gpu_idle_share_pct` (20), `launch_short_kernel_share_pct` (50): GPU
  idle share, or share of kernels under 10 µs, that counts as under-used.
- `memory_near_limit_pct` (90): the share of the device the larger batch may fill.
- `error_share_pct`, `warning_share_pct`: severity from the launch overhead
  granted after GD103, which claims it first.

Known limits
------------
The batch size is also a modelling choice (generalization, the LR schedule):
the rule says the hardware has room. Needs memory figures (NVML or `--memory`).
Float32 parameters are assumed and NVML counts the CUDA context as growing: both
keep the factor safe. Kernels that grow more efficient with more work make the
GPU's time grow less than linearly: the expected gain is then low.

References
----------
- torch-tb-profiler's "low utilization" recommendation: https://github.com/pytorch/kineto/tree/main/tb_plugin
- Goyal et al., Accurate, Large Minibatch SGD (linear scaling, warm-up): https://arxiv.org/abs/1706.02677
- NVIDIA, Deep Learning Performance guide: https://docs.nvidia.com/deeplearning/performance/index.html
- Accelerating PyTorch with CUDA Graphs: https://pytorch.org/blog/accelerating-pytorch-with-cuda-graphs/
- Korthikanti et al., Reducing Activation Recomputation: https://arxiv.org/abs/2205.05198
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpudoctor.model.findings import ChecklistStatus, Confidence, Fix, Metric, SettingRef
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.device import device_limited, memory_peak
from gpudoctor.rules.formatting import fmt_bytes, fmt_ns, fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.static_api import StaticCheck, StaticContext
from gpudoctor.rules.static_api.text import at

# optimizer state kept per parameter (fp32 tensors the size of the parameters), by optimizer class:
# Adam-family keep two moments (torch.optim docs); others are counted with none (a lower bound)
_STATE_SLOTS = {"Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "SparseAdam": 2, "Adafactor": 1,
                "Adagrad": 1, "Adadelta": 2, "RMSprop": 1}
_BYTES_PER_PARAM = 4  # float32 parameters and gradients (AMP keeps float32 master weights)


def fixed_bytes(ctx: RuleContext) -> tuple[int, str] | None:
    """Memory that does not grow with the batch: parameters, gradients and optimizer state, from the
    optimizers' parameter counts (settings); a lower bound (float32, no state where the class is unknown)."""
    s = ctx.settings
    if s is None or not s.optimizers:
        return None
    total = 0
    parts = []
    for o in s.optimizers:
        if not o.num_params:
            continue
        cls = o.cls.rsplit(".", 1)[-1]
        slots = _STATE_SLOTS.get(cls, 0)
        total += o.num_params * _BYTES_PER_PARAM * (2 + slots)
        parts.append(f"{o.num_params:,} parameters of {cls} × {_BYTES_PER_PARAM} B × (weight, gradient"
                     + (f", {slots} state)" if slots else ")"))
    return (total, "; ".join(parts)) if total else None


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The batch factor GD104 recommends and what its model expects of it."""

    factor: float  # the batch is multiplied by this (a power of two, or 1.5 and less where memory ends first)
    memory_factor: float  # the most memory allows: (limit − fixed) ÷ (peak − fixed)
    needed_factor: float | None  # (busy + launch overhead) ÷ busy: the factor at which the GPU's work covers the host's
    expected_fraction: float | None  # of the launch overhead at stake, won per sample
    model: str


def plan_batch(*, peak_bytes: int, total_bytes: int, fixed: int, limit_pct: float, busy_ns: int,
               overhead_ns: int, total_ns: int) -> BatchPlan:
    """The model (see the docs): memory = fixed + per-sample × batch, so the batch can grow by
    (limit − fixed) ÷ (peak − fixed); the step is max(host issue time, GPU work) + the rest, with the
    host's issue time (busy + launch overhead) per step unchanged and the GPU work and the rest growing
    with the batch."""
    act = max(1, peak_bytes - fixed)
    mem_factor = max(1.0, (total_bytes * limit_pct / 100.0 - fixed) / act)
    mem_pow2 = 2 ** int(math.log2(mem_factor)) if mem_factor >= 2 else 1
    needed = (busy_ns + overhead_ns) / busy_ns if busy_ns > 0 and overhead_ns > 0 else None
    factor = mem_pow2
    if needed is not None:
        factor = min(factor, 2 ** math.ceil(math.log2(max(needed, 2.0))))
    factor = max(2, factor) if mem_factor >= 2 else (1.5 if mem_factor >= 1.5 else math.floor(mem_factor * 10) / 10)
    fraction = None
    model = ""
    if overhead_ns > 0 and total_ns > 0 and busy_ns > 0:
        host = busy_ns + overhead_ns
        rest = total_ns - host
        per_sample_after = max(host / factor, busy_ns) + rest
        fraction = max(0.0, min(1.0, (total_ns - per_sample_after) / overhead_ns))
        model = (f"per sample of the step now = max(host issue {fmt_ns(host)} ÷ {factor:g}, GPU busy {fmt_ns(busy_ns)}) "
                 f"+ the rest {fmt_ns(rest)} = {fmt_ns(per_sample_after)} against {fmt_ns(total_ns)} now: "
                 f"{fmt_pct(100.0 * fraction)} of the {fmt_ns(overhead_ns)} launch overhead won")
    return BatchPlan(factor, mem_factor, needed, fraction, model)


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
    idle_pct, wname = ctx.accounting.account_idle(m)
    short = m.kernels.under_10us_pct if m.kernels is not None else None
    idle_under = idle_pct is not None and idle_pct >= t.batch_gpu_idle_share_pct
    short_under = short is not None and short >= t.launch_short_kernel_share_pct
    if idle_pct is None and short is None:
        return RuleResult.cannot_judge("no GPU utilization figures in the trace")
    limited = device_limited(m)
    if limited is not None:  # a larger batch fills no wait: the device is the bottleneck already
        return RuleResult.fine(f"peak memory {fmt_pct(peak.pct)} of the device, but {limited}")
    if m.timelines is not None and m.timelines.device_bound_steps and not idle_under:
        short_under = False  # short kernels matter only where the device waits (some steps the device limits)
    if not (idle_under or short_under):
        return RuleResult.fine(
            f"peak memory {fmt_pct(peak.pct)} of the device, but the GPU is busy "
            f"(idle {fmt_pct(idle_pct)} of step time)"
        )
    ledger = ctx.ledger(m)
    fixed = fixed_bytes(ctx)
    per_step = max(1, ledger.windows) if ledger is not None else 1
    busy_ns = sum(sl.ns for sl in ledger.slices if sl.side == "device") // per_step if ledger is not None else 0
    overhead_ns = ledger.ns(Component.LAUNCH_OVERHEAD) // per_step if ledger is not None else 0
    # the step now: the run's step time (analysis.figures), the one every output prints; the host's issue time and
    # the GPU's work per step are the ledger's (the model's fraction does not depend on the step, only its text)
    step_ns = ctx.figures.account_step(ledger, m)[0] if ledger is not None else None
    plan = plan_batch(peak_bytes=peak.peak_bytes, total_bytes=peak.total_bytes, fixed=fixed[0] if fixed else 0,
                      limit_pct=t.memory_near_limit_pct, busy_ns=busy_ns, overhead_ns=overhead_ns,
                      total_ns=max(step_ns or 0, busy_ns + overhead_ns))
    factor = plan.factor
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
    target = f"batch_size={int(bs * factor)}" if bs else f"a batch {factor:g}× larger"
    fixed_text = (f"{fmt_bytes(fixed[0])} of parameters, gradients and optimizer state stay, the rest grows with "
                  "the batch" if fixed else "memory grows at most linearly with the batch")
    why_factor = (f"{factor:g}× hides the launch overhead behind the GPU's work"
                  if plan.needed_factor is not None and factor >= plan.needed_factor
                  else f"{factor:g}× is what memory allows")
    instruction = (
        f"Raise the batch size toward {target} ({fixed_text}, so up to {plan.memory_factor:.1f}× stays under "
        f"{t.memory_near_limit_pct:g}% of the device; {why_factor}); scale the learning rate with it and warm up; "
        "use gradient accumulation where memory ends first."
    )
    before = f"loader = DataLoader(dataset, batch_size={bs or 32})\nopt = torch.optim.SGD(model.parameters(), lr=lr)"
    after = (
        f"loader = DataLoader(dataset, batch_size={int((bs or 32) * factor)})\n"
        f"opt = torch.optim.SGD(model.parameters(), lr=lr * {factor:g})  # linear scaling, with warm-up"
    )
    metrics = [*peak.metrics(), Metric("batch_factor", factor, "ratio"),
               Metric("batch_memory_factor", round(plan.memory_factor, 2), "ratio",
                      f"(limit − fixed) ÷ (peak − fixed) at {t.memory_near_limit_pct:g}% of the device")]
    if fixed is not None:
        metrics.append(Metric("fixed_memory_bytes", fixed[0], "bytes", fixed[1]))
    if plan.needed_factor is not None:
        metrics.append(Metric("batch_needed_factor", round(plan.needed_factor, 2), "ratio",
                              "(GPU busy + launch overhead) ÷ GPU busy, per step"))
    if idle_pct is not None:
        metrics.append(Metric("gpu_idle_pct", round(idle_pct, 2), "%", wname))
    if short is not None:
        metrics.append(Metric("kernels_under_10us_pct", round(short, 1), "%", "kernels"))
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
        expected=plan.expected_fraction,
        expected_note=f"batch ×{factor:g}: {plan.model}" if plan.model else "",
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    return ctx.per_trace(lambda m: _judge(ctx, m))


# --------------------------------------------------------------------------- `gpudoctor check`


def _judge_batch_size(src: StaticContext) -> tuple[ChecklistStatus, str]:
    """The batch sizes the source sets: whether they fill the GPU takes a run."""
    sizes = []
    for fn, lf in src.loaders():
        state, bs = src.loader_value(fn, lf, "batch_size")
        loc = src.location(fn, lf.site)
        if state == "set" and bs is not None and bs.known:
            sizes.append(f"batch_size={bs.value!r} at {at(loc)}")
        elif state == "missing":
            sizes.append(f"batch_size=1 (default) at {at(loc)}")
    found = "; ".join(sizes[:3])
    return ChecklistStatus.NOT_MEASURABLE, (
        (found + ": " if found else "") + "whether it fills the GPU needs its memory use (GD104, `gpudoctor profile`)"
    )


STATIC = StaticCheck(judges={"batch-size": _judge_batch_size})


RULE = Rule(
    code="GD104",
    name="batch-too-small",
    title="GPU memory mostly unused while the GPU is under-used",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.MEMORY},
    self_checked={Need.MEMORY},
    not_injectable="a larger batch changes the optimization (learning rate, convergence): a code change to make deliberately",
    static=STATIC,
)
