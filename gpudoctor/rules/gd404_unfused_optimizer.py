"""GD404 unfused-optimizer: `optimizer.step()` launches many small kernels, one loop per parameter.

What it detects
---------------
An optimizer step that launches at least one kernel per parameter tensor (or
many kernels when the parameter count is unknown): the per-tensor
implementation of `torch.optim`, rather than the multi-tensor (`foreach=True`)
or fused (`fused=True`) one.

Why it matters
--------------
The per-tensor loop launches several tiny kernels for every parameter:
thousands per step for a large model, each too short to keep the GPU busy
(see GD103). The foreach implementation batches tensors into a few launches;
the fused one does the whole update in one kernel per group.

How to fix
----------
Ask for the fused implementation where the optimizer supports it (Adam,
AdamW, SGD, Adagrad on CUDA), else `foreach=True`.

Before:

```python
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
```

After:

```python
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
```

Expected gain
-------------
A for-each-tensor optimizer launches its kernels once per parameter tensor;
the multi-tensor (`foreach`) and `fused` implementations take up to 36
tensors per launch (ATen's `MultiTensorApply.cuh`, depth 4). The optimizer's
host time and its tiny, latency-bound kernels scale with the launches, so the
expected gain is `1 − ceil(tensors ÷ 36) ÷ tensors` of the time at stake.
Without parameter counts (a bare trace) there is no expected figure, only the
bound. Factors: `gpudoctor/rules/speedups.py`.

Evidence used
-------------
Trace: kernels launched per optimizer step (`kernels.optimizer_kernels_per_step`)
and the optimizer's share of step time: the `gpu_optimizer` and `optimizer`
parts of the step's ledger (its kernels, and the GPU idle time while the host
ran `Optimizer.step`; docs/account.md); settings: the optimizer class,
`foreach`/`fused` and the number of parameter tensors, with the `file:line`
that built it. A closure that `Optimizer.step(closure)` runs (Lightning's
automatic optimization, LBFGS) is the model's work: its forward and backward
kernels and idle time are not the optimizer's and not counted here.

Thresholds
----------
- `optimizer_kernels_per_tensor` (1): kernels per parameter tensor per step.
- `optimizer_min_kernels_per_step` (100): kernels per step when the
  parameter count is unknown.
- `error_share_pct`, `warning_share_pct`: severity from the optimizer's
  share of step time (an upper bound).

Known limits
------------
Needs `Optimizer.step` annotations in the trace (torch.profiler records them).
Some optimizers have no fused implementation; `foreach` then helps. A
sparse-gradient or complex-parameter model may need the per-tensor path.

References
----------
- `torch.optim` (foreach and fused implementations):
  https://pytorch.org/docs/stable/optim.html#algorithms
- PyTorch performance tuning guide:
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
"""

from __future__ import annotations

import ast
import math
import re

