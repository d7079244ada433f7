"""GD103 launch-bound: the ops are so small that issuing them, not running them, sets the step time.

What it detects
---------------
On a GPU, the ledger's `launch_overhead`: the GPU waits while the host issues
ops; launch-bound where kernels are tiny and launches as long, else dispatch-bound.
On a CPU, tiny ops and the glue between them take most of a typical step, with
many ops per sample. Where the device limits every step it stays quiet.
Details: docs/account.md, "GD103".

Why it matters
--------------
Each launch or op costs the host microseconds of Python and dispatch; with tiny
kernels or ops that cost sets the step, and a faster GPU or BLAS does not help.

How to fix
----------
Give each op more work or launch fewer: a larger batch, `torch.compile` (fuses
kernels, removes the Python between ops), CUDA graphs (`mode="reduce-overhead"`),
a fused optimizer (GD404). Compiled code is never told to compile again, but
to add CUDA graphs, capture more of the step (graph breaks named), or batch more.

Before:

```python
model = Net().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(ds, batch_size=8)
```

After:

```python
model = torch.compile(Net().cuda())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
loader = DataLoader(ds, batch_size=64)   # scale the learning rate with the batch
```

Expected gain
-------------
`torch.compile` at least halves the ops a launch-bound step issues: half the
claimed overhead (Ansel et al., ASPLOS 2024). Compiled code on a GPU: CUDA graphs
make each graph call one launch: 1 − (launches − inside compiled + graph calls)
÷ launches. On a CPU a k× batch: 1 − 1/k per sample. `--verify` cannot try it.
Factors: `gpudoctor/rules/speedups.py`; the model: docs/account.md, "GD103".

Evidence used
-------------
The ledger, `TraceMetrics.kernels`, `.compiled`, `.dispatch`; `Settings.compile`;
the DataLoader's `batch_size`; the steps' phase times (where the model's calls
are a small share of the step, it is the loop's Python: GD203).

Thresholds
----------
- `launch_gap_min_share_pct` (5): fires at this launch overhead share of step.
- `launch_short_kernel_share_pct` (50), `launch_to_kernel_min_ratio` (0.8):
  kernels under 10 µs, mean launch / median kernel: launch- not dispatch-bound.
- `dispatch_share_pct` (50): CPU: per-op overhead, share of the typical step.
- `dispatch_ops_per_sample_count` (100): CPU: ops per step per sample.
- `dispatch_short_op_time_pct` (50): CPU, no batch size: op time in tiny ops.
- `dispatch_target_share_pct` (25): the overhead share the suggested batch aims at.
- `dispatch_disturbed_ratio` (1.5): profiled steps this many typical ones: disturbed.
- `model_calls_min_share_pct` (25): the model's calls' least share of the step.
- `error_share_pct`, `warning_share_pct`: severity from `launch_overhead` granted.

Known limits
------------
The 10 µs and 1 ms cuts are fixed by the metric. A genuinely small model may
stay launch-bound: CUDA graphs are the remaining lever. A trace without
compiled-region ranges is judged compiled by the settings alone. On a CPU the
gain (measured steps) and the firing test (typical step) can differ on a
disturbed run: the message gives both. Calibration: docs/account.md, "GD103".

References
----------
- HTA launch statistics: https://hta.readthedocs.io/en/latest/source/features/cuda_kernel_launch_stats.html
- `torch.compile`: https://pytorch.org/docs/stable/generated/torch.compile.html
- CUDA graphs in PyTorch: https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs
- PyTorch performance tuning guide (CPU): https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
"""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.model.findings import Confidence, Fix, Metric, SettingRef, TimeRange
from gpudoctor.model.metrics import Component, GapCause, TraceMetrics
from gpudoctor.rules.compilation import CodeKind, code_kind, compilations, compile_state, step_range
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.dataloader import dataloader_call
from gpudoctor.rules.device import device_limited
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of
from gpudoctor.rules.profiles import too_few_steps
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult, Verdict
from gpudoctor.rules.speedups import COMPILE_LAUNCH_REDUCTION, launch_fraction

