"""GD702 loss-on-cpu: the loss or metrics are computed on the CPU from outputs copied back each step.

What it detects
---------------
Loss operators (`aten::*_loss`, `cross_entropy`, `nll_loss`, …) that ran on
the CPU in a run whose model runs on the GPU, together with device-to-host
copies of more than a scalar in every step: the model's outputs are brought
back to compute the criterion on the host.

Why it matters
--------------
The copy synchronizes the host with the GPU every step, the CPU computes
what the GPU would do in microseconds, and the backward pass of the loss
starts on the CPU and must copy the gradient back to the device.

How to fix
----------
Move the criterion's inputs (targets, class weights) to the device and
compute the loss there.

Before:

```python
out = model(x.cuda())
loss = criterion(out.cpu(), y)            # y on the CPU
```

After:

```python
criterion = nn.CrossEntropyLoss(weight=class_weights).to(device)
out = model(x.to(device, non_blocking=True))
loss = criterion(out, y.to(device, non_blocking=True))
```

Expected gain
-------------
On the device the loss costs the host a few small ops each step (~50 µs of
dispatch: 5 ops of ~10 µs) instead of the CPU loss and the copy of the
model's outputs back: the expected gain is the claimed time less that.

Evidence used
-------------
Trace: loss operators that launched no GPU kernel
(`TraceMetrics.host_loss_ops`), device-to-host copies per step with their
bytes (`TraceMetrics.transfers`). The gain is the loss time from the
`other_cpu` part of the step's ledger (after GD203) and the copies' time from
its `d2h` part (after GD303; docs/account.md).

Thresholds
----------
- `loss_cpu_min_bytes_per_step` (1024): device-to-host bytes per step above a
  scalar's.
- `d2h_steps_pct` (90): the copies happen in nearly every step.
- `error_share_pct`, `warning_share_pct`: severity from the copies' and the
  CPU loss ops' share of step time.

Known limits
------------
Needs a trace with operator events and GPU activity. A metric computed on the
CPU on purpose (a scikit-learn metric at the end of an epoch) is not a
per-step cost and does not fire.

References
----------
- PyTorch performance tuning guide:
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
- PyTorch CUDA semantics: https://pytorch.org/docs/stable/notes/cuda.html
"""

from __future__ import annotations

from gpudoctor.model.findings import ChecklistStatus, Confidence, Fix, Metric
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_bytes, fmt_ns, fmt_pct
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.speedups import DEVICE_LOSS_HOST_NS_PER_STEP
from gpudoctor.rules.static_api import StaticCheck, StaticContext

_BEFORE = """out = model(x.cuda())
loss = criterion(out.cpu(), y)        # y on the CPU"""
_AFTER = """criterion = nn.CrossEntropyLoss().to(device)
out = model(x.to(device, non_blocking=True))
loss = criterion(out, y.to(device, non_blocking=True))"""


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    if m.cpu is None and not m.host_loss_ops:
        return RuleResult.cannot_judge("no operator events in the trace")
    if not m.host_loss_ops:
        if m.loss_ops is None:
            return RuleResult.cannot_judge("no operator events in the trace")
        if m.loss_ops == 0 and m.backward_ops == 0 and not m.optimizer_steps:
            return RuleResult.not_applicable("no loss op and no backward pass in the trace: evaluation or inference")
        if m.loss_ops == 0:
            return RuleResult.cannot_judge(
                "no loss op the profiler names (mse_loss, cross_entropy …) in the trace: a custom loss, or no loss"
            )
        n = f"all {m.loss_ops} loss ops" if m.loss_ops else "every loss op"
        return RuleResult.fine(f"{n} in the trace launched GPU kernels", applied=bool(m.loss_ops))
    if not m.steps:
        return RuleResult.cannot_judge("loss ops ran on the CPU, but no step markers tell whether it is every step")
    nsteps = len(m.steps)
    d2h = [x for x in m.transfers if x.direction == "DtoH"]
    d2h_bytes = sum(x.bytes for x in d2h)
    per_step_bytes = d2h_bytes / nsteps
    known = [x.steps_with for x in d2h if x.steps_with is not None]
    with_copy = max(known) if known else (nsteps if sum(x.count for x in d2h) >= nsteps else 0)
    losses = ", ".join(f"{n.name} ×{n.count}" for n in m.host_loss_ops[:3])
    if per_step_bytes < t.loss_cpu_min_bytes_per_step or 100.0 * with_copy / nsteps < t.d2h_steps_pct:
        return RuleResult.fine(
            f"loss ops on the CPU ({losses}), but only {fmt_bytes(per_step_bytes)} per step come back from the "
            f"GPU in {with_copy} of {nsteps} steps: not the model's outputs"
        )
    loss_ns = sum(n.total_ns for n in m.host_loss_ops)
    d2h_ns = sum(x.dur_ns for x in d2h)
    share = ctx.trace_share(m, loss_ns + d2h_ns)
    message = (
        f"the loss runs on the CPU ({losses}, {fmt_ns(loss_ns)}) on {fmt_bytes(per_step_bytes)} per step copied "
        f"back from the GPU ({fmt_ns(d2h_ns)}); {fmt_pct(share)} of step time"
    )
    finding = ctx.finding(
        message,
        Fix(
            "Move the criterion and the targets to the device and compute the loss there; bring only the scalar "
            "back, every N steps.",
            _BEFORE,
            _AFTER,
        ),
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=[
            Metric("host_loss_ns", loss_ns, "ns"),
            Metric("d2h_bytes_per_step", int(per_step_bytes), "bytes"),
            Metric("d2h_ns", d2h_ns, "ns"),
            Metric("d2h_steps_with_copy", with_copy, "count", f"{nsteps} steps"),
        ],
        gain_note="CPU loss time plus the copies back, while the GPU waited; the syncs they force are GD102's",
        rank=m.rank,
        claims=[(Component.OTHER_CPU, loss_ns), (Component.D2H, d2h_ns)],
        ledger=ctx.ledger(m),
        source=m,
        expected=max(0.0, 1.0 - nsteps * DEVICE_LOSS_HOST_NS_PER_STEP / (loss_ns + d2h_ns)) if loss_ns + d2h_ns else None,
        expected_note=(f"the loss on the device costs the host ~{DEVICE_LOSS_HOST_NS_PER_STEP // 1000} µs of "
                       "dispatch per step instead of the CPU loss and the copy of the outputs"),
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    return ctx.per_trace(lambda m: _judge(ctx, m))


# --------------------------------------------------------------------------- `gpudoctor check`


def _judge_loss(src: StaticContext) -> tuple[ChecklistStatus, str]:
    return ChecklistStatus.NOT_MEASURABLE, (
        "where the loss runs is decided by tensor placement at run time (GD702 needs `gpudoctor profile`)"
    )


STATIC = StaticCheck(judges={"loss-on-device": _judge_loss})


RULE = Rule(
    code="GD702",
    name="loss-on-cpu",
    title="Loss computed on the CPU from outputs copied back",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.TRACE},
    not_injectable="computing the loss on the GPU is a code change",
    static=STATIC,
)
