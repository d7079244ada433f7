"""GD105 recompiles: torch.compile recompiles the model as the run goes, step after step.

What it detects
---------------
A frame that `torch.compile` compiled is compiled again in step after step
after its first compilation: Dynamo's guards (the input shapes, dtypes, Python
values it specialized on) keep failing, most often because a dimension changes
every step (variable sequence lengths, a last smaller batch, a changing Python
number). The rule fires when one frame recompiles in several different steps,
or reaches the recompile limit (Dynamo then runs it eagerly for the rest of the
run). The first compilation of each frame is the run's warm-up and is not
judged; neither is the one recompilation automatic dynamic shapes make when a
dimension first changes.

Why it matters
--------------
Each recompilation stops the step for as long as compiling takes: a second or
more with the Inductor backend, while the GPU waits. Once a frame reaches the
recompile limit (8 by default) Dynamo stops compiling it and the model runs
eagerly from then on, so the run loses what compiling gained without saying
so in its step times. These steps are left out of the steady account: the
cost shows here, not in the step's ledger.

How to fix
----------
Let the changing dimension be dynamic: keep `dynamic=None` (the default) rather
than `dynamic=False`, or mark it (`torch._dynamo.mark_dynamic(x, 1)`); or pad the
inputs to a few fixed sizes (buckets). `TORCH_LOGS=recompiles` prints each reason.

Before:

```python
model = torch.compile(model, dynamic=False)
for tokens, labels in loader:          # tokens.shape[1]: the longest sequence of the batch
    loss = loss_fn(model(tokens), labels)
```

After:

```python
model = torch.compile(model)           # dynamic=None: a changing length becomes dynamic
for tokens, labels in loader:
    torch._dynamo.mark_dynamic(tokens, 1)
    loss = loss_fn(model(tokens), labels)
```

Evidence used
-------------
The run's compilations (`Settings.compile`, read at run time): each
compilation's compile id (`"0/3"`: frame 0, its fourth compilation), the step
it happened in, how long it took, the guard that failed (Dynamo's
`recompile_reason`), refusals at the recompile limit; the `torch.compile` call
(`Settings.wrappers`: its `dynamic=` and call site); the steps' wall time.
A bare trace records no compilation: the rule needs `gpudoctor profile`.

Thresholds
----------
- `recompile_min_count` (3): recompilations of one frame, in different steps
  after its first compilation, that make it fire (or the recompile limit
  reached, whatever the count).
- `error_share_pct`, `warning_share_pct`: severity from the time spent
  recompiling as a share of all step time of the run (not a share of the
  steady step: the steady account leaves these steps out).

Known limits
------------
Compile callbacks exist from torch 2.2 on and the recompile reason from 2.6:
with an older torch the compilations are counted from Dynamo's metrics (the
latest 64) without their step or reason. A frame alternating between shapes
already compiled does not recompile, but each call still checks its guards;
that cost is not measured. A recompilation's time is Dynamo's own measure; the
backward graph's compilation, at its first use, is counted with it.

References
----------
- torch.compile, dynamic shapes: https://docs.pytorch.org/docs/stable/torch.compiler_dynamic_shapes.html
- Dealing with recompilations: https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html
- `torch._dynamo.mark_dynamic`: https://docs.pytorch.org/docs/stable/torch.compiler_api.html
"""

from __future__ import annotations

from gpudoctor.model.findings import ChecklistStatus, Confidence, Fix, Metric, SettingRef
from gpudoctor.model.run import CompileEvent
from gpudoctor.rules.compilation import (
    Compilations,
    compilations,
    compile_state,
    compile_wrappers,
    reason_text,
    step_range,
)
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.static_api import StaticCheck, StaticContext
from gpudoctor.rules.static_api.text import first_of

_LISTED = 10  # recompilations listed one by one in the evidence
_BEFORE = """model = torch.compile(model, dynamic=False)
for tokens, labels in loader:          # the length changes every batch
    loss = loss_fn(model(tokens), labels)"""
