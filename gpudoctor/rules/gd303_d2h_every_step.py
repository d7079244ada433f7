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

import ast

from gpudoctor.model.findings import Confidence, Evidence, Fix, Metric, Severity
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_bytes, fmt_ns, fmt_pct
from gpudoctor.rules.profiles import parse_frame
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.speedups import READ_EVERY_STEPS
from gpudoctor.rules.static_api import (
    Scan,
    StaticCheck,
    StaticContext,
    Watch,
    absent_from_step_loops,
    examples,
)
from gpudoctor.rules.static_api.text import sync_after, sync_change

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
        source=m,
        expected=1.0 - 1.0 / READ_EVERY_STEPS,
        expected_note=f"the copies made every {READ_EVERY_STEPS} steps instead of every step",
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    return ctx.per_trace(lambda m: _judge(ctx, m))


# --------------------------------------------------------------------------- `gpudoctor check`


def _copy(scan: Scan, pattern: str, node: ast.Call) -> None:
    scan.record("d2h_copy", node, text=scan.segment(node, 80), extra=pattern)


def _cpu(scan: Scan, node: ast.Call, recv: ast.expr) -> None:
    if scan.place(recv) not in ("host", "val") and not scan.is_module_ref(recv):
        _copy(scan, ".cpu()", node)


def _numpy(scan: Scan, node: ast.Call, recv: ast.expr) -> None:
    if isinstance(recv, ast.Call) and isinstance(recv.func, ast.Attribute) and recv.func.attr in ("cpu", "to"):
        return  # the copy is the .cpu() / .to("cpu") before it
    if scan.place(recv) == "dev":
        _copy(scan, ".numpy()", node)


def _tolist(scan: Scan, node: ast.Call, recv: ast.expr) -> None:
    if scan.place(recv) == "dev":
        _copy(scan, ".tolist()", node)


def _to(scan: Scan, node: ast.Call, recv: ast.expr) -> None:
    if scan.to_target(node) == "cpu" and scan.place(recv) not in ("host", "val") and not scan.is_module_ref(recv):
        _copy(scan, '.to("cpu")', node)


WATCH = Watch(methods={"cpu": _cpu, "numpy": _numpy, "tolist": _tolist, "to": _to})


def static_check(src: StaticContext) -> None:
    """A copy of device data to the host (``.cpu()``, ``.numpy()``, ``.tolist()``) in every training step."""
    for fn in src.functions():
        for f in fn.facts:
            if f.kind != "d2h_copy":
                continue
            lid = src.step_loop(fn, f.ctx)
            if lid is None or not src.cuda(fn) or not src.active(fn, f.ctx):
                continue
            line = src.line(fn, f.site.line)
            src.report(
                "GD303",
                Severity.WARNING,
                f"`{f.text}` at {fn.file}:{f.site.line} copies device data to the host in every step of "
                f"{src.where_step(fn, lid)}: the copy waits for the GPU and stalls the next launch",
                Fix(
                    "Keep results on the device (collect with `torch.cat` / running sums) and copy them to the host "
                    "every N steps or once per epoch"
                    + (f"; {change}" if (change := sync_change(line, f.extra, f.text)) else ""),
                    line,
                    sync_after(line, f.extra, f.text),
                ),
                fn,
                f.site,
                Evidence(notes=(f"pattern: {f.extra}",)),
            )


STATIC = StaticCheck(
    check=static_check, watch=WATCH, judges={"d2h-every-step": absent_from_step_loops("per-step .cpu() / .numpy() / .tolist()")}
)


EXAMPLES = examples(
    bad_cpu_every_step="""\
# Predictions are copied to the host in every training step.
import torch

device = torch.device("cuda")
all_preds = []
for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    logits = model(x)
    loss = criterion(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    all_preds.append(logits.argmax(dim=1).cpu().numpy())
""",
    good_collect_on_device="""\
# Predictions stay on the device; one copy at the end of the epoch.
import torch

device = torch.device("cuda")
all_preds = []
for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    logits = model(x)
    loss = criterion(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    all_preds.append(logits.argmax(dim=1).detach())
predictions = torch.cat(all_preds).cpu().numpy()
""",
)


RULE = Rule(
    code="GD303",
    name="d2h-every-step",
    title="Device-to-host copies in every step",
    technique="Keep results on the GPU between steps (fetch them every N steps)",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.TRACE, Need.STEPS},
    self_checked={Need.STEPS},
    not_injectable="reading device results on the host every N steps instead of every step is a code change",
    static=STATIC,
    examples=EXAMPLES,
    not_autofix='copying results to the host less often changes what the script logs or saves when: a change to make by hand',
)