from gpudoctor.model.findings import (
    ChecklistStatus,
    Confidence,
    Evidence,
    Finding,
    Fix,
    Location,
    Metric,
    SettingRef,
    Severity,
)
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.model.run import Injection
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.edits import edit_fix, optimizer_args
from gpudoctor.rules.formatting import fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.speedups import TENSORS_PER_LAUNCH, launch_fraction
from gpudoctor.rules.static_api import (
    Fact,
    Function,
    Scan,
    StaticCheck,
    StaticContext,
    Watch,
    examples,
)
from gpudoctor.rules.static_api.names import OPTIMIZERS, installed_torch_version, optimizer_class
from gpudoctor.rules.static_api.text import NO_CUDA, at, first_of, with_kwargs


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    k = m.kernels
    if k is None or k.optimizer_kernels_per_step is None:
        return RuleResult.cannot_judge("no Optimizer.step annotations with kernels in the trace")
    kps = k.optimizer_kernels_per_step
    opts = ctx.settings.optimizers if ctx.settings is not None else ()
    tensors = sum(o.num_param_tensors for o in opts)
    if tensors:
        per_param = kps / tensors
        many = per_param >= t.optimizer_kernels_per_tensor
        measure = f"{kps:.0f} kernels per optimizer step for {tensors} parameter tensors ({per_param:.1f} each)"
    else:
        per_param = None
        many = kps >= t.optimizer_min_kernels_per_step
        measure = f"{kps:.0f} kernels per optimizer step"
    if not many:
        return RuleResult.fine(measure)
    opt = opts[0] if opts else None
    if opt is not None and opt.fused:
        return RuleResult.fine(f"{opt.cls} is already fused ({measure})", applied=True)
    ledger = ctx.ledger(m)
    share = ledger.pct(Component.OPTIMIZER, Component.GPU_OPTIMIZER) if ledger is not None else None
    loc = location_of(opt.call_site) if opt is not None else None
    cls = opt.cls.rsplit(".", 1)[-1] if opt is not None else "AdamW"
    knob = "fused=True" if opt is None or opt.supports_fused else "foreach=True"
    message = (
        f"optimizer.step launches {measure}"
        + (f"; {opt.cls}(foreach={opt.foreach}, fused={opt.fused}) at {loc}" if opt is not None else "")
        + (f"; the optimizer takes {fmt_pct(share)} of step time" if share is not None else "")
    )
    settings = []
    if opt is not None:
        settings = [
            SettingRef(f"{cls}.foreach", opt.foreach, loc),
            SettingRef(f"{cls}.fused", opt.fused, loc),
            SettingRef(f"{cls}.num_param_tensors", opt.num_param_tensors, loc),
        ]
    metrics = [Metric("optimizer_kernels_per_step", round(kps, 1), "count")]
    if per_param is not None:
        metrics.append(Metric("optimizer_kernels_per_param_tensor", round(per_param, 2), "count"))
    if share is not None:
        metrics.append(Metric("optimizer_share_pct", round(share, 2), "%", "steps"))
    finding = ctx.finding(
        message,
        edit_fix(
            f"Build the optimizer with {knob}" + (f" at {loc}" if loc else "") + ".",
            f"opt = torch.optim.{cls}(model.parameters(), lr=1e-3)",
            f"opt = torch.optim.{cls}(model.parameters(), lr=1e-3, {knob})",
            *((optimizer_args(opt.call_site.file, opt.call_site.line, opt.cls, {knob.split("=")[0]: True}),)
              if opt is not None and opt.call_site is not None else ()),
            illustration="the script's source is not at hand" if opt is not None and opt.call_site is not None
            else "the optimizer's call site was not recorded",
        ),
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        settings=settings,
        location=loc,
        gain_note="the optimizer's kernels and the GPU idle time while the host ran Optimizer.step; a fused step "
        "keeps a small part of it (upper bound)",
        rank=m.rank,
        claims=[(Component.OPTIMIZER, None), (Component.GPU_OPTIMIZER, None)],
        ledger=ledger,
        expected=launch_fraction(tensors, math.ceil(tensors / TENSORS_PER_LAUNCH)) if tensors else None,
        expected_note=(f"the optimizer's time scales with its launches: {tensors} parameter tensors in "
                       f"{math.ceil(tensors / TENSORS_PER_LAUNCH)} multi-tensor launches of up to "
                       f"{TENSORS_PER_LAUNCH} instead of one each") if tensors else "",
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    s = ctx.settings
    if s is not None and s.optimizers and all(o.fused for o in s.optimizers):
        o = s.optimizers[0]
        return RuleResult.fine(f"{o.cls}(fused=True) at {location_of(o.call_site) or '?'}", applied=True)
    if s is not None and not s.optimizers and ctx.manifest is not None and ctx.manifest.step_source == "dataloader":
        return RuleResult.not_applicable("no optimizer in this run (evaluation or inference)")
    return ctx.per_trace(lambda m: _judge(ctx, m))


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: fused=True (foreach=True where the class has no fused kernel) passed to the optimizer's
    constructor at its call site; torch checks the parameters as it would for the edited line."""
    opts = ctx.settings.optimizers if ctx.settings is not None else ()
    if not opts:
        return "the optimizer's settings were not recorded (a bare trace): verify a run of `gpudoctor profile`"
    opt = opts[0]
    if not opt.cls.startswith("torch.optim."):
        return f"{opt.cls} is not a torch.optim class: its constructor may take no fused or foreach argument"
    if opt.call_site is None:
        return "the optimizer's call site is unknown"
    knob = "fused" if opt.supports_fused else "foreach"
    return (Injection("optimizer", knob, True, opt.call_site, target=opt.cls,
                      text=f"{opt.cls}({knob}=True) at {opt.call_site}"),)


# --------------------------------------------------------------------------- `gpudoctor check`


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in re.split(r"[.+]", text)[:3]:
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def optimizer_support(cls: str, torch_version: str | None) -> tuple[bool, bool]:
    """(has foreach, has fused) for an optimizer class in the given torch (None: current torch)."""
    foreach_since, fused_since = OPTIMIZERS.get(cls, (None, None))
    have = _version_tuple(torch_version) if torch_version else None

    def ok(since: str | None) -> bool:
        if since is None:
            return False
        return have is None or have >= _version_tuple(since)

    return ok(foreach_since), ok(fused_since)


def _optimizer(scan: Scan, node: ast.Call, q: str) -> bool:
    """A ``torch.optim`` optimizer: its class, its keyword arguments, whether it takes ``**kwargs``."""
    cls = optimizer_class(q)
    if cls is None:
        return False
    kwargs = {k.arg: scan.sym(k.value) for k in node.keywords if k.arg}
    star = any(k.arg is None for k in node.keywords)
    scan.record("optimizer", node, extra=cls, text=scan.segment(node, 160), data=(kwargs, star))
    return True


def _flags(src: StaticContext, fn: Function, f: Fact) -> tuple[bool | str | None, ...]:
    """(fused, foreach, differentiable): True / False / None (decided at run time) / "missing"."""
    kwargs, _star = f.data

    def flag(name: str) -> bool | str | None:
        if name not in kwargs:
            return "missing"
        return src.resolve(fn, kwargs[name]).truth()

    return flag("fused"), flag("foreach"), flag("differentiable")


def _optimizers(src: StaticContext) -> list[tuple[Function, Fact, Location, str]]:
    """Every optimizer that runs with the argparse defaults: where, and "AdamW (fused=True)" as shown."""

    def find() -> list[tuple[Function, Fact, Location, str]]:
        out = []
        for fn in src.functions():
            for f in fn.facts:
                if f.kind != "optimizer" or not src.active(fn, f.ctx):
                    continue
                fused, foreach, _diff = _flags(src, fn, f)
                shown = f.extra + (" (fused=True)" if fused is True else " (foreach=True)" if foreach is True else "")
                out.append((fn, f, src.location(fn, f.site), shown))
        return out

    return src.memo("GD404.optimizers", find)


def static_check(src: StaticContext) -> None:
    """An optimizer forced onto its for-loop implementation, or left on foreach where fused exists."""
    version = installed_torch_version()
    for fn, f, loc, _shown in _optimizers(src):
        cls, (_kwargs, star) = f.extra, f.data
        has_foreach, has_fused = optimizer_support(cls, version)
        fused, foreach, diff = _flags(src, fn, f)
        if star or diff is True or not src.cuda(fn) or not has_foreach:
            continue
        if fused is True or foreach is True:
            continue
        before = src.source(fn, f.site)
        shown_version = version or "current torch"
        refused = src.sized("fused" if has_fused else "foreach", fn, f.site).refused
        if fused is False or foreach is False:
            which = "fused=False" if fused is False else "foreach=False"
            changes = {"fused" if has_fused else "foreach": True, "foreach" if has_fused else "fused": None}
            src.report(
                "GD404",
                Severity.WARNING,
                f"torch.optim.{cls} at {at(loc)} is forced onto its for-loop implementation ({which}): every step "
                "launches several kernels per parameter tensor",
                Fix(
                    "Remove the flag, or pass " + ("fused=True" if has_fused else "foreach=True"),
                    before,
                    with_kwargs(
                        before,
                        {"fused" if has_fused else "foreach": "True", "foreach" if has_fused else "fused": None},
                    ),
                    () if refused else (optimizer_args(fn.file, f.site.line, cls, changes, col=f.site.col),),
                ),
                fn,
                f.site,
            )
            continue
        if fused == "missing" and foreach == "missing" and has_fused:
            src.report(
                "GD404",
                Severity.INFO,
                f"torch.optim.{cls} at {at(loc)} uses the default foreach implementation; its fused CUDA "
                f"implementation (fused=True, torch {shown_version}) updates all parameters in a few kernels",
                Fix(
                    f"Pass fused=True to torch.optim.{cls} (parameters must be floating-point CUDA tensors)",
                    before,
                    with_kwargs(before, {"fused": "True"}),
                    () if refused else (optimizer_args(fn.file, f.site.line, cls, {"fused": True}, col=f.site.col),),
                ),
                fn,
                f.site,
                Evidence(notes=(f"installed torch: {shown_version} (read from package metadata, not imported)",)),
            )


def _judge_in_source(src: StaticContext) -> tuple[ChecklistStatus, str]:
    optimizers = _optimizers(src)
    if not optimizers:
        return ChecklistStatus.NOT_APPLICABLE, "no torch.optim optimizer in the checked source"
    if not src.cuda_anywhere:
        return ChecklistStatus.NOT_APPLICABLE, NO_CUDA
    _fn, _f, loc, shown = optimizers[0]
    return ChecklistStatus.APPLIED, f"{shown} at {first_of([loc])}: foreach (the CUDA default) or fused"


STATIC = StaticCheck(
    check=static_check, watch=Watch(call_patterns=(_optimizer,)), judges={"unfused-optimizer": _judge_in_source}
)


EXAMPLES = examples(
    bad_default_unfused="""\
# AdamW on CUDA without fused=True runs the (slower) default foreach implementation.
import torch

model = model.cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
for x, y in loader:
    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    bad_forced_for_loop="""\
# foreach=False forces the per-parameter loop: several kernels per tensor every step.
import torch

model = model.cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
for x, y in loader:
    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    good_fused="""\
# The fused implementation updates every parameter in a few kernels.
import torch

model = model.cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
for x, y in loader:
    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
)


RULE = Rule(
    code="GD404",
    name="unfused-optimizer",
    title="optimizer.step launches many small kernels",
    technique="A fused optimizer step (fused=True or foreach)",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.TRACE},
    self_checked={Need.TRACE},
    inject=inject,
    static=STATIC,
    examples=EXAMPLES,
    autofix=True,
)
