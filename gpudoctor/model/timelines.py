"""Each profiled step on the host's and the device's timelines (``gpudoctor.analysis.timelines``,
docs/account.md "Two timelines"): part of ``TraceMetrics``."""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.model._serde import Serde


@dataclass(frozen=True, slots=True)
class StepSpan(Serde):
    """One profiled step on its two timelines (``gpudoctor.analysis.timelines``): the host's, where its
    work was enqueued (the ProfilerStep range), and the device's, where that work ran."""

    step: int  # N of ProfilerStep#N
    host_start_ns: int  # the ProfilerStep#N range on the host
    host_end_ns: int
    device_start_ns: int | None  # first start of the kernels, copies and memsets the step launched (None: none)
    device_end_ns: int | None  # last end of them
    window_start_ns: int | None  # the step on the device's timeline: from the end of the steps before's device work
    window_end_ns: int | None  # to the end of its own (None: no device window)
    activities: int  # kernels, copies and memsets tied to the step
    busy_ns: int  # device busy inside the device window
    host_wait_ns: int  # device idle inside the device window waiting for the host (not launch latency or a dependency)
    limit: str  # "device" (the device window is the step) or "host" (the host window is)
    dependency_wait_ns: int = 0  # device idle inside the device window waiting on another stream, an event or a collective


@dataclass(frozen=True, slots=True)
class Timelines(Serde):
    """The profiled steps of a trace on the host's and the device's timelines, and which limits each
    (docs/account.md, "Two timelines")."""

    device: int  # the GPU the device timeline is of (the busiest)
    steps: tuple[StepSpan, ...]
    device_bound_steps: int  # steps the device limits: their device windows are the account's
    host_bound_steps: int  # steps the host limits: their host windows are the account's
    tied_by: str  # how device work was tied to steps: "launch calls (correlation ids)", "GPU-side ProfilerStep annotations"
    tied: int  # kernels, copies and memsets tied to a profiled step
    untied: int  # not tied (launched before the profiled steps or outside them, or without a launch in the trace)
    host_step_ns: int  # mean ProfilerStep range (the host's enqueue time)
    device_step_ns: int | None  # mean device window (the device's time per step)
    device_busy_pct: float | None  # device busy, % of the device windows
    device_wait_pct: float | None  # device idle waiting for the host, % of the device windows
    lead_ns: int | None  # median over device-bound steps: the device's start of a step less the host's
    device_bound_wait_pct: float  # the cut: a step whose device waited for the host less than this % is device-bound
