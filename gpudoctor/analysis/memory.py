"""Device memory: allocator peaks, the device's size, and calls into the CUDA/HIP allocator.

Peaks come from the caching allocator's ``[memory]`` events (``profile_memory=True``):
the largest "Total Allocated" and "Total Reserved" seen on each device. ``cudaMalloc`` /
``cudaFree`` (and ``hipMalloc`` / ``hipFree``) calls carry no device in the trace; they
are counted on the device with the most GPU time. Calls after the first step mean the
caching allocator had to go back to the driver in steady state (fragmentation, growing
shapes, or ``empty_cache``).
"""

from __future__ import annotations

import numpy as np

from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.findings import RunData
from gpudoctor.model.metrics import DeviceInfo, MemoryStats


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