_AFTER = """model = torch.compile(model)           # dynamic=None: a changing length becomes dynamic
for tokens, labels in loader:
    torch._dynamo.mark_dynamic(tokens, 1)
    loss = loss_fn(model(tokens), labels)"""


def _churning(ctx: RuleContext, comp: Compilations) -> dict[int, tuple[CompileEvent, ...]]:
    """Frames that recompiled in at least ``recompile_min_count`` different steps (events without a
    step count one each)."""
    need = ctx.thresholds.recompile_min_count
    out = {}
    for frame, events in comp.by_frame.items():
        steps = {e.step for e in events if e.step is not None}
        count = len(steps) + sum(1 for e in events if e.step is None)
        if count >= need:
            out[frame] = events
    return out


def _run_step_ns(ctx: RuleContext) -> int:
    """The run's step time in all: every step of its marker, one-off costs included (the run's figures)."""
    return ctx.figures.job.marked_wall_ns


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    wrappers = compile_wrappers(ctx)
    state = compile_state(ctx)
    if not wrappers and state is None:
        return RuleResult.not_applicable("torch.compile not used")
    comp = compilations(state)
    if comp is None:
        why = "; ".join(state.errors) if state is not None and state.errors else ""
        return RuleResult.cannot_judge("torch.compile was called but no compilation was recorded"
                                       + (f" ({why})" if why else ""))
    churn = _churning(ctx, comp)
    warm = (f"warm-up: {fmt_ns(comp.warmup_ns)} compiling in {step_range(comp.warmup_steps)}"
            if comp.warmup_steps else "")
    if not churn and not comp.limit_hits:
        n = len(comp.recompiles)
        return RuleResult.fine(
            (warm + "; " if warm else "")
            + (f"{n} recompilation{'s' if n != 1 else ''} in {step_range(comp.steps) or 'the run'}" if n else
               "no recompilation")
            + f" (threshold: one frame in {t.recompile_min_count} steps, or the recompile limit)",
            applied=True,
        )
    events = tuple(e for f in sorted(churn) for e in churn[f]) or comp.recompiles
    frames = sorted(churn) or sorted({int(e.compile_id.split("/")[0]) for e in comp.limit_hits})
    steps = sorted({e.step for e in events if e.step is not None})
    reason, n_reason = comp.top_reason(events)
    recompile_ns = comp.recompile_ns
    run_ns = _run_step_ns(ctx)
    share = 100.0 * recompile_ns / run_ns if run_ns and recompile_ns else None
    first = events[0] if events else None
    where = f"{first.frame} at {location_of(first.call_site)}" if first is not None and first.call_site else ""
    frame_text = (f"frame {frames[0]}" if len(frames) == 1 else f"{len(frames)} frames") + (f" ({where})" if where else "")
    message = (
        f"torch.compile recompiled {frame_text} {len(events)} time{'s' if len(events) != 1 else ''}"
        + (f" in {step_range(steps)}" if steps else "")
        + (f"; most often: {reason}" + (f" (×{n_reason})" if n_reason > 1 else "") if reason else "")
        + (f"; {fmt_ns(recompile_ns)} recompiling, {fmt_pct(share)} of the run's step time" if share is not None else "")
    )
    state_limit = state.recompile_limit if state is not None else None
    notes = []
    if comp.limit_hits:
        hit = comp.limit_hits[0]
        at = _limit_step(ctx, hit)
        message += ("; the recompile limit" + (f" ({state_limit})" if state_limit else "") + " was reached"
                    + (f" at step {at}" if at is not None else "") + ": the frame runs eagerly from then on")
        notes.append("Dynamo stopped compiling the frame at the recompile limit (torch._dynamo.config.recompile_limit): "
                     "the steps after it run the model eagerly, without what compiling gained")
    if warm:
        notes.append(warm + " (each frame's first compilation: the run's warm-up, not judged)")
    for e in events[:_LISTED]:  # every recompilation with its step and what triggered it
        at = f"step {e.step}" if e.step is not None else "step ?"
        took = f" ({fmt_ns(e.dur_ns)})" if e.dur_ns else ""
        notes.append(f"{at}: compile {e.compile_id}{took}: {reason_text(e.reason) or 'no reason recorded'}")
    if len(events) > _LISTED:
        notes.append(f"… and {len(events) - _LISTED} more recompilations")
    notes.append("the steps with a compilation are left out of the steady steps the account is of")
    settings = []
    location = None
    dynamic_off = None
    for w in wrappers:
        settings.append(SettingRef("torch.compile(dynamic=)", w.options.get("dynamic"), location_of(w.call_site)))
        if w.options.get("dynamic") is False:
            dynamic_off = w
    if wrappers:
        location = location_of((dynamic_off or wrappers[0]).call_site)
    shape = "size mismatch" in reason or "stride mismatch" in reason or "shape" in reason
    instruction = (
        ("`dynamic=False`" + (f" at {location_of(dynamic_off.call_site)}" if dynamic_off.call_site else "")
         + " specializes the graph on every shape: drop it (the default `dynamic=None` makes a changing dimension "
           "dynamic after its first change), or " if dynamic_off is not None else
         "Let what changes be dynamic: ")
        + ("mark the changing dimension with `torch._dynamo.mark_dynamic(x, dim)` before the call, or pad the inputs "
           "to a few fixed sizes (buckets)" if shape or not reason else
           "keep the values Dynamo guards on from changing every step (make them tensors, or constants)")
        + "; `TORCH_LOGS=recompiles` prints each reason."
    )
    metrics = [
        Metric("recompilations", len(events), "count"),
        Metric("steps_with_recompilations", len(steps), "count"),
        Metric("recompile_ns", recompile_ns, "ns"),
        Metric("recompile_share_pct", round(share, 2) if share is not None else None, "%", "all steps of the run"),
        Metric("warmup_compile_ns", comp.warmup_ns, "ns"),
        Metric("recompile_limit", state_limit, "count"),
        Metric("limit_hits", len(comp.limit_hits), "count"),
    ]
    finding = ctx.finding(
        message,
        Fix(instruction, _BEFORE, _AFTER),
        share_pct=None,
        severity_pct=share,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        settings=settings,
        notes=notes,
        location=location,
        gain_note="time spent recompiling, a share of all step time of the run (outside the steady steps the "
        "account is of)" + ("; after the recompile limit the frame also runs eagerly" if comp.limit_hits else ""),
    )
    return RuleResult.fired(finding)


