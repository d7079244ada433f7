"""Derived metrics of one trace: what ``analysis/`` computes and rules and reports read.

Every percentage says which window it is of (``Window.kind``). Durations are in
nanoseconds (``*_ns``), sizes in bytes, bandwidth in GB/s (1e9 bytes per second).
Renderers show these numbers as they are; they compute none of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from gpudoctor.model._serde import Serde


class WindowKind(str, Enum):
    STEPS = "steps"  # union of the ProfilerStep#N windows
    SPAN = "span"  # first to last GPU activity (the "span idle %" of shared/traces/README.md)
    HTA = "hta"  # the ProfilerStep iterations Holistic Trace Analysis keeps (complete ones)
    TRACE = "trace"  # the whole trace (no ProfilerStep markers)


@dataclass(frozen=True, slots=True)
class Window(Serde):
    kind: WindowKind
    start_ns: int
    end_ns: int
    description: str = ""  # "5 ProfilerStep windows (#10..#14)", "first to last GPU activity"

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class StepWindow(Serde):
    step: int  # N of ProfilerStep#N (or the run's step index)
    start_ns: int
    end_ns: int


class GapCause(str, Enum):
    DATALOADER = "dataloader"  # host in enumerate(DataLoader)#…__next__
    SYNC = "sync"  # host blocked in a synchronization
    LAUNCH_BOUND = "launch_bound"  # host busy launching, could not keep up
    SHORT = "short"  # kernel-to-kernel gap too short to matter individually
    OTHER = "other"  # host busy elsewhere (Python, CPU ops, …)


@dataclass(frozen=True, slots=True)
class IdleGap(Serde):
    device: int
    start_ns: int
    end_ns: int
    cause: GapCause
    detail: str = ""  # the host event that explains it ("cudaStreamSynchronize", op name …)
    step: int | None = None


@dataclass(frozen=True, slots=True)
class GapCauseTotal(Serde):
    cause: GapCause
    count: int
    total_ns: int
    share_of_idle_pct: float  # of all idle time in the window named by DeviceUtilization.gaps_window
    top_detail: str = ""  # the most frequent detail


@dataclass(frozen=True, slots=True)
class HistogramBin(Serde):
    lo_ns: int
    hi_ns: int  # exclusive
    count: int
    total_ns: int


@dataclass(frozen=True, slots=True)
class UtilizationBin(Serde):
    """Share of one time bucket in which the device ran a kernel, memcpy or memset."""

    start_ns: int
    end_ns: int
    busy_pct: float  # of end_ns - start_ns


@dataclass(frozen=True, slots=True)
class DeviceUtilization(Serde):
    device: int
    busy_ns_span: int
    span: Window
    idle_pct_span: float  # of WindowKind.SPAN
    busy_ns_steps: int | None = None
    idle_pct_steps: float | None = None  # of WindowKind.STEPS (None without ProfilerStep)
    steps_window: Window | None = None
    idle_pct_hta: float | None = None  # of WindowKind.HTA (None when no complete iteration)
    hta_window: Window | None = None
    gaps_window: WindowKind = WindowKind.SPAN  # which window the gaps below were cut from
    gap_count: int = 0
    gaps_over_1ms: int = 0
    gap_causes: tuple[GapCauseTotal, ...] = ()
    gap_histogram: tuple[HistogramBin, ...] = ()
    top_gaps: tuple[IdleGap, ...] = ()  # the longest ones (bounded)
    busy_timeline: tuple[UtilizationBin, ...] = ()  # busy % over the span in equal buckets (bounded, ~100)


class Component(str, Enum):
    """Parts of a step. Where they overlap, ``gpudoctor.analysis.breakdown.PRIORITY`` decides:
    GPU activity first (gpu_compute > h2d > d2h, as torch-tb-profiler's overview), then what
    the host did while the GPU was idle (data_loading > sync_wait > optimizer > other_cpu),
    then idle."""

    DATA_LOADING = "data_loading"
    SYNC_WAIT = "sync_wait"
    H2D = "h2d"
    D2H = "d2h"
    GPU_COMPUTE = "gpu_compute"
    OPTIMIZER = "optimizer"
    OTHER_CPU = "other_cpu"
    IDLE = "idle"  # neither host nor device doing anything we can name


@dataclass(frozen=True, slots=True)
class StepBreakdown(Serde):
    """Where one step's time went. ``sum(parts.values()) == dur_ns``."""

    step: int
    start_ns: int
    dur_ns: int
    parts_ns: dict[str, int]  # Component.value -> ns


@dataclass(frozen=True, slots=True)
class TransferStat(Serde):
    direction: str  # "HtoD", "DtoH", "DtoD", "HtoH", "memset"
    memory_kind: str  # "pageable", "pinned", "device", "unknown"
    count: int
    bytes: int
    dur_ns: int
    bandwidth_gbps: float | None
    blocking_count: int = 0  # issued by a synchronous cudaMemcpy or followed by a stream sync
    max_bytes: int = 0
    per_step_count: float | None = None  # count / number of steps (None without steps)
    blocking_dur_ns: int | None = None  # time of the blocking ones (None: not measured)
    steps_with: int | None = None  # steps with at least one such transfer (None without steps)


@dataclass(frozen=True, slots=True)
class NameStat(Serde):
    """An aggregate over events with one name (kernels, ops)."""

    name: str
    count: int
    total_ns: int
    max_ns: int = 0
    share_pct: float = 0.0  # of the total of the same kind in the window


@dataclass(frozen=True, slots=True)
class KernelStats(Serde):
    count: int
    total_ns: int
    p50_ns: int
    p90_ns: int
    max_ns: int
    under_10us_pct: float  # share of kernels (by count) shorter than 10 µs
    launch_count: int = 0
    launch_total_ns: int = 0  # cudaLaunchKernel & co. on the host
    launch_to_kernel_ratio: float | None = None  # launch_total_ns / total_ns (HTA's launch statistics)
    median_launch_delay_ns: int | None = None  # kernel start - launch start
    tensor_core_ns: int = 0
    tensor_core_pct: float = 0.0  # of kernel time, by kernel name
    fp32_eligible_op_ns: int = 0  # conv/matmul/linear/bmm ops whose inputs were float32 (needs shapes)
    fp32_eligible_pct_of_gpu: float | None = None  # GPU time of their kernels, % of kernel time
    eligible_dtypes_known: bool = False  # shapes/dtypes were recorded
    top: tuple[NameStat, ...] = ()
    optimizer_kernels_per_step: float | None = None
    conv_kernel_ns: int | None = None  # GPU time of convolution kernels (None: not measured)
    tf32_kernel_ns: int | None = None  # GPU time of kernels whose name says TF32 (None: not measured)
    fp32_eligible_op_count: int = 0  # FP32 conv/matmul/linear/bmm ops that launched kernels (needs shapes)
    fp32_eligible_tensor_core_ns: int = 0  # part of fp32_eligible_op_ns in Tensor Core kernels (TF32 on)
    window: WindowKind = WindowKind.TRACE  # kernels that start in this window (STEPS when there are steps)


@dataclass(frozen=True, slots=True)
class HostSync(Serde):
    name: str  # cudaStreamSynchronize, aten::item, …
    ts_ns: int
    dur_ns: int
    frame: str = ""  # "train.py(42): train_step" from python_function events, when present
    step: int | None = None
    op: str = ""  # the outermost cpu_op around it ("aten::item", "aten::nonzero", "aten::copy_"), when any


@dataclass(frozen=True, slots=True)
class SyncSummary(Serde):
    count: int
    total_ns: int
    share_of_steps_pct: float | None  # of WindowKind.STEPS (or TRACE without steps)
    by_name: tuple[NameStat, ...] = ()
    by_frame: tuple[NameStat, ...] = ()  # name = frame
    top: tuple[HostSync, ...] = ()
    by_op: tuple[NameStat, ...] = ()  # name = outermost cpu_op around the sync ("aten::item" …), "" outside ops


@dataclass(frozen=True, slots=True)
class CpuSummary(Serde):
    """The CPU side of a trace (the whole breakdown for CPU-only traces)."""

    window: Window
    dataloader_ns: int
    dataloader_pct: float
    op_ns: int  # top-level cpu_op time (no double counting of nested ops)
    op_pct: float
    python_ns: int  # top-level python_function time outside ops (needs stacks)
    python_pct: float | None
    optimizer_ns: int = 0
    top_ops: tuple[NameStat, ...] = ()


@dataclass(frozen=True, slots=True)
class DispatchStats(Serde):
    """Per-op overhead on the host: how much of a typical step goes to issuing ops rather than to
    the work inside them (``gpudoctor.analysis.dispatch``; the CPU side of GD103).

    Measured on the dispatching thread (the one with the most ``cpu_op`` events in the steps),
    outside DataLoader ranges. The *typical step* takes each op's self time and each gap between
    top-level ops at its median over the steps (per position when every step repeats the same op
    sequence, ``aligned``; else ops per name and gaps per step), so that a stall that keeps the
    process off the CPU in one step does not count as work. Durations are of that typical step.
    Computed for GPU traces too (there the busiest host thread may be autograd's device thread);
    GD103 reads it only for CPU runs and judges GPU runs from ``KernelStats``.
    """

    window: WindowKind  # the windows the steps are (STEPS, or the whole trace as one step)
    steps: int
    thread: str = ""  # "pid/tid" of the dispatching thread
    aligned: bool = False  # every step ran the same op sequence: per-position medians
    ops_per_step: float = 0.0  # cpu_ops at every nesting level
    top_level_ops_per_step: float = 0.0  # calls into the dispatcher from Python / the autograd engine
    op_self_median_ns: int = 0  # median self time of one op (every instance)
    op_ns: int = 0  # self time of all ops in the typical step
    short_op_ns: int = 0  # of which in ops whose typical self time is under short_op_max_ns
    short_op_time_pct: float = 0.0  # short_op_ns, % of op_ns
    glue_ns: int = 0  # gaps between top-level ops shorter than glue_gap_max_ns (Python and framework glue)
    long_gap_ns: int = 0  # longer gaps: Python work of its own (preprocessing, logging …)
    dataloader_ns: int = 0  # in DataLoader ranges
    typical_step_ns: int = 0  # op_ns + glue_ns + long_gap_ns + dataloader_ns
    dispatch_ns: int = 0  # short_op_ns + glue_ns: the per-op overhead
    dispatch_pct: float = 0.0  # dispatch_ns, % of typical_step_ns
    step_median_ns: int = 0  # measured: median duration of the steps (a disturbed run: ≫ typical_step_ns)
    short_op_max_ns: int = 10_000  # the cuts the figures above were made with
    glue_gap_max_ns: int = 1_000_000
    top_short_ops: tuple[NameStat, ...] = ()  # short ops by self time in the typical step (count = per step)


@dataclass(frozen=True, slots=True)
class MemoryStats(Serde):
    device: int
    peak_allocated_bytes: int | None = None  # from [memory] events
    peak_reserved_bytes: int | None = None
    total_bytes: int | None = None
    cuda_malloc_count: int = 0
    cuda_free_count: int = 0
    empty_cache_count: int = 0
    alloc_api_ns: int | None = None  # host time in cudaMalloc/cudaFree (None: not measured)
    alloc_calls_after_first_step: int | None = None  # cudaMalloc/cudaFree after the first step (None without steps)


@dataclass(frozen=True, slots=True)
class StepComm(Serde):
    """Collective communication inside one ProfilerStep window (of one ``CommStats``)."""

    step: int  # N of ProfilerStep#N
    dur_ns: int  # the step window
    comm_ns: int  # collective time inside it (union)
    exposed_ns: int  # of which nothing else ran at the same time (see CommStats.exposed_ns)


@dataclass(frozen=True, slots=True)
class CommStats(Serde):
    """Collective communication on one device (device -1: host-side gloo collectives).

    On a GPU, communication is the union of NCCL/RCCL kernels and it is exposed where no
    other kernel, memcpy or memset runs on that device. On the host (device -1, CPU-only
    traces), communication is the union of the ``gloo:``/``nccl:`` … collective ranges the
    process group records (on its own threads) and it is exposed where no ``cpu_op`` runs
    on any other thread (the training thread is waiting for its peers).
    """

    device: int
    kernel_count: int = 0  # NCCL/RCCL kernels
    comm_ns: int = 0  # union of their intervals
    exposed_ns: int = 0  # comm time with no compute kernel running at the same time
    exposed_pct: float | None = None  # exposed_ns, % of comm_ns
    share_of_busy_pct: float | None = None  # comm_ns, % of the device's busy time
    host_ops: int = 0  # record_function ranges "nccl:all_reduce", "gloo:all_reduce" … on the host
    host_ns: int = 0  # their union on the host
    top: tuple[NameStat, ...] = ()  # by collective (kernel or host op name)
    per_step: tuple[StepComm, ...] = ()  # one per ProfilerStep window (empty without ProfilerStep markers)


@dataclass(frozen=True, slots=True)
class DeviceInfo(Serde):
    index: int
    name: str = ""
    compute_capability: str | None = None  # "8.0"
    total_memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class TraceMetrics(Serde):
    """Everything ``analysis/`` derives from one trace."""

    path: str
    has_gpu_activity: bool
    platform: str = "cuda"  # "cuda", "rocm" or "cpu"
    schema: str = "kineto"  # "kineto" or "kineto-legacy" (2021 categories)
    ts_unit: str = "us"  # resolution the timestamps were written in ("us" or "ns")
    event_count: int = 0
    unknown_categories: dict[str, int] = field(default_factory=dict)
    rank: int | None = None
    world_size: int | None = None
    devices: tuple[DeviceInfo, ...] = ()
    step_source: str = "trace"  # "ProfilerStep" or "trace" (whole trace, one window)
    steps: tuple[StepWindow, ...] = ()
    windows: tuple[Window, ...] = ()
    utilization: tuple[DeviceUtilization, ...] = ()
    breakdown: tuple[StepBreakdown, ...] = ()
    breakdown_mean_pct: dict[str, float] = field(default_factory=dict)  # Component -> % of step time
    transfers: tuple[TransferStat, ...] = ()
    kernels: KernelStats | None = None
    syncs: SyncSummary | None = None
    cpu: CpuSummary | None = None
    dispatch: DispatchStats | None = None  # per-op overhead on the host (None: no cpu_op in the steps)
    memory: tuple[MemoryStats, ...] = ()
    has_stacks: bool = False
    has_shapes: bool = False
    conv_shapes_total: int | None = None  # distinct (op, input shapes) of convolution ops in the window (needs shapes)
    conv_shapes_max_per_step: int | None = None  # the most distinct ones in a single step (fixed shapes: total == this)
    autograd_forward_ops: int | None = None  # top-level forward cpu_ops autograd recorded ("Sequence number")
    backward_ops: int | None = None  # backward ops (autograd::engine::evaluate_function …)
    optimizer_steps: int | None = None  # Optimizer.step#… annotations
    host_loss_ops: tuple[NameStat, ...] = ()  # loss ops (*_loss, cross_entropy …) that launched no GPU kernel
    host_loss_after_d2h: int | None = None  # of those, the ones preceded in their step by a device→host copy
    comm: tuple[CommStats, ...] = ()  # collectives per device (NCCL/RCCL kernels; gloo ops on the host)
    backend: str = ""  # distributedInfo.backend of the trace ("nccl", "gloo" …; "" when absent)
    notes: tuple[str, ...] = ()  # "no ProfilerStep markers: the whole trace is one window", …
