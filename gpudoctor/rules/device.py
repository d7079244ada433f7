"""The GPU in a finding: its memory peak, whether it limits every profiled step, and its NVML samples
taken while the steps ran."""

from __future__ import annotations

from collections.abc import Sequence

from gpudoctor.analysis import figures
from gpudoctor.analysis.memory import MemoryPeak, trace_peak
from gpudoctor.model.metrics import TraceMetrics
from gpudoctor.model.run import GpuSample, StepRecord
from gpudoctor.model.units import duration_text
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_pct


def memory_peak(ctx: RuleContext, m: TraceMetrics | None) -> MemoryPeak | None:
    """The highest memory figure known for the run's GPU: the allocator peak (reserved, else allocated)
    of ``m`` or another trace of its process (``--memory`` records it in the detailed window only), else
    NVML's used memory (the run's figures: ``RunFigures.memory``)."""
    mem = ctx.figures.memory
    if m is not None and not mem.holds(m):  # a trace that is not the run's own
        return trace_peak(m, ctx.metrics, mem.device_total_bytes) or mem.sampled_peak
    return mem.peak(m)


def device_limited(m: TraceMetrics) -> str | None:
    """Why the host's launches and batch size do not set the step time, when the device limits every
    profiled step of ``m`` (``TraceMetrics.timelines``: the device ran behind the host, waiting for it,
    and on its dependencies, under the cut): the reason in words; None when some step waits for the host (or no timelines)."""
    t = m.timelines
    if t is None or not t.steps or t.device_bound_steps < len(t.steps):
        return None
    return (f"the GPU limits all {len(t.steps)} profiled steps (it waited for the host, and on other streams, "
            f"events or collectives, under {t.device_bound_wait_pct:g}% of each, busy {fmt_pct(t.device_busy_pct)}"
            + (f"; the host runs {duration_text(t.lead_ns)} ahead)" if t.lead_ns else ")"))


def steps_span(ctx: RuleContext, steps: Sequence[StepRecord] | None = None) -> tuple[int, int] | None:
    """When ``steps`` (default: the steady steps) ran, from the run's start (ns), at the rate the loop
    sustains (``analysis.figures.steps_span``); None without steps."""
    return figures.steps_span(ctx.steady_steps() if steps is None else steps)


def gpu_samples_in_steps(ctx: RuleContext, device: int | None = None) -> tuple[tuple[GpuSample, ...], str]:
    """NVML samples of ``device`` (every device when None) taken while the steady steps ran
    (``steps_span``), and which they are ("while the steady steps ran"); every sample ("over the run")
    when none was taken then or the run has no steps."""
    samples = tuple(g for g in ctx.samples_gpu() if device is None or g.index == device)
    span = steps_span(ctx)
    if span is not None:
        inside = tuple(g for g in samples if span[0] <= g.t_ns <= span[1])
        if inside:
            return inside, "while the steady steps ran"
    return samples, "over the run"