_EXPECTED_NOTE = (f"torch.compile issues at least {COMPILE_LAUNCH_REDUCTION:g}x fewer ops (fused pointwise runs); "
                  "CUDA graphs would remove nearly all of the launch cost")


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    k = m.kernels
    ledger = ctx.ledger(m)
    if k is None or k.count == 0 or ledger is None:
        return RuleResult.cannot_judge("no kernels in the trace")
    part = ledger.get(Component.LAUNCH_OVERHEAD)
    at_stake = ledger.pct(Component.LAUNCH_OVERHEAD)
    lost_ns = ledger.ns(Component.LAUNCH_OVERHEAD)
    short = k.under_10us_pct
    launch_mean_ns = k.launch_total_ns / k.launch_count if k.launch_count else None
    ratio = launch_mean_ns / k.p50_ns if launch_mean_ns is not None and k.p50_ns else None
    kernels_text = f"{fmt_pct(short)} of {k.count} kernels under 10 µs (median {fmt_ns(k.p50_ns)})"
    if ratio is not None:
        kernels_text += f", a launch call {fmt_ns(launch_mean_ns)} ({ratio:.2f}× the median kernel)"
    limited = device_limited(m)
    if limited is not None:  # the device never waits for the launches: they do not set the step time
        return RuleResult.fine(f"{limited}: launches do not set the step time; {kernels_text}")
    if at_stake < t.launch_gap_min_share_pct:
        return RuleResult.fine(
            f"launch and dispatch overhead idles the GPU {fmt_pct(at_stake)} of step time (threshold "
            f"{t.launch_gap_min_share_pct:g}%); {kernels_text}"
        )
    tiny = short >= t.launch_short_kernel_share_pct and ratio is not None and ratio >= t.launch_to_kernel_min_ratio
    op = part.detail if part is not None and part.detail else ""
    if tiny:
        message = (
            f"launch-bound: the GPU waits {fmt_pct(at_stake)} of step time for the next launch; {kernels_text}"
        )
    else:
        message = (
            f"dispatch-bound: the GPU waits {fmt_pct(at_stake)} of step time between kernels while the host issues "
            "ops" + (f" (mostly in {op})" if op else "") + f"; {kernels_text}"
        )
    confidence = Confidence.MEASURED
    gain_note = "GPU idle time in launch-bound and short gaps (the launch_overhead part of the step)"
    metrics = [
        Metric("launch_overhead_pct", round(at_stake, 2), "%", ctx.window_label(ctx.window(m))),
        Metric("gpu_idle_launch_ns", lost_ns, "ns"),
        Metric("kernel_count", k.count, "count"),
        Metric("kernels_under_10us_pct", round(short, 1), "%", "kernels"),
        Metric("kernel_median_ns", k.p50_ns, "ns"),
        Metric("kernel_total_ns", k.total_ns, "ns"),
        Metric("launch_count", k.launch_count, "count"),
        Metric("launch_total_ns", k.launch_total_ns, "ns"),
    ]
    if launch_mean_ns is not None and ratio is not None:
        metrics.append(Metric("launch_mean_ns", int(launch_mean_ns), "ns"))
        metrics.append(Metric("launch_to_median_kernel_ratio", round(ratio, 3), "ratio"))
    if k.launch_to_kernel_ratio is not None:
        metrics.append(Metric("launch_to_kernel_time_ratio", round(k.launch_to_kernel_ratio, 3), "ratio"))
    if k.median_launch_delay_ns is not None:
        metrics.append(Metric("median_launch_delay_ns", k.median_launch_delay_ns, "ns"))
    settings = []
    location = None
    kind = code_kind(ctx, m)
    compiled = list(kind.wrappers)
    dl = ctx.main_dataloader()
    notes: list[str] = []
    expected, expected_note = launch_fraction(COMPILE_LAUNCH_REDUCTION, 1.0), _EXPECTED_NOTE
    if dl is not None:
        settings.append(SettingRef("DataLoader.batch_size", dl.batch_size, location_of(dl.call_site)))
    if compiled:
        settings.append(SettingRef("torch.compile", compiled[0].options.get("mode", "default"), location_of(compiled[0].call_site)))
        location = location_of(compiled[0].call_site)
    if kind.stats is not None:
        metrics.extend(_compiled_metrics(kind))
    if kind.mostly_compiled:
        instruction, before, after, expected, expected_note = _compiled_advice(ctx, kind, dl, notes)
    else:
        bs = dl.batch_size if dl is not None and dl.batch_size else None
        bigger = f" (batch_size={bs} now)" if bs else ""
        instruction = (
            f"Give the GPU more work per launch: raise the batch size{bigger}, compile the model with "
            "`torch.compile`, use a fused optimizer (GD404); CUDA graphs for what remains."
        )
        before = "model = Net().cuda()\nopt = torch.optim.AdamW(model.parameters())"
        after = "model = torch.compile(Net().cuda())\nopt = torch.optim.AdamW(model.parameters(), fused=True)"
        if kind.compiled and kind.compiled_launch_pct is not None:
            # partly compiled: what launches one kernel at a time is the eager rest
            instruction = (
                f"Most launches come from eager code: {fmt_pct(100.0 - kind.compiled_launch_pct)} of kernels "
                "are launched outside compiled regions and graphs. Compile that code too (`torch.compile` on "
                f"the functions or modules the step runs eagerly), raise the batch size{bigger}, use a fused "
                "optimizer (GD404)."
            )
            notes.append(f"partly compiled: {fmt_pct(kind.compiled_launch_pct)} of kernels are launched inside "
                         "compiled code or issued by graph launches")
        if location is None and dl is not None:
            location = location_of(dl.call_site)
    if kind.stats is not None and kind.stats.graph_kernels:
        notes.append(f"{kind.stats.graph_kernels:,} GPU activities were issued by {kind.stats.graph_launches:,} "
                     f"{kind.graph_api} graph launch(es): the gaps between them are not launch overhead (the graph "
                     "queued them; docs/account.md)")
    finding = ctx.finding(
        message,
        Fix(instruction, before, after),
        share_pct=at_stake,
        confidence=confidence,
        metrics=metrics,
        time_ranges=ctx.gap_ranges(m, GapCause.LAUNCH_BOUND, GapCause.SHORT),
        settings=settings,
        location=location,
        gain_note=gain_note,
        rank=m.rank,
        claims=[(Component.LAUNCH_OVERHEAD, None)],
        ledger=ledger,
        notes=notes,
        expected=expected,
        expected_note=expected_note,
    )
    return RuleResult.fired(finding)


