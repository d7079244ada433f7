"""Compiled and graphed execution as the rules and the summary read it: one place that says
whether a step runs compiled (the settings read at run time, else the trace), how much of
its launching is compiled or graphed, and what torch.compile did when (warm-up,
recompilations). GD103 fits its advice to it, GD105 judges the recompilations, and the
engine's summary names it (``compiled_summary``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpudoctor.model.metrics import CompiledStats, TraceMetrics
from gpudoctor.model.run import CompileEvent, CompileState, WrapSetting
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of

#: Kernels of a step at least this share issued from compiled code or graphs: the step's code is
#: compiled (the advice is for compiled code); below it the eager part is what launches (the
#: advice is torch.compile). Half: whichever issues most of the kernels.
COMPILED_LAUNCH_SHARE = 0.5


def compile_wrappers(ctx: RuleContext) -> list[WrapSetting]:
    """The script's ``torch.compile`` calls, as read at run time."""
    s = ctx.settings
    return [w for w in (s.wrappers if s is not None else ()) if w.kind == "torch.compile"]


def compile_state(ctx: RuleContext) -> CompileState | None:
    s = ctx.settings
    return s.compile if s is not None else None


def _cid(event: CompileEvent) -> tuple[int, int] | None:
    """(frame, compilation) of a compile id "F/C" (None when it is not one)."""
    try:
        f, c = event.compile_id.split("/", 1)
        return int(f), int(c)
    except ValueError:
        return None


def is_recompilation(event: CompileEvent) -> bool:
    """A compilation of a frame after its first (``C`` > 0 in "F/C"), counted once: the forward
    trace (the backward graph compiled with it is part of the same recompilation)."""
    cid = _cid(event)
    return cid is not None and cid[1] > 0 and event.trigger != "lazy_backward"


def reason_text(reason: str) -> str:
    """A recompile reason without the compile id Dynamo puts first ("0/3: tensor 'x' …")."""
    head, sep, rest = reason.partition(": ")
    return rest if sep and "/" in head and head.replace("/", "").isdigit() else reason


@dataclass(frozen=True, slots=True)
class Compilations:
    """What torch.compile did, in the run's steps: the warm-up (each frame's first compilation) and
    the recompilations after it, frame by frame."""

    events: tuple[CompileEvent, ...]
    warmup_steps: tuple[int, ...]  # steps with a frame's first compilation
    warmup_ns: int  # compile time of those first compilations (forward and backward)
    recompiles: tuple[CompileEvent, ...]  # forward compilations after a frame's first, in order
    recompile_ns: int  # compile time of the recompilations (forward and backward)
    by_frame: dict[int, tuple[CompileEvent, ...]] = field(default_factory=dict)  # frame -> its recompilations
    limit_hits: tuple[CompileEvent, ...] = ()  # refused at the recompile limit: the frame runs eagerly

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(sorted({e.step for e in self.recompiles if e.step is not None}))

    def top_reason(self, events: tuple[CompileEvent, ...] | None = None) -> tuple[str, int]:
        """The most common recompile reason (without the id) and how often."""
        reasons = Counter(_generic(reason_text(e.reason)) for e in (events or self.recompiles) if e.reason)
        if not reasons:
            return "", 0
        generic, n = reasons.most_common(1)[0]
        example = next(reason_text(e.reason) for e in (events or self.recompiles)
                       if e.reason and _generic(reason_text(e.reason)) == generic)
        return example, n


def _generic(reason: str) -> str:
    """A reason with its numbers blanked, so that "expected 8, actual 9" and "expected 9, actual 10"
    count as one."""
    return "".join("#" if ch.isdigit() else ch for ch in reason)


def compilations(state: CompileState | None) -> Compilations | None:
    if state is None or not state.events:
        return None
    events = state.events
    firsts = [e for e in events if (c := _cid(e)) is not None and c[1] == 0]
    recompiles = tuple(e for e in events if is_recompilation(e) and not e.failed)
    recompiled_ids = {e.compile_id for e in recompiles}
    by_frame: dict[int, list[CompileEvent]] = {}
    for e in recompiles:
        cid = _cid(e)
        if cid is not None:
            by_frame.setdefault(cid[0], []).append(e)
    return Compilations(
        events=events,
        warmup_steps=tuple(sorted({e.step for e in firsts if e.step is not None})),
        warmup_ns=sum(e.dur_ns or 0 for e in firsts),
        recompiles=recompiles,
        recompile_ns=sum(e.dur_ns or 0 for e in events if e.compile_id in recompiled_ids and not e.failed),
        by_frame={f: tuple(v) for f, v in by_frame.items()},
        limit_hits=tuple(e for e in events if e.failed and "limit" in e.failed.lower()),
    )


def step_range(steps: tuple[int, ...] | list[int]) -> str:
    """"step 3", "steps 1-7", "steps 1, 4 and 9" …"""
    steps = sorted(set(steps))
    if not steps:
        return ""
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}-{steps[-1]}"
    shown = ", ".join(str(s) for s in steps[:6])
    return f"steps {shown}" + (f" … {steps[-1]}" if len(steps) > 6 else "")


# --------------------------------------------------------------------------- the step's code