def _limit_step(ctx: RuleContext, hit: CompileEvent) -> int | None:
    """The step in which a frame hit the recompile limit (its start time among the steps when the
    callbacks did not see it)."""
    if hit.step is not None:
        return hit.step
    if hit.start_ns is None:
        return None
    for s in ctx.steps():
        if s.start_ns <= hit.start_ns < s.start_ns + s.wall_ns:
            return s.index
    return None


# --------------------------------------------------------------------------- `gpudoctor check`


def _judge_compile(src: StaticContext) -> tuple[ChecklistStatus, str]:
    """torch.compile in the source (the scanner records every call and decorator, and a framework's switch:
    ``TrainingArguments(torch_compile=True)``)."""
    compiled = [src.location(fn, f.site) for fn, f in src.facts("compile")
                if src.active(fn, f.ctx) and (f.value is None or src.resolve(fn, f.value).truth() is not False)]
    if compiled:
        return ChecklistStatus.APPLIED, f"torch.compile at {first_of(compiled)}"
    return ChecklistStatus.NOT_MEASURABLE, (
        "torch.compile not used; what kernel fusion wins shows only once compiled: compare two runs"
    )


STATIC = StaticCheck(judges={"torch-compile": _judge_compile})


RULE = Rule(
    code="GD105",
    name="recompiles",
    title="torch.compile recompiles as the run goes (guards that fail step after step)",
    doc=__doc__,
    check=check,
    needs={Need.SETTINGS},
    needs_reasons={Need.SETTINGS: "a trace records no compilation: torch.compile's recompilations are read at run time "
                                  "(gpudoctor profile)"},
    not_injectable="making a dimension dynamic or padding to buckets is a change to the script",
    static=STATIC,
)
