"""GD303 d2h-every-step: values are copied from the GPU to the host in every step.

What it detects
---------------
Device-to-host copies in (nearly) every profiled step: losses, accuracies or
predictions pulled to the CPU each iteration (`.item()`, `.cpu()`,
`.numpy()`, `.tolist()`).

Why it matters
--------------
A device-to-host copy of a result must wait for the kernels that produce it:
it synchronizes the host with the GPU every step (see GD102) and the GPU's
queue drains while the host logs.

How to fix
----------
Keep running metrics on the device and copy them every N steps.

Before:

```python
for x, y in loader:
    out = model(x)
    correct += (out.argmax(1) == y).sum().item()
```

After:

```python
correct = torch.zeros((), dtype=torch.long, device="cuda")
for x, y in loader:
    out = model(x)
    correct += (out.argmax(1) == y).sum()
print(correct.item())                     # once, after the loop
```

Expected gain
-------------
Reading device results every 100 steps (the fix's example) instead of every
step leaves 1% of the copies: 99% of their own time. The syncs they force are
GD102's, with its own model.

Evidence used
-------------
Trace: device-to-host copies with count, bytes, time, and the number of
steps that had one (`TraceMetrics.transfers`). The gain is the `d2h` part of
the step's ledger (docs/account.md); the syncs the copies force are GD102's.

Thresholds
----------
- `d2h_steps_pct` (90): share of steps with a device-to-host copy that counts
  as every step.
- `error_share_pct`, `warning_share_pct`: severity from the copies' time; the
  GPU idle time of the syncs they imply is GD102's.

Known limits
------------
Needs step markers (`ProfilerStep`) to tell "every step" from "sometimes".
Some per-step copies are needed (a data-dependent control decision); make
them rarer where the logic allows.

References
----------
- PyTorch CUDA semantics, asynchronous execution:
  https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution
- PyTorch performance tuning guide:
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Fix, Metric
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.rules.context import RuleContext, RuleResult, fmt_bytes, fmt_ns, fmt_pct
from gpudoctor.rules.helpers import parse_frame
from gpudoctor.rules.registry import Rule
from gpudoctor.rules.speedups import READ_EVERY_STEPS

_BEFORE = """for x, y in loader:
    out = model(x)
    correct += (out.argmax(1) == y).sum().item()"""
_AFTER = """correct = torch.zeros((), dtype=torch.long, device="cuda")
for x, y in loader:
    out = model(x)
    correct += (out.argmax(1) == y).sum()
print(correct.item())   # once"""


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    d2h = [x for x in m.transfers if x.direction == "DtoH"]
    if not d2h:
        return RuleResult.fine("no device→host copies in the trace")
    if not m.steps:
        return RuleResult.cannot_judge("no ProfilerStep markers: cannot tell copies in every step from occasional ones")
    nsteps = len(m.steps)
    known = [x.steps_with for x in d2h if x.steps_with is not None]
    if known:
        with_copy = max(known)
        confidence = Confidence.MEASURED
    else:
        per_step = sum(x.count for x in d2h) / nsteps
        with_copy = nsteps if per_step >= 1 else 0
        confidence = Confidence.INFERRED
    pct = 100.0 * with_copy / nsteps
    count = sum(x.count for x in d2h)
    if pct < t.d2h_steps_pct:
        return RuleResult.fine(
            f"device→host copies in {with_copy} of {nsteps} steps ({count} in all; threshold {t.d2h_steps_pct:g}% of steps)"
        )
    nbytes = sum(x.bytes for x in d2h)
    dur = sum(x.dur_ns for x in d2h)
    share = ctx.trace_share(m, dur) or 0.0
    location = None
    notes = ["each such copy waits for the kernels before it: the GPU idle time of those syncs is GD102's"]
    if m.syncs is not None and m.syncs.by_frame:
        location = parse_frame(m.syncs.by_frame[0].name)
        notes.append(f"most host syncs come from {m.syncs.by_frame[0].name}")
    message = (
        f"device→host copies in {with_copy} of {nsteps} steps ({count / nsteps:.1f} per step, "
        f"{fmt_bytes(nbytes / nsteps)} per step, {fmt_ns(dur)} in all = {fmt_pct(share)} of step time)"
    )
    finding = ctx.finding(
        message,
        Fix(
            "Keep losses and metrics on the device (accumulate tensors) and copy them to the host every N steps "
            "or once per epoch.",
            _BEFORE,
            _AFTER,
        ),
        share_pct=share,
        confidence=confidence,
        metrics=[
            Metric("d2h_steps_with_copy", with_copy, "count", f"{nsteps} steps"),
            Metric("d2h_count", count, "count"),
            Metric("d2h_bytes", nbytes, "bytes"),
            Metric("d2h_ns", dur, "ns"),
            Metric("d2h_share_pct", round(share, 3), "%", "steps"),
        ],
        notes=notes,
        location=location,
        gain_note="the copies' own time while the GPU did nothing else; the syncs they force are GD102's",
        rank=m.rank,
        claims=[(Component.D2H, dur)],
        ledger=ctx.ledger(m),
        expected=1.0 - 1.0 / READ_EVERY_STEPS,
        expected_note=f"the copies made every {READ_EVERY_STEPS} steps instead of every step",
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    if not ctx.has_gpu():
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    return ctx.per_trace(lambda m: _judge(ctx, m))


RULE = Rule(
    code="GD303",
    name="d2h-every-step",
    title="Device-to-host copies in every step",
    technique="Keep results on the GPU between steps (fetch them every N steps)",
    doc=__doc__,
    check=check,
    needs=("gpu", "trace", "steps"),
    not_injectable="reading device results on the host every N steps instead of every step is a code change",
)
