"""The GPU in a finding: its memory peak, whether it limits every profiled step, and its NVML samples
taken while the steps ran."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.analysis import figures
from gpudoctor.model.findings import Metric
from gpudoctor.model.metrics import TraceMetrics
from gpudoctor.model.run import GpuSample, StepRecord
from gpudoctor.model.units import duration_text
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_pct


@dataclass(frozen=True, slots=True)
class MemoryPeak:
    peak_bytes: int
    total_bytes: int
    source: str  # "reserved (trace)", "allocated (trace)", "NVML used"

    @property
    def pct(self) -> float:
        return 100.0 * self.peak_bytes / self.total_bytes

    def metrics(self) -> tuple[Metric, ...]:
        return (
            Metric("peak_memory_bytes", self.peak_bytes, "bytes"),
            Metric("peak_memory_source", self.source),
            Metric("device_memory_bytes", self.total_bytes, "bytes"),
            Metric("peak_memory_pct", round(self.pct, 1), "%", "the device"),
        )


def memory_peak(ctx: RuleContext, m: TraceMetrics | None) -> MemoryPeak | None:
    """The highest memory figure known for the run's GPU: the allocator peak (reserved, else allocated)
    of ``m`` or another trace of its process (``--memory`` records it in the detailed window only), else
    NVML's used memory."""
    total_default = ctx.device_total_bytes()
    if m is not None:
        best: MemoryPeak | None = None
        mine = [m, *(x for x in ctx.metrics if x.rank == m.rank and x is not m)]
        for mem in (mem for x in mine for mem in x.memory):
            total = mem.total_bytes or total_default
            for value, src in (
                (mem.peak_reserved_bytes, "reserved (trace)"),
                (mem.peak_allocated_bytes, "allocated (trace)"),
            ):
                if value and total:
                    cand = MemoryPeak(value, total, src)
                    if best is None or cand.pct > best.pct:
                        best = cand
                    break
        if best is not None:
            return best
    samples = [g for g in ctx.samples_gpu() if g.mem_used_bytes is not None]
    if samples:
        top = max(samples, key=lambda g: g.mem_used_bytes or 0)
        total = top.mem_total_bytes or total_default
        if total and top.mem_used_bytes is not None:
            return MemoryPeak(top.mem_used_bytes, total, "NVML used")
    return None


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
