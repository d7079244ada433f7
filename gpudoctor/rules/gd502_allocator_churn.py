"""GD502 allocator-churn: the CUDA caching allocator goes back to the driver during steps.

What it detects
---------------
`cudaMalloc`/`cudaFree` calls in steady-state steps (after the first), or
`torch.cuda.empty_cache()` called while training.

Why it matters
--------------
PyTorch's caching allocator keeps freed blocks for reuse so that steady-state
steps never call the driver. `cudaFree` synchronizes the whole device and
`cudaMalloc` is slow; `empty_cache()` throws the cache away and forces both
on the next step. Repeated calls mean the step waits on the driver.

How to fix
----------
Drop `empty_cache()` from the loop; let the allocator reuse memory. When the
churn comes from fragmentation (varying shapes), enable expandable segments.

Before:

```python
for x, y in loader:
    loss = step(x, y)
    torch.cuda.empty_cache()
```

After:

```python
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py
for x, y in loader:
    loss = step(x, y)
```

Expected gain
-------------
The caching allocator reuses its blocks: once `empty_cache()` calls go (or
fragmentation is fixed), a steady step makes no `cudaMalloc`/`cudaFree`
call, so the whole measured allocator time is expected to go (the device
synchronizations of `cudaFree` come on top, in GD102's part).

Evidence used
-------------
Trace: `cudaMalloc`/`cudaFree` counts and host time, calls after the first
step, `empty_cache` calls (`TraceMetrics.memory`); settings: the
`torch.cuda.empty_cache()` call sites and count,
`PYTORCH_CUDA_ALLOC_CONF`. The gain is the allocator calls' host time, taken
from the `other_cpu` part of the step's ledger after GD203 and GD702
(docs/account.md).

Thresholds
----------
- `allocator_calls_per_step` (1): allocator calls per steady step.
- `error_share_pct`, `warning_share_pct`: severity from the host time in
  allocator calls (`unquantified_severity` when only the settings show it).

Known limits
------------
The trace's allocator calls are read from the CUDA runtime events; a run
whose memory genuinely grows (a growing cache, longer sequences) allocates
legitimately.

References
----------
- PyTorch, CUDA memory management (caching allocator, `expandable_segments`):
  https://pytorch.org/docs/stable/notes/cuda.html#memory-management
- `torch.cuda.empty_cache`: https://pytorch.org/docs/stable/generated/torch.cuda.empty_cache.html
"""

from __future__ import annotations

import ast

from gpudoctor.model.findings import (
    ChecklistStatus,
    Confidence,
    Finding,
    Fix,
    Metric,
    SettingRef,
    Severity,
)
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.model.run import Injection
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.static_api import (
    Fact,
    Function,
    Scan,
    StaticCheck,
    StaticContext,
    Watch,
    examples,
)
from gpudoctor.rules.static_api.text import NO_CUDA

_BEFORE = """for x, y in loader:
    loss = step(x, y)
    torch.cuda.empty_cache()"""
_AFTER = """# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py
for x, y in loader:
    loss = step(x, y)"""


def _settings_evidence(ctx: RuleContext):
    s = ctx.settings
    refs = []
    if s is None:
        return refs, None
    loc = location_of(s.empty_cache_calls[0]) if s.empty_cache_calls else None
    if s.empty_cache_count:
        refs.append(SettingRef("torch.cuda.empty_cache() calls", s.empty_cache_count, loc))
    conf = s.env.get("PYTORCH_CUDA_ALLOC_CONF")
    if conf is not None:
        refs.append(SettingRef("PYTORCH_CUDA_ALLOC_CONF", conf))
    return refs, loc


def _fix(loc) -> Fix:
    where = f" at {loc}" if loc else ""
    return Fix(
        f"Remove torch.cuda.empty_cache(){where} from the loop; if memory fragments with varying shapes, run with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
        _BEFORE,
        _AFTER,
    )


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    if not m.memory:
        return RuleResult.cannot_judge("no allocator calls recorded in the trace")
    calls_after = [mem.alloc_calls_after_first_step for mem in m.memory if mem.alloc_calls_after_first_step is not None]
    if not calls_after or len(m.steps) < 2:
        return RuleResult.cannot_judge("the trace has no step markers to tell warm-up allocations from steady ones")
    calls = sum(calls_after)
    per_step = calls / (len(m.steps) - 1)
    empty = sum(mem.empty_cache_count for mem in m.memory)
    if per_step < t.allocator_calls_per_step and empty == 0:
        return RuleResult.fine(
            f"{calls} cudaMalloc/cudaFree calls after the first step ({per_step:.2f} per step; threshold "
            f"{t.allocator_calls_per_step:g})"
        )
    api_ns = sum(mem.alloc_api_ns or 0 for mem in m.memory)
    measured = any(mem.alloc_api_ns is not None for mem in m.memory)
    share = ctx.trace_share(m, api_ns) if measured else None
    refs, loc = _settings_evidence(ctx)
    message = (
        f"{per_step:.1f} cudaMalloc/cudaFree calls per step after the first"
        + (f", {empty} torch.cuda.empty_cache() calls" if empty else "")
        + (f", {fmt_ns(api_ns)} in allocator calls = {fmt_pct(share)} of step time" if share is not None else "")
    )
    finding = ctx.finding(
        message,
        _fix(loc),
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=[
            Metric("alloc_calls_after_first_step", calls, "count"),
            Metric("alloc_calls_per_step", round(per_step, 2), "count"),
            Metric("empty_cache_calls", empty, "count"),
            Metric("alloc_api_ns", api_ns if measured else None, "ns"),
        ],
        settings=refs,
        location=loc,
        gain_note="host time in cudaMalloc/cudaFree while the GPU waited (the device syncs of cudaFree come on top)",
        rank=m.rank,
        claims=[(Component.OTHER_CPU, api_ns)] if measured else (),
        ledger=ctx.ledger(m),
        source=m,
        expected=1.0 if measured else None,
        expected_note="the caching allocator reuses its blocks: a steady step makes no cudaMalloc/cudaFree call",
    )
    return RuleResult.fired(finding)


