"""Device memory: allocator peaks, the device's size, and calls into the CUDA/HIP allocator; and the run's
memory figures (``MemoryFigures``, ``RunFigures.memory``: the GPU's size, the machine's, each trace's peak).

Peaks come from the caching allocator's ``[memory]`` events (``profile_memory=True``):
the largest "Total Allocated" and "Total Reserved" seen on each device. ``cudaMalloc`` /
``cudaFree`` (and ``hipMalloc`` / ``hipFree``) calls carry no device in the trace; they
are counted on the device with the most GPU time. Calls after the first step mean the
caching allocator had to go back to the driver in steady state (fragmentation, growing
shapes, or ``empty_cache``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.findings import Metric, RunData
from gpudoctor.model.metrics import DeviceInfo, MemoryStats, TraceMetrics
from gpudoctor.model.selectors import device_total_bytes


def memory_stats(
    view: TraceView, devices: tuple[DeviceInfo, ...], run: RunData | None = None, windows: Windows | None = None
) -> tuple[MemoryStats, ...]:
    windows = windows or view.windows
    total_of = {d.index: d.total_memory_bytes for d in devices}
    mem_devs = {int(d) for d in np.unique(view.m_device) if d >= 0}
    primary = view.primary_device
    wanted = sorted(set(view.devices) | mem_devs | ({primary} if primary is not None else set()))
    if not wanted:
        return ()
    names = view.names
    malloc = view.is_runtime & view.host_is(names.malloc_call)
    free = view.is_runtime & view.host_is(names.free_call)
    after = None
    if windows.from_steps:
        first_end = int(windows.ends[0])
        after = int(((malloc | free) & (view.h_ts >= first_end)).sum())
    empty_cache = run.settings.empty_cache_count if run is not None and run.settings is not None else 0
    out = []
    for d in wanted:
        m = view.m_device == d
        peak_a = int(view.m_alloc[m].max()) if m.any() else None
        peak_r = int(view.m_reserved[m].max()) if m.any() else None
        is_primary = d == primary
        out.append(
            MemoryStats(
                device=d,
                peak_allocated_bytes=peak_a if peak_a is None or peak_a >= 0 else None,
                peak_reserved_bytes=peak_r if peak_r is None or peak_r >= 0 else None,
                total_bytes=total_of.get(d),
                cuda_malloc_count=int(malloc.sum()) if is_primary else 0,
                cuda_free_count=int(free.sum()) if is_primary else 0,
                empty_cache_count=empty_cache if is_primary else 0,
                alloc_api_ns=int(view.h_dur[malloc | free].sum()) if is_primary else None,
                alloc_calls_after_first_step=after if is_primary else None,
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------- the run's memory figures


@dataclass(frozen=True, slots=True)
class MemoryPeak:
    """The highest memory figure known for a GPU, and the device's size."""

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


@dataclass(frozen=True, slots=True)
class MemoryFigures:
    """The run's memory figures (``RunFigures.memory``): the GPU's size, the machine's, and each trace's peak."""

    device_total_bytes: int | None = None  # the GPU's memory (None: not recorded)
    host_total_bytes: int | None = None  # the machine's physical memory (psutil; None: not recorded)
    # (trace path, its rank, its allocator peak: ``trace_peak``), one per trace of the run
    peaks: tuple[tuple[str, int | None, MemoryPeak | None], ...] = ()
    sampled_peak: MemoryPeak | None = None  # NVML's used memory at its highest (None: no such sample)

    def holds(self, m: TraceMetrics) -> bool:
        """Whether ``m`` is one of the run's traces (the figures hold its peak)."""
        return any(path == m.path and rank == m.rank for path, rank, _ in self.peaks)

    def peak(self, m: TraceMetrics | None) -> MemoryPeak | None:
        """The highest memory figure known for the GPU of ``m`` (its rank's allocator peak, else NVML's);
        None without one."""
        if m is not None:
            found = next((p for path, rank, p in self.peaks if path == m.path and rank == m.rank), None)
            if found is not None:
                return found
        return self.sampled_peak


def trace_peak(m: TraceMetrics, metrics: tuple[TraceMetrics, ...], total_default: int | None) -> MemoryPeak | None:
    """The allocator peak (reserved, else allocated) of ``m`` or another trace of its rank (``--memory``
    records it in the detailed window only), as a share of the device's memory; None without one."""
    best: MemoryPeak | None = None
    mine = [m, *(x for x in metrics if x.rank == m.rank and x is not m)]
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
    return best


def memory_figures(run: RunData) -> MemoryFigures:
    """The memory figures of ``run`` (``analysis.figures.run_figures``)."""
    total = device_total_bytes(run)
    sampled = None
    samples = [g for g in (run.samples.gpu if run.samples else ()) if g.mem_used_bytes is not None]
    if samples:
        top = max(samples, key=lambda g: g.mem_used_bytes or 0)
        top_total = top.mem_total_bytes or total
        if top_total and top.mem_used_bytes is not None:
            sampled = MemoryPeak(top.mem_used_bytes, top_total, "NVML used")
    return MemoryFigures(
        device_total_bytes=total,
        host_total_bytes=run.samples.system_memory_bytes if run.samples is not None else None,
        peaks=tuple((m.path, m.rank, trace_peak(m, run.metrics, total)) for m in run.metrics),
        sampled_peak=sampled,
    )
