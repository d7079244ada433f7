"""Which trace, which device, which DataLoader and which steps a figure is of: chosen once, here.

The engine's summary, the rules (through ``rules.context.RuleContext``), ``compare`` and the
analysis layer pick "the" trace of a run, "the" device of a trace, "the" DataLoader of a
script and "the" steady steps with these functions, so that one figure has one value in every
output. Pure functions of the model: no torch, no I/O.

- :func:`primary_trace`: the trace a run's (or one rank's) headline figures come from;
- :func:`busiest_device`: the device of a trace that its figures are of;
- :func:`main_dataloader`, :func:`steady_steps` (with :func:`compile_steps`): in
  ``model.steady``, re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpudoctor.model.metrics import DeviceUtilization, TraceMetrics
from gpudoctor.model.steady import compile_steps, main_dataloader, steady_steps

__all__ = ["busiest_device", "compile_steps", "main_dataloader", "primary_trace", "steady_steps"]


def primary_trace(metrics: Iterable[TraceMetrics], rank: int | None = None, *,
                  with_ledger: bool = False) -> TraceMetrics | None:
    """The trace a run's headline figures come from: the first with GPU activity, else the first,
    lowest rank first (a trace without a rank before rank 0). ``rank``: of that rank's traces
    (when the traces carry ranks). ``with_ledger``: only the traces with a ledger (the account
    and the findings' shares are of a ledger)."""
    pool = [m for m in metrics if m.ledger is not None] if with_ledger else list(metrics)
    if rank is not None and any(m.rank is not None for m in pool):
        pool = [m for m in pool if m.rank == rank]
    if not pool:
        return None
    gpu = [m for m in pool if m.has_gpu_activity]
    return min(gpu or pool, key=lambda m: m.rank if m.rank is not None else -1)


def busiest_device(utilization: Iterable[DeviceUtilization] | TraceMetrics | None) -> DeviceUtilization | None:
    """The utilization of the device busiest over its span (the most time with GPU activity:
    ``busy_ns_span``; the first, the lowest index, on ties): the device a trace's ledger, its
    rules and its figures are of (``analysis.view.TraceView.primary_device`` picks the same one
    from the events). Takes a trace's ``utilization`` or the trace; None without a device."""
    if utilization is None:
        return None
    devices = utilization.utilization if isinstance(utilization, TraceMetrics) else tuple(utilization)
    if not devices:
        return None
    return max(devices, key=lambda u: u.busy_ns_span)
