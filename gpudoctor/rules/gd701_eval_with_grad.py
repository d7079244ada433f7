"""GD701 eval-with-grad: evaluation or inference forward passes record autograd.

What it detects
---------------
An evaluation or inference run (nothing backpropagates: steps come from calls
of the root module or from DataLoader iteration, or the trace has no
`Optimizer.step` and no backward pass) whose forward builds an autograd graph:
the root module's output needs grad (gpudoctor's hook on the root module, every
call of the run), or, without that, the trace's operators carry an autograd
sequence number (grad mode was on).

In a run that trains, the evaluation passes before, between or after the
training epochs: the calls of the root module made in eval mode
(`model.eval()`), whose output carries an autograd graph. The finding points
at the line of the script that made the first of them.

Why it matters
--------------
With gradients enabled, every forward pass saves its activations for a
backward pass that never comes: more memory (smaller batches fit), more time
for the bookkeeping. `torch.inference_mode()` also skips version counting.

How to fix
----------
Run evaluation under `torch.inference_mode()` (or `torch.no_grad()` when the
outputs are later used in autograd).

Before:

```python
model.eval()
for x, y in val_loader:
    preds.append(model(x.cuda()).argmax(1))
```

After:

```python
model.eval()
with torch.inference_mode():
    for x, y in val_loader:
        preds.append(model(x.cuda()).argmax(1))
```

Evidence used
-------------
Manifest: how steps were found (`step_source`) and the root module's calls
(`root_module`: calls, calls whose output carried a graph, calls in eval mode
and those of them whose output carried a graph, and the `file:line` of the
first such call); settings: optimizers; trace: operators recorded by autograd
and backward operators (`TraceMetrics.autograd_forward_ops`, `backward_ops`).

Thresholds
----------
- `unquantified_severity` when the time at stake cannot be measured;
  otherwise `error_share_pct`, `warning_share_pct` from the recorded ops'
  share of step time.

Known limits
------------
In a run that trains, an evaluation is told from training by the module's mode:
one that never calls `model.eval()` looks like training and is
`gpudoctor check`'s to find, and a script that trains with the model in eval
mode (every call in eval mode) cannot be told apart, so nothing is said. Runs
recorded before the eval-mode counts existed say "the run trains". Without the
root module's record (a bare trace) it
needs a trace with operator events, and then judges grad mode, not the graph: a
model whose parameters were all frozen (`requires_grad_(False)`) builds none.
A run without step structure (`step_source: "time"`) called no module with
parameters: nothing says it evaluates a model.

References
----------
- Autograd mechanics, locally disabling gradients:
  https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation
- `torch.inference_mode`: https://pytorch.org/docs/stable/generated/torch.inference_mode.html
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Fix, Metric
from gpudoctor.model.metrics import TraceMetrics
from gpudoctor.model.run import CallSite
from gpudoctor.rules.context import RuleContext, RuleResult, location_of
from gpudoctor.rules.registry import Rule

_BEFORE = """model.eval()
for x, y in val_loader:
    preds.append(model(x.cuda()).argmax(1))"""
_AFTER = """model.eval()
with torch.inference_mode():
    for x, y in val_loader:
        preds.append(model(x.cuda()).argmax(1))"""


def _fix(site: CallSite | None) -> Fix:
    """The fix, at the line that called the model with gradients on when it is known."""
    where = f" (the call at {location_of(site)})" if site is not None else ""
    return Fix(
        f"Run the evaluation/inference loop{where} under `torch.inference_mode()` (or `torch.no_grad()` when the "
        "outputs feed autograd later).",
        _BEFORE,
        _AFTER,
    )


def _first_grad_site(ctx: RuleContext) -> CallSite | None:
    """Where the script first called the root module with an output that carried a graph."""
    root = ctx.manifest.root_module if ctx.manifest is not None else None
    return root.first_grad_call_site if root is not None else None


def _trains(ctx: RuleContext) -> tuple[bool | None, str]:
    """Whether the run trains (something backpropagates): (True/False/None unknown, how we know)."""
    mf = ctx.manifest
    if mf is not None and mf.step_source == "optimizer":
        return True, "steps come from optimizer.step()"
    if mf is not None and mf.step_source == "backward":
        return True, "steps come from loss.backward()"
    if mf is not None and mf.step_source == "module":
        root = f" ({mf.root_module.name})" if mf.root_module is not None else ""
        return False, f"steps come from calls of the root module{root}; nothing calls backward()"
    s = ctx.settings
    if s is not None and s.optimizers:
        return True, f"{s.optimizers[0].cls} is built"
    if mf is not None and mf.step_source == "dataloader" and s is not None:
        return False, "no optimizer steps; steps come from DataLoader iteration"
    opt = [m.optimizer_steps for m in ctx.metrics if m.optimizer_steps is not None]
    bwd = [m.backward_ops for m in ctx.metrics if m.backward_ops is not None]
    if opt and bwd:
        if sum(opt) > 0 or sum(bwd) > 0:
            return True, "the trace has optimizer steps or a backward pass"
        return False, "the trace has no Optimizer.step and no backward pass"
    return None, ""


def _judge(ctx: RuleContext, m: TraceMetrics, how: str) -> RuleResult:
    if m.autograd_forward_ops is None:
        return RuleResult.cannot_judge("the trace does not say whether autograd recorded the forward ops")
    if m.autograd_forward_ops == 0:
        if m.forward_ops == 0:
            return RuleResult.cannot_judge("no forward ops in the trace's windows to see autograd recording in")
        ops = f" ({m.forward_ops} forward ops, none recorded by autograd)" if m.forward_ops else ""
        return RuleResult.fine(
            f"evaluation/inference ({how}) runs without autograd recording{ops}", applied=m.forward_ops is not None
        )
    site = _first_grad_site(ctx)
    message = (
        f"evaluation/inference ({how}) runs with gradients enabled: autograd recorded {m.autograd_forward_ops} "
        "forward ops whose graph no backward pass uses" + (f"; first call at {location_of(site)}" if site else "")
    )
    finding = ctx.finding(
        message,
        _fix(site),
        share_pct=None,
        confidence=Confidence.MEASURED,
        metrics=[Metric("autograd_forward_ops", m.autograd_forward_ops, "count")],
        location=location_of(site),
        gain_note="memory for saved activations and autograd bookkeeping; not put in step time",
        rank=m.rank,
    )
    return RuleResult.fired(finding)


def _judge_root(ctx: RuleContext, how: str) -> RuleResult | None:
    """From the root module's calls (every call of the run), when gpudoctor watched them."""
    mf = ctx.manifest
    root = mf.root_module if mf is not None else None
    if root is None or root.calls == 0 or root.calls_with_grad is None:
        return None
    if root.calls_with_grad == 0:
        return RuleResult.fine(
            f"evaluation/inference ({how}): none of the {root.calls} calls of {root.name} built an autograd graph"
        )
    autograd_ops = [m.autograd_forward_ops for m in ctx.metrics if m.autograd_forward_ops]
    site = root.first_grad_call_site
    message = (
        f"evaluation/inference ({how}) runs with gradients enabled: {root.calls_with_grad} of {root.calls} calls "
        f"of {root.name} returned outputs that carry an autograd graph no backward pass uses"
        + (f"; first call at {location_of(site)}" if site else "")
    )
    metrics = [
        Metric("root_module_calls", root.calls, "count"),
        Metric("root_module_calls_with_grad", root.calls_with_grad, "count"),
    ]
    if autograd_ops:
        metrics.append(Metric("autograd_forward_ops", max(autograd_ops), "count", "trace"))
    finding = ctx.finding(
        message,
        _fix(site),
        share_pct=None,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        location=location_of(site),
        gain_note="memory for saved activations and autograd bookkeeping; not put in step time",
    )
    return RuleResult.fired(finding)