@dataclass(frozen=True, slots=True)
class CodeKind:
    """How a trace's step issues its work: compiled (regions, generated kernels), graphed (CUDA / HIP
    graph launches), or eager, and the share of kernels issued from compiled code or graphs."""

    compiled: bool  # torch.compile is at work (the settings or the trace say so)
    graphed: bool  # the trace shows graph launches
    mostly_compiled: bool  # most kernels are issued from compiled code or graphs: the advice is for compiled code
    # kernels launched inside compiled code or issued by graph launches, % of all kernels issued (each
    # eager launch call issues one, each graph launch its graph's); None: no launches counted
    compiled_launch_pct: float | None
    stats: CompiledStats | None
    wrappers: tuple[WrapSetting, ...] = ()
    graph_api: str = "CUDA"  # "HIP" on ROCm

    @property
    def mode(self) -> str | None:
        """``mode=`` of the first torch.compile call (None: default, or not read)."""
        for w in self.wrappers:
            mode = w.options.get("mode")
            if mode:
                return str(mode)
        return None


def code_kind(ctx: RuleContext, m: TraceMetrics) -> CodeKind:
    stats = m.compiled
    wrappers = tuple(compile_wrappers(ctx))
    graphed = bool(stats is not None and stats.graph_launches)
    traced_compiled = bool(stats is not None and stats.compiled)
    pct = None
    # kernels issued from compiled code or graphs, of all kernels issued (a graph launch issues many)
    issued = stats.graph_kernels + stats.launches - stats.graph_launches if stats is not None else 0
    if stats is not None and issued > 0:
        pct = 100.0 * (stats.graph_kernels + stats.region_launches) / issued
    if pct is not None and (stats is not None and (stats.region_calls or stats.compiled_function_calls or graphed)):
        mostly = pct >= 100.0 * COMPILED_LAUNCH_SHARE
    else:  # no launches to count (a CPU trace) or no region to count them in: what says compiled decides
        mostly = bool(wrappers) or traced_compiled
    api = "HIP" if m.platform == "rocm" else "CUDA"
    return CodeKind(compiled=bool(wrappers) or traced_compiled, graphed=graphed, mostly_compiled=mostly,
                    compiled_launch_pct=round(pct, 1) if pct is not None else None, stats=stats,
                    wrappers=wrappers, graph_api=api)


# --------------------------------------------------------------------------- the summary line


def compiled_summary(ctx: RuleContext, m: TraceMetrics | None) -> str | None:
    """One line for the report's summary: what runs compiled or graphed and what torch.compile did
    ("62.0% of kernel time in Triton kernels; 25 CUDA graph launches issuing 1,900 kernels; …").
    None when neither the settings nor the trace show compiled or graphed execution."""
    parts: list[str] = []
    stats = m.compiled if m is not None else None
    wrappers = compile_wrappers(ctx)
    if wrappers:
        w = wrappers[0]
        shown = {"mode": bool(w.options.get("mode")), "backend": bool(w.options.get("backend")),
                 "dynamic": w.options.get("dynamic") is not None, "fullgraph": w.options.get("fullgraph") is True}
        opts = ", ".join(f"{k}={w.options[k]}" for k, show in shown.items() if show)
        loc = location_of(w.call_site)
        parts.append(f"torch.compile({opts})" + (f" at {loc}" if loc else "")
                     + (f" and {len(wrappers) - 1} more" if len(wrappers) > 1 else ""))
    if stats is not None:
        api = "HIP" if m is not None and m.platform == "rocm" else "CUDA"
        if stats.triton_kernels:
            share = "under 0.1%" if stats.triton_pct is not None and stats.triton_pct < 0.05 else fmt_pct(stats.triton_pct)
            parts.append(f"{share} of kernel time in Triton kernels ({stats.triton_kernels:,} of {stats.kernels:,} kernels)")
        if stats.cpp_kernels:
            parts.append(f"{stats.cpp_kernels:,} Inductor C++ kernel calls ({fmt_ns(stats.cpp_ns)})")
        if stats.graph_launches:
            n = stats.graph_launches
            parts.append(f"{n:,} {api} graph launch{'es' if n != 1 else ''} issuing {stats.graph_kernels:,} kernels"
                         + (f" ({fmt_pct(stats.graph_kernel_pct)} of kernel time)" if stats.graph_kernel_pct else ""))
        regions = stats.region_calls or stats.compiled_function_calls or stats.graph_calls
        if regions:
            per = regions / max(stats.windows, 1)
            what = ("compiled region" if stats.region_calls else
                    "compiled function" if stats.compiled_function_calls else "compiled graph call")
            text = f"{per:,.1f} {what}s per step" if stats.windows > 1 else f"{regions:,} {what} call{'s' if regions != 1 else ''}"
            if len(stats.frames) > 1:
                text += f" ({len(stats.frames)} frames: graph breaks or several compiled functions)"
            if stats.launches and stats.region_launches:
                text += f", {fmt_pct(100.0 * stats.region_launches / stats.launches)} of kernel launches inside them"
            parts.append(text)
    comp = compilations(compile_state(ctx))
    if comp is not None:
        if comp.warmup_steps:
            parts.append(f"warm-up: {fmt_ns(comp.warmup_ns)} compiling in {step_range(comp.warmup_steps)}")
        if comp.recompiles:
            n = len(comp.recompiles)
            reason, _ = comp.top_reason()
            parts.append(f"{n} recompilation{'s' if n != 1 else ''} in {step_range(comp.steps) or 'the run'}"
                         + (f" ({reason})" if reason else ""))
        if comp.limit_hits:
            state = compile_state(ctx)
            limit = state.recompile_limit if state is not None else None
            parts.append("recompile limit" + (f" ({limit})" if limit else "") + " reached: "
                         f"{len(comp.limit_hits)} frame{'s' if len(comp.limit_hits) != 1 else ''} run eagerly from then on")
    if not parts:
        return None
    return "; ".join(parts)