def _from_settings(ctx: RuleContext) -> RuleResult | None:
    """empty_cache() calls counted at run time, per step of the run."""
    t = ctx.thresholds
    s = ctx.settings
    steps = ctx.manifest.steps_seen if ctx.manifest is not None else len(ctx.steps())
    if s is None or not s.empty_cache_count or not steps:
        return None
    per_step = s.empty_cache_count / steps
    if per_step < t.allocator_calls_per_step:
        return None
    refs, loc = _settings_evidence(ctx)
    message = (
        f"torch.cuda.empty_cache() called {s.empty_cache_count} times in {steps} steps"
        + (f", at {loc}" if loc else "")
        + ": the caching allocator starts over each time"
    )
    finding = ctx.finding(
        message,
        _fix(loc),
        share_pct=None,
        confidence=Confidence.MEASURED,
        metrics=[Metric("empty_cache_per_step", round(per_step, 2), "count")],
        settings=refs,
        location=loc,
        gain_note="not timed: the trace has no allocator figures",
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    traced = ctx.per_trace(lambda m: _judge(ctx, m)) if ctx.metrics else None
    if traced is not None and traced.findings:
        return traced
    from_settings = _from_settings(ctx)
    if from_settings is not None:
        return from_settings
    if traced is not None:
        return traced
    return RuleResult.cannot_judge("no trace with allocator calls and no empty_cache() count")


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: torch.cuda.empty_cache() skipped where the script calls it; without such calls,
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. Neither changes what is computed."""
    s = ctx.settings
    if s is not None and s.empty_cache_calls:
        return tuple(
            Injection("skip_call", "torch.cuda.empty_cache", None, site, text=f"torch.cuda.empty_cache() at {site} skipped")
            for site in s.empty_cache_calls
        )
    conf = s.env.get("PYTORCH_CUDA_ALLOC_CONF") if s is not None else None
    if conf is not None:
        return f"the allocator is already configured (PYTORCH_CUDA_ALLOC_CONF={conf}): which setting to change is your call"
    return (Injection("env", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True",
                      text="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),)


# --------------------------------------------------------------------------- `gpudoctor check`

EMPTY_CACHE = frozenset({"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"})


def _empty_cache_call(scan: Scan, node: ast.Call, q: str) -> None:
    scan.record("empty_cache", node)


def _empty_cache(src: StaticContext, fn: Function, f: Fact) -> None:
    lid = src.step_loop(fn, f.ctx)
    line = src.line(fn, f.site.line)
    fix = Fix(
        "Remove torch.cuda.empty_cache(): the caching allocator reuses freed blocks; for fragmentation set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        line,
        "# (removed) " + line,
    )
    if lid is not None:
        src.report(
            "GD502",
            Severity.WARNING,
            f"torch.cuda.empty_cache() at {fn.file}:{f.site.line} runs in every step of "
            f"{src.where_step(fn, lid)}: it synchronizes and returns the cache to the driver, so "
            "the next step pays cudaMalloc again",
            fix,
            fn,
            f.site,
        )
    elif f.ctx.loops or src.called_in_loop(fn):
        src.report(
            "GD502",
            Severity.INFO,
            f"torch.cuda.empty_cache() at {fn.file}:{f.site.line} runs inside a loop: each call synchronizes "
            "and empties the allocator's cache, which the next iteration refills with cudaMalloc",
            fix,
            fn,
            f.site,
        )


def static_check(src: StaticContext) -> None:
    """torch.cuda.empty_cache() in every training step (warning), or in another loop (info)."""
    for fn in src.functions():
        for f in fn.facts:
            if f.kind == "empty_cache" and src.active(fn, f.ctx):
                _empty_cache(src, fn, f)


def _judge_in_source(src: StaticContext) -> tuple[ChecklistStatus, str]:
    if not src.cuda_anywhere:
        return ChecklistStatus.NOT_APPLICABLE, NO_CUDA
    return ChecklistStatus.APPLIED, "no torch.cuda.empty_cache() in a loop"


STATIC = StaticCheck(
    check=static_check,
    watch=Watch(calls=dict.fromkeys(EMPTY_CACHE, _empty_cache_call)),
    judges={"allocator-churn": _judge_in_source},
)


EXAMPLES = examples(
    bad_empty_cache_every_step="""\
# Emptying the CUDA cache every step: the allocator starts over each time.
import torch

for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.cuda.empty_cache()
""",
    good_no_empty_cache="""\
# The caching allocator reuses its blocks from step to step.
import torch

for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
""",
)


RULE = Rule(
    code="GD502",
    name="allocator-churn",
    title="cudaMalloc/cudaFree or empty_cache inside steps",
    technique="Reuse GPU memory across steps (no empty_cache() or fresh allocations in the loop)",
    doc=__doc__,
    check=check,
    needs={Need.GPU},
    inject=inject,
    static=STATIC,
    examples=EXAMPLES,
    not_autofix='removing empty_cache() may be deliberate (another process shares the GPU, a memory measurement): a change to make by hand',
)