def _judge_eval_in_training(ctx: RuleContext, how: str) -> RuleResult:
    """A run that trains: its evaluation passes are the root module's calls in eval mode."""
    mf = ctx.manifest
    root = mf.root_module if mf is not None else None
    if root is None or root.eval_calls is None or root.eval_calls_with_grad is None:
        return RuleResult.not_applicable(
            f"the run trains ({how}); no record of the model's calls in eval mode (a bare trace, or a run recorded "
            "before gpudoctor counted them): an evaluation inside it is `gpudoctor check`'s to find"
        )
    if root.eval_calls == 0:
        return RuleResult.not_applicable(
            f"the run trains ({how}) and never called {root.name} in eval mode: no evaluation pass seen"
        )
    if root.eval_calls >= root.calls:
        return RuleResult.cannot_judge(
            f"every one of the {root.calls} calls of {root.name} ran in eval mode, the training ones too: an "
            "evaluation cannot be told from the training by the module's mode"
        )
    if root.eval_calls_with_grad == 0:
        return RuleResult.fine(
            f"the run trains ({how}); its evaluation ({root.eval_calls} calls of {root.name} in eval mode) runs "
            "without autograd recording",
            applied=True,
        )
    site = root.eval_grad_call_site
    message = (
        f"evaluation inside a training run records autograd: {root.eval_calls_with_grad} of the {root.eval_calls} "
        f"calls of {root.name} in eval mode (model.eval()) returned outputs that carry an autograd graph"
        + (f", the first at {location_of(site)}" if site else "")
    )
    finding = ctx.finding(
        message,
        _fix(site),
        share_pct=None,
        confidence=Confidence.MEASURED,
        metrics=[
            Metric("root_module_calls", root.calls, "count"),
            Metric("eval_mode_calls", root.eval_calls, "count"),
            Metric("eval_mode_calls_with_grad", root.eval_calls_with_grad, "count"),
        ],
        location=location_of(site),
        gain_note="memory for saved activations and autograd bookkeeping during evaluation; not put in step time",
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    mf = ctx.manifest
    if mf is not None and mf.step_source == "time":
        return RuleResult.not_applicable(
            "no step structure: the script called no module with parameters, no backward() and no optimizer; "
            "nothing here evaluates a model"
        )
    trains, how = _trains(ctx)
    if trains is None:
        return RuleResult.cannot_judge("cannot tell whether the run trains or evaluates")
    if trains:
        return _judge_eval_in_training(ctx, how)
    judged = _judge_root(ctx, how)
    if judged is not None:
        return judged
    if not ctx.metrics:
        return RuleResult.cannot_judge("no trace with operator events to see autograd recording")
    return ctx.per_trace(lambda m: _judge(ctx, m, how))


RULE = Rule(
    code="GD701",
    name="eval-with-grad",
    title="Evaluation/inference records autograd",
    doc=__doc__,
    check=check,
    needs=("trace",),
    not_injectable="torch.no_grad() / inference_mode() around evaluation is a code change",
)
