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
The counts cover every call of the root module: a model of the same class rebuilt
or reloaded carries the calls of the one before it, and calls made after step
tracking stopped are still counted; a root of another class starts afresh.
In a run that trains, an evaluation is told by the module's mode: one that never
calls `model.eval()` is `gpudoctor check`'s to find, and a script that trains in
eval mode cannot be told apart, so nothing is said. Without the root module's
record (a bare trace) it judges grad mode from the operators, not the graph: a
model with every parameter frozen builds none. A run without step structure
(`step_source: "time"`) called no module with parameters: nothing is said.
`gpudoctor check --fix` wraps the loop in `torch.no_grad()` only where nothing says
it needs gradients: a loop that calls `torch.autograd.grad`, `.backward()`,
`.requires_grad_()`, sets `.requires_grad`, turns grad mode on, or whose results
are differentiated after it in its function keeps the finding with the fix left
to the author. A function the loop calls is not looked into.

References
----------
- Autograd mechanics, locally disabling gradients:
  https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation
- `torch.inference_mode`: https://pytorch.org/docs/stable/generated/torch.inference_mode.html
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from gpudoctor.model.findings import (
    ChecklistStatus,
    Confidence,
    Evidence,
    Fix,
    Location,
    Metric,
    Severity,
)
from gpudoctor.model.metrics import TraceMetrics
from gpudoctor.model.run import CallSite
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.edits import edit_fix, manual_note, wrap
from gpudoctor.rules.formatting import location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.static_api import (
    Function,
    Loop,
    Scan,
    Site,
    StaticCheck,
    StaticContext,
    Watch,
    examples,
    last,
    root_name,
)
from gpudoctor.rules.static_api.names import MODEL_NAME, NO_GRAD_CONTEXTS
from gpudoctor.rules.static_api.text import at, first_of, indent

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
    return edit_fix(
        f"Run the evaluation/inference loop{where} under `torch.inference_mode()` (or `torch.no_grad()` when the "
        "outputs feed autograd later).",
        _BEFORE,
        _AFTER,
        *((wrap(site.file, site.line, "torch.inference_mode()"),) if site is not None else ()),
        illustration="the script's source is not at hand" if site is not None else "no call site was recorded",
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
    if root.eval_calls > root.calls:
        return RuleResult.cannot_judge(
            f"the run's record of {root.name} says {root.eval_calls} calls in eval mode but {root.calls} calls in "
            "all: recorded by a gpudoctor that counted the calls of a model rebuilt or reloaded apart from its "
            "calls in eval mode; profile the script again"
        )
    if root.eval_calls == root.calls:
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


# --------------------------------------------------------------------------- `gpudoctor check`

#: Functions whose loops over batches are evaluation even without a ``.eval()`` call in them
#: (``test`` is left out: ``test_*`` functions are unit tests).
EVAL_FUNCTION = re.compile(
    r"(^|_)(eval|evaluate|evaluation|valid|validate|validation|infer|inference|predict)(_|$)", re.IGNORECASE
)
_CALLEE = re.compile(r"([A-Za-z_][\w.]*)\s*\(")


def _with_grad_source(scan: Scan, node: ast.stmt) -> str:
    """The source of a loop less its ``with torch.no_grad():`` blocks (``accelerate``'s examples guard
    each forward pass inside the loop)."""
    text = scan.source_of(node)
    if "no_grad" not in text and "inference_mode" not in text:
        return text
    for sub in ast.walk(node):
        if isinstance(sub, (ast.With, ast.AsyncWith)) and any(
            scan.qualify(i.context_expr.func if isinstance(i.context_expr, ast.Call) else i.context_expr)
            in NO_GRAD_CONTEXTS for i in sub.items
        ):
            text = text.replace(scan.source_of(sub), "")
    return text


def _loop_models(scan: Scan, node: ast.stmt, loop: Loop) -> None:
    """The models a loop calls (``model(x)``, ``net.forward(x)``), those in eval mode as it starts,
    whether every one of those calls is under a ``with torch.no_grad():`` of the loop's own, what in it
    needs autograd ("" when nothing), the names it binds, and its last line (``Loop.site`` ends at its header)."""
    everywhere = _models_called(scan, scan.source_of(node))
    if everywhere:
        with_grad = _models_called(scan, _with_grad_source(scan, node))
        scan.record("loop_models", node, site=loop.site, text="",
                    data=(loop.id, frozenset(everywhere), frozenset(scan.eval_receivers), not with_grad,
                          _needs_grad(scan, node), _bound(node), getattr(node, "end_lineno", None) or loop.site.line))


#: Calls that need autograd on (or turn it on): a loop that makes one breaks under ``torch.no_grad()``.
_GRAD_CALLS = frozenset({"torch.autograd.grad", "torch.autograd.backward", "torch.enable_grad",
                         "torch.set_grad_enabled", "torch.autograd.enable_grad", "torch.autograd.set_grad_enabled",
                         "torch.autograd.grad_mode.enable_grad", "torch.autograd.grad_mode.set_grad_enabled"})
_GRAD_METHODS = frozenset({"backward", "requires_grad_"})


def _needs_grad(scan: Scan, node: ast.stmt) -> str:
    """What in the loop needs gradients (``torch.autograd.grad(...)`` at line 19), or "" when nothing."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            q = scan.qualify(sub.func) or ""
            if q in _GRAD_CALLS or q.startswith("torch.autograd.functional."):
                return f"`{q}(...)` at line {sub.lineno}"
            if isinstance(sub.func, ast.Attribute) and sub.func.attr in _GRAD_METHODS:
                return f"`.{sub.func.attr}(...)` at line {sub.lineno}"
        elif isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            if any(isinstance(target, ast.Attribute) and target.attr == "requires_grad" for target in targets):
                return f"`.requires_grad = ...` at line {sub.lineno}"
    return ""


def _bound(node: ast.stmt) -> frozenset[str]:
    """The names a loop binds (its target, what its body assigns)."""
    return frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))


def _differentiated(scan: Scan, node: ast.Call, recv: ast.expr | str) -> None:
    """``x.backward()`` / ``torch.autograd.grad(x, …)``: the name differentiated (an evaluation loop that
    binds it needs autograd on)."""
    if isinstance(recv, str):  # a calls hook: the first argument is what is differentiated
        recv = node.args[0] if node.args else node
    name = root_name(recv)
    if name is not None:
        scan.record("differentiated", node, data=name)


def _models_called(scan: Scan, text: str) -> set[str]:
    calls: set[str] = set()
    for m in _CALLEE.finditer(text):
        d = m.group(1)
        if d.endswith(".forward"):
            d = d[: -len(".forward")]
        elif not (MODEL_NAME.match(last(d)) or d in scan.modules or d in scan.eval_receivers):
            continue
        if d not in scan.modules and d not in scan.eval_receivers and scan.imported(d.split(".", 1)[0]) is not None:
            continue  # a library call (torch.nn.functional.…), not a model; a name rebound to a model (`import
            # model` then `model = model.RNNModel(…)`, word_language_model) is the model
        calls.add(d)
    return calls


@dataclass(frozen=True, slots=True)
class _EvalLoop:
    fn: Function
    loop: Loop
    models: frozenset[str]  # models it calls
    evaluated: frozenset[str]  # of those, the ones in eval mode
    loc: Location
    guarded: bool  # under no_grad / inference_mode (the loop, its function, every caller, or each forward in it)
    needs_grad: str = ""  # what in it (or after it) needs autograd on: no_grad would break it ("": nothing seen)


def _callers_no_grad(src: StaticContext, fn: Function) -> bool:
    callers = src.callers(fn)
    return bool(callers) and all(ctx.no_grad or caller.no_grad_decorated for caller, ctx in callers)


def _eval_loops(src: StaticContext) -> list[_EvalLoop]:
    """The outermost loops that run a model over batches without backward, in eval mode or in an
    evaluation function."""

    def find() -> list[_EvalLoop]:
        out = []
        for fn in src.functions():
            if not fn.loops or src.per_step(fn):
                continue
            models = {f.data[0]: f.data[1:] for f in fn.facts if f.kind == "loop_models"}
            training = src.training_loop_ids(fn)
            steps = set(src.step_loop_ids(fn))
            candidates: dict[int, tuple[Loop, frozenset[str], frozenset[str]]] = {}
            for loop in fn.loops:
                # an evaluation loop may sit in the epoch loop, after the step loop; not inside a step
                if loop.id in training or any(lid in steps for lid in loop.ctx.loops):
                    continue
                calls, eval_before = models.get(loop.id, (frozenset(), frozenset()))[:2]
                # a model put in eval mode, then called in a loop: an evaluation, whether the loop runs over
                # batches or over indices (word_language_model's `for i in range(0, n, bptt)`); in a
                # function named for evaluation, only a loop over batches
                if not calls or not (calls & eval_before or (loop.target_is_batch and EVAL_FUNCTION.search(fn.name))):
                    continue
                if not src.active(fn, loop.ctx):
                    continue
                candidates[loop.id] = (loop, calls, eval_before)
            for lid in sorted(candidates):
                loop, calls, eval_before = candidates[lid]
                if any(outer in candidates for outer in loop.ctx.loops):
                    continue
                guarded = (loop.ctx.no_grad or fn.no_grad_decorated or _callers_no_grad(src, fn)
                           or models[loop.id][2])  # every forward under the loop's own no_grad
                out.append(_EvalLoop(fn, loop, calls, calls & eval_before, src.location(fn, loop.site), guarded,
                                     _grad_needed(fn, *models[loop.id][3:6])))
        return out

    return src.memo("GD701.eval-loops", find)


def _grad_needed(fn: Function, inside: str, bound: frozenset[str], last_line: int) -> str:
    """Why the loop needs autograd on: a call in it (``inside``), or a name it binds differentiated after it
    in its function (``output.sum().backward()`` once the loop is done); "" when nothing says so."""
    if inside:
        return f"it calls {inside}"
    after = sorted((f.site.line, f.data) for f in fn.facts
                   if f.kind == "differentiated" and f.site.line > last_line and f.data in bound)
    if after:
        line, name = after[0]
        return f"`{name}`, bound in it, is differentiated after it (line {line})"
    return ""


def static_check(src: StaticContext) -> None:
    for e in _eval_loops(src):
        if e.guarded:
            continue
        fn, loop = e.fn, e.loop
        model = sorted(e.evaluated or e.models)[0]
        why = f"`{model}.eval()` before it" if model in e.evaluated else f"in `{fn.name}()`"
        before = src.source(fn, Site(loop.site.line, loop.site.col, loop.site.end_line + 2), max_lines=3)
        if e.needs_grad:  # no_grad around the whole loop would break it: the change is the author's to make
            fix = Fix(f"Run the forward passes that need no gradients under torch.no_grad(); not the whole loop: "
                      f"{e.needs_grad}, which needs autograd on", before, "with torch.no_grad():\n" + indent(before),
                      illustration="the whole loop under no_grad, which this loop cannot take as it is")
            evidence = Evidence(notes=(manual_note(f"the loop needs gradients ({e.needs_grad})"),))
        else:
            fix = Fix(
                "Run evaluation under torch.no_grad() (or torch.inference_mode() when its outputs never feed "
                "autograd), or decorate the function with @torch.no_grad()",
                before,
                "with torch.no_grad():\n" + indent(before),
                (wrap(fn.file, loop.site.line, "torch.no_grad()"),),
            )
            evidence = None
        src.report(
            "GD701",
            Severity.WARNING,
            f"Evaluation loop at {at(e.loc)} ({why}, no backward) calls `{model}(...)` with autograd on: every "
            "forward pass records the graph and keeps its activations",
            fix,
            fn,
            loop.site,
            evidence,
        )


def _judge_in_source(src: StaticContext) -> tuple[ChecklistStatus, str]:
    loops = _eval_loops(src)
    steps = [(fn, f) for fn, f in src.facts("framework_eval") if src.active(fn, f.ctx)]
    if steps and not loops:
        fn, f = steps[0]
        return ChecklistStatus.APPLIED, (
            f"{f.extra} runs `{f.text}` at {fn.file}:{f.site.line} with autograd off"
            + (f" (and {len(steps) - 1} more evaluation steps)" if len(steps) > 1 else "")
        )
    if loops:
        guarded = sum(1 for e in loops if e.guarded)
        return ChecklistStatus.APPLIED, (
            f"{guarded} of {len(loops)} evaluation loops run under no_grad / inference_mode "
            f"({first_of([e.loc for e in loops])})"
        )
    return ChecklistStatus.NOT_APPLICABLE, (
        "no evaluation loop (model.eval() then forward passes without backward) in the checked source"
    )


STATIC = StaticCheck(check=static_check,
                     watch=Watch(loops=_loop_models, methods={"backward": _differentiated},
                                 calls={"torch.autograd.grad": _differentiated}),
                     judges={"no-grad-eval": _judge_in_source})


EXAMPLES = examples(
    bad_eval_with_grad="""\
# Evaluation after model.eval(), but autograd still records every forward pass.
import torch


def evaluate(model, loader, device):
    model.eval()
    correct = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(1) == y).sum()
    return correct / len(loader.dataset)
""",
    good_inference_mode="""\
# Evaluation under inference_mode: no graph, no saved activations.
import torch


@torch.inference_mode()
def evaluate(model, loader, device):
    model.eval()
    correct = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(1) == y).sum()
    return correct / len(loader.dataset)
""",
)


RULE = Rule(
    code="GD701",
    name="eval-with-grad",
    title="Evaluation/inference records autograd",
    doc=__doc__,
    check=check,
    needs={Need.TRACE},
    self_checked={Need.TRACE},
    not_injectable="torch.no_grad() / inference_mode() around evaluation is a code change",
    static=STATIC,
    examples=EXAMPLES,
    autofix=True,
)