def _compiled_metrics(kind: CodeKind) -> list[Metric]:
    st = kind.stats
    assert st is not None
    out = [Metric("compiled_launch_pct", kind.compiled_launch_pct, "%", "kernels issued")]
    if st.triton_kernels:
        out.append(Metric("triton_kernel_time_pct", st.triton_pct, "%", "kernel time"))
    if st.graph_launches:
        out.append(Metric("graph_launches", st.graph_launches, "count"))
        out.append(Metric("graph_issued_kernels", st.graph_kernels, "count"))
    if st.region_calls or st.compiled_function_calls:
        out.append(Metric("compiled_frames", len(st.frames) or None, "count"))
    return out


def _compile_issues(ctx: RuleContext, kind: CodeKind) -> list[str]:
    """Graph breaks and recompilations where the run or the trace shows them: what keeps work out of
    one graph (or recompiles it), in words."""
    out: list[str] = []
    state = compile_state(ctx)
    if state is not None and state.graph_breaks:
        reason, n = max(state.graph_breaks.items(), key=lambda kv: kv[1])
        total = sum(state.graph_breaks.values())
        out.append(f"{total} graph break{'s' if total != 1 else ''} (most often: {reason}, ×{n})")
    elif kind.stats is not None and len(kind.stats.frames) > 1:
        out.append(f"{len(kind.stats.frames)} compiled frames per step (graph breaks, or several compiled functions)")
    comp = compilations(state)
    if comp is not None and comp.recompiles:
        out.append(f"{len(comp.recompiles)} recompilation{'s' if len(comp.recompiles) != 1 else ''} in "
                   f"{step_range(comp.steps) or 'the run'} (GD105)")
    if comp is not None and comp.limit_hits:
        out.append("the recompile limit was reached: a frame runs eagerly from then on (GD105)")
    return out


