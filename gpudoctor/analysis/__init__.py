"""Derived metrics of one trace: ``analyze_trace(timeline, run) -> TraceMetrics``.

Every metric is a pure function of a ``TraceView`` (numpy views on the ``Timeline``)
with its own module and unit tests:

- ``view``: windows (ProfilerStep#N, or the whole trace), correlation lookups;
- ``timelines``: each step's host span (its ProfilerStep range) and device span (the work it
  launched, tied by correlation ids), which of the two limits it, and the windows the device-side
  metrics and the account are measured over (a device-bound step's window is on the device's
  timeline, docs/account.md);
- ``utilization``: busy/idle per device over the span, the steps and HTA's window;
  idle gaps and their causes, histogram, busy timeline;
- ``ledger``: where each step's time went, in exclusive parts that sum to it
  (docs/account.md): busy time by what ran, idle time by the cause of each gap;
  ``weight``: a ledger adjusted to its accounting window (a detailed window's shape split,
  the profiler's weight against the unprofiled steps); ``accounting``: the accounting window and
  the ledgers by (rank, basis) a run's findings claim from, once per diagnosis;
- ``transfers``, ``kernels``, ``syncs``, ``host`` (CPU side, op facts), ``dispatch``
  (per-op overhead on the host), ``memory``, ``comm``, ``compiled`` (torch.compile and CUDA
  graphs).

This package imports only the model and numpy (never torch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpudoctor.analysis.comm import comm_stats
from gpudoctor.analysis.compiled import compiled_stats
from gpudoctor.analysis.dispatch import dispatch_stats
from gpudoctor.analysis.host import cpu_summary, op_facts
from gpudoctor.analysis.kernels import kernel_stats
from gpudoctor.analysis.ledger import mean_pct, trace_ledger
from gpudoctor.analysis.memory import memory_stats
from gpudoctor.analysis.names import dataloader_iter_kind
from gpudoctor.analysis.roofline import roofline
from gpudoctor.analysis.syncs import sync_summary
from gpudoctor.analysis.timelines import step_timelines, timelines_note
from gpudoctor.analysis.transfers import transfer_stats
from gpudoctor.analysis.utilization import HostState, device_utilization, idle_gaps
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.findings import RunData
from gpudoctor.model.metrics import DeviceInfo, TraceMetrics, Window, WindowKind
from gpudoctor.model.selectors import busiest_device
from gpudoctor.model.trace import Timeline

__all__ = ["Beside", "TraceView", "analyze_trace", "dropped_events_note"]

# runs passes that need nothing but the view on another core, if it can: given the passes, it
# returns a function that gives their results in order (pipeline's forked process; None: here)
Beside = Callable[[Sequence[Callable[[], Any]]], Callable[[], list[Any]]]


def _devices(timeline: Timeline, run: RunData | None) -> tuple[DeviceInfo, ...]:
    if timeline.info.devices:
        return timeline.info.devices
    if run is not None and run.manifest is not None and run.manifest.devices:
        return tuple(
            DeviceInfo(index=d.index, name=d.name, compute_capability=d.compute_capability,
                       total_memory_bytes=d.total_memory_bytes)
            for d in run.manifest.devices
        )
    return ()


def dropped_events_note(dropped: dict[str, int]) -> str:
    """What a report says about the malformed events the parser left out."""
    why = ", ".join(f"{n:,} {reason}" for reason, n in sorted(dropped.items()))
    return f"{sum(dropped.values()):,} malformed event(s) dropped, not analyzed: {why}"


def analyze_trace(timeline: Timeline, run: RunData | None = None, beside: Beside | None = None) -> TraceMetrics:
    """Every metric of one trace. ``run`` adds what the trace lacks (devices, rank,
    ``empty_cache`` calls) when the trace comes from a run directory. ``beside``: where the
    host-side passes (CPU summary, dispatch, syncs), the transfer and kernel tables and the
    roofline, about half of the work, may run while this process computes the rest; the metrics are the same
    wherever they run."""
    view = TraceView(timeline)
    info = timeline.info
    windows = view.windows  # the host's: each ProfilerStep range, where the step's work was enqueued
    host = HostState(view)
    # each step on the timeline that limits it (analysis.timelines): the device-side passes and the
    # account read these windows, the host-side passes the ProfilerStep ranges
    timelines = step_timelines(view, windows, view.primary_device, host)
    acct = timelines.account if timelines is not None else windows
    devices = _devices(timeline, run)
    side: list[Callable[[], Any]] = [
        lambda: cpu_summary(view, windows),
        lambda: dispatch_stats(view, windows),
        lambda: sync_summary(view, windows),
        lambda: transfer_stats(view, acct),
        lambda: kernel_stats(view, acct, launch_windows=windows),
        lambda: roofline(view, acct, devices),
    ]
    side_results = beside(side) if beside is not None else None
    notes: list[str] = []
    gap_tables = {d: idle_gaps(view, d, acct, host) for d in view.devices}
    utilization = tuple(device_utilization(view, d, acct, host, gaps=gap_tables[d]) for d in view.devices)
    win_list: list[Window] = []
    if acct.from_steps and utilization and utilization[0].steps_window is not None:
        win_list.append(utilization[0].steps_window)
    elif acct.from_steps:
        win_list.append(Window(WindowKind.STEPS, int(acct.starts[0]), int(acct.ends[-1]), acct.describe()))
    primary = view.primary_device
    for u in utilization:
        if u.device == primary:
            win_list.append(u.span)
            if u.hta_window is not None:
                win_list.append(u.hta_window)
    win_list.append(Window(WindowKind.TRACE, windows.trace_start, windows.trace_end, "first to last event of the trace"))
    facts = op_facts(view, windows)
    rank = info.rank
    world = info.world_size
    if run is not None and run.manifest is not None:
        rank = rank if rank is not None else run.manifest.rank
        world = world if world is not None else run.manifest.world_size
    # the ledger is of the device the rules judge: the one busiest over its span (view.primary_device's)
    busiest = busiest_device(utilization)
    name = timeline.path.replace("\\", "/").rsplit("/", 1)[-1]
    breakdown, ledger = trace_ledger(
        view,
        acct,
        gap_tables.get(busiest.device) if busiest is not None else None,
        busiest,
        key=f"trace:{timeline.path}",
        label=f"rank {rank}" if rank is not None else name,
        rank=rank,
        timelines=timelines.summary if timelines is not None else None,
    )
    if not windows.from_steps:
        notes.append(
            "no ProfilerStep markers: the span of GPU activity is one window (breakdown[0] covers it)"
            if busiest is not None else "no ProfilerStep markers: the whole trace is one window (breakdown[0] covers it)"
        )
    if info.unknown_categories:
        cats = ", ".join(f"{k} ({v})" for k, v in info.unknown_categories.items())
        notes.append(f"events of unknown categories were not analyzed: {cats}")
    if info.dropped_events:
        notes.append(dropped_events_note(info.dropped_events))
    if info.parser == "streaming":
        notes.append("read with the streaming parser (the header is not where a Kineto trace has it)")
    if not view.is_activity.any():
        notes.append("no GPU activity (kernels, memcpys, memsets) in this trace: CPU-side metrics only")
    memory = memory_stats(view, devices, run, windows)
    comm = comm_stats(view, acct)
    compiled = compiled_stats(view, windows, device_windows=acct)
    cpu, dispatch, syncs, transfers, kernels, roof = side_results() if side_results is not None else [f() for f in side]
    for u in utilization:
        if u.hta_window is not None and windows.from_steps:
            notes.append(f"device {u.device}: {u.hta_window.description}")
    if timelines is not None and timelines.summary.device_bound_steps:
        notes.append(timelines_note(timelines.summary))
    return TraceMetrics(
        path=timeline.path,
        has_gpu_activity=bool(view.is_activity.any()),
        platform=info.platform,
        schema=info.schema,
        ts_unit=info.ts_unit,
        event_count=info.event_count,
        unknown_categories=dict(info.unknown_categories),
        rank=rank,
        world_size=world,
        devices=devices,
        step_source="ProfilerStep" if windows.from_steps else "trace",
        steps=windows.steps,
        windows=tuple(win_list),
        utilization=utilization,
        breakdown=breakdown,
        breakdown_mean_pct=mean_pct(breakdown, ledger.basis if ledger is not None else ""),
        ledger=ledger,
        transfers=transfers,
        kernels=kernels,
        syncs=syncs,
        cpu=cpu,
        dispatch=dispatch,
        memory=memory,
        has_stacks=bool(info.with_stack and view.is_python.any()),
        has_shapes=bool(info.record_shapes and (view.h_types >= 0).any()),
        conv_shapes_total=facts.conv_shapes_total,
        conv_shapes_max_per_step=facts.conv_shapes_max_per_step,
        autograd_forward_ops=facts.autograd_forward_ops,
        forward_ops=facts.forward_ops,
        loss_ops=facts.loss_ops,
        backward_ops=facts.backward_ops,
        optimizer_steps=facts.optimizer_steps,
        host_loss_ops=facts.host_loss_ops,
        host_loss_after_d2h=facts.host_loss_after_d2h,
        comm=comm,
        backend=info.backend,
        dataloader_iter=dataloader_iter_kind(view),
        roofline=roof,
        compiled=compiled,
        timelines=timelines.summary if timelines is not None else None,
        notes=tuple(notes),
    )
