"""Which trace, which device, which DataLoader and which steps a figure is of: chosen once, here.

The engine's summary, the rules (through ``rules.context.RuleContext``), ``compare`` and the
analysis layer pick "the" trace of a run, "the" device of a trace, "the" DataLoader of a
script and "the" steady steps with these functions, so that one figure has one value in every
output. Pure functions of the model: no torch, no I/O.

- :func:`primary_trace`: the trace a run's (or one rank's) headline figures come from;
- :func:`busiest_device`: the device of a trace that its figures are of;
- :func:`trace_label`: how a message names a trace ("rank 3", else its file name);
- :func:`device_cc`, :func:`device_total_bytes`: the run's (first) GPU, its compute capability and memory;
- :func:`main_dataloader`, :func:`steady_steps` (with :func:`compile_steps`): in
  ``model.steady``, re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpudoctor.model.findings import RunData
from gpudoctor.model.metrics import DeviceUtilization, TraceMetrics
from gpudoctor.model.steady import compile_steps, main_dataloader, steady_steps

__all__ = ["busiest_device", "compile_steps", "device_cc", "device_total_bytes", "main_dataloader", "primary_trace",
           "steady_steps", "trace_label"]


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


def trace_label(m: TraceMetrics) -> str:
    """How a message names a trace: "rank 3" in multi-rank jobs, else the file name."""
    if m.rank is not None:
        return f"rank {m.rank}"
    return m.path.replace("\\", "/").rsplit("/", 1)[-1]


def device_cc(run: RunData) -> tuple[str, float | None]:
    """Name and compute capability of the run's (first) GPU, from a trace or the manifest ("", None: no GPU)."""
    for m in run.metrics:
        for d in m.devices:
            if d.compute_capability:
                return d.name, _cc(d.compute_capability)
    if run.manifest is not None:
        for d in run.manifest.devices:
            if d.compute_capability:
                return d.name, _cc(d.compute_capability)
    for m in run.metrics:
        for d in m.devices:
            return d.name, None
    return "", None


def device_total_bytes(run: RunData) -> int | None:
    """The memory of the run's (first) GPU: from a trace, else the manifest, else the NVML samples."""
    for m in run.metrics:
        for mem in m.memory:
            if mem.total_bytes:
                return mem.total_bytes
        for d in m.devices:
            if d.total_memory_bytes:
                return d.total_memory_bytes
    if run.manifest is not None:
        for d in run.manifest.devices:
            if d.total_memory_bytes:
                return d.total_memory_bytes
    for g in (run.samples.gpu if run.samples else ()):
        if g.mem_total_bytes:
            return g.mem_total_bytes
    return None


def _cc(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