def _compiled_advice(ctx: RuleContext, kind: CodeKind, dl, notes: list[str]) -> tuple[str, str, str, float | None, str]:  # noqa: ANN001
    """The fix for launch-bound compiled code: CUDA graphs (one launch per compiled graph) or a larger
    batch, never torch.compile again; graph breaks and recompilations named where seen. Returns
    (instruction, before, after, expected fraction, its model in words)."""
    st = kind.stats
    bs = dl.batch_size if dl is not None and dl.batch_size else None
    bigger = f"raise the batch size (batch_size={bs} now)" if bs else "raise the batch size"
    issues = _compile_issues(ctx, kind)
    issue_text = (": " + "; ".join(issues) + ", each keeps work out of one graph") if issues else ""
    where = f"{fmt_pct(kind.compiled_launch_pct)} of kernels are launched inside compiled code or by graphs" \
        if kind.compiled_launch_pct is not None else "torch.compile is in use"
    expected: float | None = None
    model = ""
    if kind.graphed and st is not None:
        eager = st.eager_launches
        instruction = (
            f"The step is compiled and already replays {kind.graph_api} graphs ({st.graph_launches:,} launches issuing "
            f"{st.graph_kernels:,} kernels): what is left is the launching outside them ({eager:,} launch calls). "
            f"Capture more of the step in the graph (fewer graph breaks{issue_text}), or {bigger}."
        )
        before = "model = torch.compile(model, mode=\"reduce-overhead\")  # graph breaks split the step"
        after = ("model = torch.compile(model, mode=\"reduce-overhead\", fullgraph=True)  # one graph; fix what breaks it\n"
                 + (f"loader = DataLoader(dataset, batch_size={bs * 2})" if bs else "loader = DataLoader(dataset, batch_size=2 * batch_size)"))
        return instruction, before, after, expected, model
    mode = kind.mode
    if mode in ("reduce-overhead", "max-autotune"):
        notes.append(f"mode={mode!r} is set but the trace shows no graph launch: CUDA graphs were skipped "
                     "(dynamic shapes, CPU tensors, in-place updates of inputs …; TORCH_LOGS=perf_hints says why)")
    instruction = (
        f"The model is already compiled ({where}): add CUDA graphs with "
        "`torch.compile(model, mode=\"reduce-overhead\")`, which replays each compiled graph with one launch "
        f"instead of one per kernel, or {bigger}"
        + (f". Keep the step in few graphs{issue_text}." if issues else ".")
        + " A fused optimizer (GD404) cuts the optimizer's launches."
    )
    before = "model = torch.compile(model)"
    after = "model = torch.compile(model, mode=\"reduce-overhead\")  # CUDA graphs: one launch per graph"
    if st is not None and st.launches and st.region_launches:
        graphs = st.region_calls or (st.compiled_function_calls + st.compiled_backward_calls) or st.graph_calls
        expected = launch_fraction(st.launches, st.launches - st.region_launches + graphs)
        model = (f"CUDA graphs replay each compiled graph with one launch: {st.region_launches:,} of "
                 f"{st.launches:,} launch calls are inside compiled code, {graphs:,} graph launches would replace them")
    return instruction, before, after, expected, model


# --------------------------------------------------------------------------- CPU runs: dispatch-bound


# The largest jump in batch size the fix suggests at once: beyond it the learning-rate schedule
# (linear scaling, warm-up) needs retuning more than a rule can say. Goyal et al. scale by up to 32×
# with the linear rule and warm-up; 64× is the sample script's own fix (4 → 256).
_MAX_BATCH_FACTOR = 64


def _suggested_batch(batch_size: int, overhead_pct: float, target_pct: float) -> int:
    """The batch that would bring the measured overhead share to ``target_pct`` if the rest of the
    step grew linearly with the batch: k× the batch turns a share f into f / (f + k(1 - f)), so
    k = f(1 - target) / ((1 - f) target), rounded up to a power of two, between 2× and
    ``_MAX_BATCH_FACTOR``×."""
    f = min(max(overhead_pct / 100.0, 0.0), 0.999)
    target = min(max(target_pct / 100.0, 0.001), 0.999)
    factor = f * (1.0 - target) / ((1.0 - f) * target)
    k = 2
    while k < factor and k < _MAX_BATCH_FACTOR:
        k *= 2
    return batch_size * k


def _typical_step_range(m: TraceMetrics, typical_ns: int) -> list[TimeRange]:
    """The profiled step closest to the typical one, to open in a trace viewer."""
    if not m.steps:
        return []
    s = min(m.steps, key=lambda w: (abs((w.end_ns - w.start_ns) - typical_ns), w.step))
    return [TimeRange(s.start_ns, s.end_ns, f"ProfilerStep#{s.step}: the profiled step closest to the typical one")]


def _judge_cpu(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    result = _judge_cpu_steps(ctx, m)
    few = too_few_steps(m.dispatch) if m.dispatch is not None and result.verdict == Verdict.FINE else None
    return RuleResult.cannot_judge(f"{few} (one step read: {result.reason})") if few else result


def _judge_cpu_steps(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    d = m.dispatch
    if d is None or d.ops_per_step <= 0 or d.typical_step_ns <= 0:
        return RuleResult.cannot_judge("no GPU, and no CPU ops in the trace's steps to measure per-op overhead on")
    cut = fmt_ns(d.short_op_max_ns)
    short, share = d.short_op_time_pct, d.dispatch_pct
    typical = fmt_ns(d.typical_step_ns)
    if share < t.dispatch_share_pct:
        # parts of the trace's typical step, not of the run's steps: the DataLoader's part is named for
        # what the trace measures (its ranges), apart from the summary's "waiting for data" (every steady step)
        parts = [
            (d.op_ns - d.short_op_ns, f"ops of {cut} or more"),
            (d.long_gap_ns, f"Python gaps over {fmt_ns(d.glue_gap_max_ns)}"),
            (d.dataloader_ns, "DataLoader ranges"),
        ]
        where = ", ".join(f"{name} {fmt_pct(100.0 * ns / d.typical_step_ns)}" for ns, name in parts if ns > 0)
        return RuleResult.fine(
            f"no GPU; per-op overhead (ops under {cut} and the glue between ops) is {fmt_pct(share)} of a "
            f"typical profiled step ({typical} in the trace; threshold {t.dispatch_share_pct:g}%)"
            + (f": the rest of that step is {where}" if where else "")
        )
    dl = ctx.main_dataloader()
    bs = dl.batch_size if dl is not None and dl.batch_size else None
    if bs:
        per_sample = d.ops_per_step / bs
        if per_sample < t.dispatch_ops_per_sample_count:
            return RuleResult.fine(
                f"no GPU; per-op overhead is {fmt_pct(share)} of a typical step ({typical}), but each sample "
                f"costs only {per_sample:,.1f} ops ({d.ops_per_step:,.0f} per step at batch_size={bs}; threshold "
                f"{t.dispatch_ops_per_sample_count:g}): the ops' fixed cost is shared by enough samples"
            )
        confidence = Confidence.MEASURED
        why = f"{d.ops_per_step:,.0f} ops per step, {per_sample:,.0f} per sample (batch_size={bs})"
    else:
        if short < t.dispatch_short_op_time_pct:
            return RuleResult.fine(
                f"no GPU; per-op overhead is {fmt_pct(share)} of a typical step ({typical}), but the ops carry work "
                f"of their own: {fmt_pct(short)} of op time is in ops under {cut} (threshold "
                f"{t.dispatch_short_op_time_pct:g}%; the batch size is unknown)"
            )
        confidence = Confidence.INFERRED  # no batch size: short ops stand in for "too few samples per op"
        why = f"{d.ops_per_step:,.0f} ops per step"
    ledger = ctx.ledger(m)
    measured = ledger.pct(Component.LAUNCH_OVERHEAD, Component.OPTIMIZER) if ledger is not None else None
    message = (
        f"dispatch-bound (CPU): per-op overhead is {fmt_pct(share)} of a typical step ({typical}): {why}, "
        f"{fmt_pct(short)} of op time in ops under {cut} (median op {fmt_ns(d.op_self_median_ns)}), "
        f"{fmt_ns(d.glue_ns)} of glue between ops"
        + (f"; with the optimizer's step, {fmt_pct(measured)} of the measured step time" if measured is not None else "")
    )
    metrics = [
        Metric("ops_per_step", d.ops_per_step, "count"),
        Metric("top_level_ops_per_step", d.top_level_ops_per_step, "count"),
        Metric("op_self_median_ns", d.op_self_median_ns, "ns"),
        Metric("short_op_time_pct", round(short, 1), "%", "op self time of the typical step"),
        Metric("dispatch_overhead_pct", round(share, 1), "%", "typical step"),
        Metric("typical_step_ns", d.typical_step_ns, "ns"),
        Metric("profiled_step_median_ns", d.step_median_ns, "ns", "the trace's steps"),
        Metric("short_op_ns", d.short_op_ns, "ns"),
        Metric("glue_ns", d.glue_ns, "ns"),
        Metric("op_ns", d.op_ns, "ns"),
        Metric("long_gap_ns", d.long_gap_ns, "ns"),
        Metric("dataloader_ns", d.dataloader_ns, "ns"),
        Metric("steps_aligned", d.aligned),
    ]
    if bs:
        metrics.insert(1, Metric("ops_per_sample", round(d.ops_per_step / bs, 1), "count"))
    notes = []
    if d.top_short_ops:
        notes.append("short ops with the most time per typical step: " + "; ".join(
            f"{s.name} ×{s.count} ({fmt_ns(s.total_ns)})" for s in d.top_short_ops
        ))
    if d.step_median_ns > t.dispatch_disturbed_ratio * d.typical_step_ns:
        notes.append(
            f"the profiled steps took a median {fmt_ns(d.step_median_ns)}, "
            f"{d.step_median_ns / d.typical_step_ns:.1f}× the typical step: the process waited for a CPU "
            "(other load on the machine) in some ops and gaps; the shares are of the typical step"
        )
    settings: list[SettingRef] = []
    location = None
    kind = code_kind(ctx, m)
    compiled = list(kind.wrappers)
    training = bool(m.optimizer_steps) or bool(m.backward_ops)
    expected, expected_note = launch_fraction(COMPILE_LAUNCH_REDUCTION, 1.0), _EXPECTED_NOTE
    if dl is not None:
        location = location_of(dl.call_site)
        settings.append(SettingRef("DataLoader.batch_size", dl.batch_size, location))
    if compiled:
        settings.append(SettingRef("torch.compile", compiled[0].options.get("mode", "default"),
                                   location_of(compiled[0].call_site)))
    if bs:
        new_bs = _suggested_batch(bs, share, t.dispatch_target_share_pct)
        bigger = (
            f"raise the batch size (batch_size={bs} now; {new_bs} would bring this overhead near "
            f"{t.dispatch_target_share_pct:g}% of the step if the rest grows with the batch"
            + ("; scale the learning rate with it)" if training else ")")
        )
        before = dataloader_call(dl)
        after = dataloader_call(dl, batch_size=new_bs)
    else:
        bigger = "raise the batch size" + (" (scale the learning rate with it)" if training else "")
        before, after = "loader = DataLoader(ds, batch_size=4)", "loader = DataLoader(ds, batch_size=256)"
    if kind.compiled:
        # compiled code: torch.compile again would change nothing, and CUDA graphs do not exist on a CPU
        issues = _compile_issues(ctx, kind)
        what = (f"torch.compile at {location_of(compiled[0].call_site)}" if compiled and compiled[0].call_site
                else "the trace shows compiled regions")
        instruction = (
            f"Give each op more work: {bigger}. The model is already compiled ({what}): what is left is the fixed "
            "cost of each op and call, which a larger batch shares among more samples"
            + ("; " + "; ".join(issues) if issues else "") + "."
        )
        if kind.stats is not None:
            metrics.extend(_compiled_metrics(kind))
        if bs:
            expected = launch_fraction(new_bs, bs)
            expected_note = (f"the per-op overhead is paid once per batch: batch_size={new_bs} pays it once for "
                             f"{new_bs // bs}x the samples (per sample, 1 - {bs}/{new_bs} of it goes)")
        else:
            expected, expected_note = None, ""
    else:
        instruction = (
            f"Give each op more work: {bigger}, so that the same ops process more samples for the same "
            "overhead; compile the model with `torch.compile` to fuse small ops and remove the Python "
            "between them" + ("." if training else "; evaluate with fewer, larger ops (one batched call "
                                                 "instead of a loop of small ones).")
        )
        after += "\nmodel = torch.compile(model)"
    finding = ctx.finding(
        message,
        Fix(instruction, before, after),
        share_pct=share,
        confidence=confidence,
        metrics=metrics,
        time_ranges=_typical_step_range(m, d.typical_step_ns),
        settings=settings,
        notes=notes,
        location=location,
        gain_note="per-op overhead (ops under 10 µs and the glue between ops) and the optimizer's step, of the "
        "measured steps: a larger batch shares both among more samples",
        rank=m.rank,
        claims=[(Component.LAUNCH_OVERHEAD, None), (Component.OPTIMIZER, None)],
        ledger=ledger,
        expected=expected,
        expected_note=expected_note,
    )
    return RuleResult.fired(finding)


def _model_share(ctx: RuleContext) -> tuple[float | None, str]:
    """Share of step time in the model's calls (forward, backward, optimizer.step()) from the
    steps' phase times, and the split in words; None without them (or without a watched forward)."""
    phases = ctx.phase_shares_pct()
    if phases is None or phases["forward"] is None:
        return None, ""
    keys = ("forward", "backward", "optimizer")
    share = sum(phases[k] or 0.0 for k in keys)
    split = ", ".join(f"{k} {fmt_pct(phases[k])}" for k in keys if phases[k]) or "none"
    return share, f"{split}; the loop's own work {fmt_pct(phases['other'])}"


def check(ctx: RuleContext) -> RuleResult:
    # A CPU run: no GPU at all, or a script that trains on the CPU of a machine with one.
    on_cpu = not ctx.has_gpu() or (
        ctx.settings is not None and ctx.settings.device_type == "cpu" and not ctx.gpu_traces()
    )
    t = ctx.thresholds
    model_pct, split = _model_share(ctx)
    if model_pct is not None and model_pct < t.model_calls_min_share_pct:
        return RuleResult.fine(
            f"the model's calls take {fmt_pct(model_pct)} of step time ({split}; threshold "
            f"{t.model_calls_min_share_pct:g}%): per-op overhead inside them cannot set the step time"
        )

    def judge(m: TraceMetrics) -> RuleResult:
        if on_cpu and not m.has_gpu_activity:
            result = _judge_cpu(ctx, m)
        else:
            result = _judge(ctx, m)
        if model_pct is None or not result.findings:
            return result
        note = f"steps' phase times (every step): the model's calls take {fmt_pct(model_pct)} of step time ({split})"
        findings = tuple(
            replace(f, evidence=replace(
                f.evidence,
                metrics=(*f.evidence.metrics, Metric("model_calls_share_pct", round(model_pct, 1), "%", "steps")),
                notes=(*f.evidence.notes, note),
            ))
            for f in result.findings
        )
        return RuleResult(result.verdict, result.reason, findings)

    return ctx.per_trace(judge)


RULE = Rule(
    code="GD103",
    name="launch-bound",
    title="Ops too small: kernel launches (GPU) or per-op dispatch (CPU) set the step time",
    doc=__doc__,
    check=check,
    needs={Need.TRACE},
    self_checked={Need.TRACE},
    not_injectable="fewer, larger ops (a larger batch, CUDA graphs, torch.compile) change numerics or need a code change",
)
