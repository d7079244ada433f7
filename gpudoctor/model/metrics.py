"""Derived metrics of one trace: what ``analysis/`` computes and rules and reports read.

Every percentage says which window it is of (``Window.kind``). Durations are in
nanoseconds (``*_ns``), sizes in bytes, bandwidth in GB/s (1e9 bytes per second).
Renderers show these numbers as they are; they compute none of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from gpudoctor.model._serde import Serde
from gpudoctor.model.kinds import LedgerBasis, SliceSource  # noqa: F401 - re-exported: the ledger's fields
from gpudoctor.model.timelines import Timelines


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
    DEPENDENCY = "dependency"  # the work was queued: the GPU waited on another stream, an event or a collective


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
    """The exclusive parts of a step: the ledger of ``gpudoctor.analysis.ledger`` (docs/account.md).

    On a GPU trace the device-side parts are time the busiest GPU was busy (only faster
    kernels, copies or hidden communication win them), the host-side parts time it was idle,
    by the cause of each idle gap (only host-side fixes win them). On a CPU-only trace every
    part is host time. ``forward`` and ``backward`` come from per-step phase times of a run
    without a trace."""

    # device side: the GPU is busy
    GPU_FP32_CONV = "gpu_fp32_conv"  # convolution kernels of float32 ops (Tensor-Core eligible)
    GPU_FP32_MATMUL = "gpu_fp32_matmul"  # kernels of float32 matmul / linear / attention ops
    GPU_CONV = "gpu_conv"  # other convolution kernels (half precision, or dtype unknown)
    GPU_MATMUL = "gpu_matmul"  # kernels of matmul / linear / attention ops in another precision (bf16, fp16 …; needs shapes)
    GPU_OPTIMIZER = "gpu_optimizer"  # kernels launched inside Optimizer.step
    GPU_COMPUTE = "gpu_compute"  # every other kernel, memset, device-to-device copy
    H2D = "h2d"  # only a host→device copy runs
    D2H = "d2h"  # only a device→host copy runs
    COMM_EXPOSED = "comm_exposed"  # only communication runs (GPU), or a collective no op hides (CPU)
    # host side: the GPU is idle (or there is no GPU)
    DATA_LOADING = "data_loading"  # waiting in DataLoader.__next__
    SYNC_WAIT = "sync_wait"  # the host blocked in a synchronization or synchronous copy while the GPU idled
    LAUNCH_OVERHEAD = "launch_overhead"  # the host issuing ops (GPU: in runtime calls and short ops, launch latency; CPU: per-op overhead)
    OPTIMIZER = "optimizer"  # the host in Optimizer.step
    CPU_COMPUTE = "cpu_compute"  # CPU only: the self time of ops of 10 µs or more (the work)
    FORWARD = "forward"  # run without a trace: host time in the root module's forward
    BACKWARD = "backward"  # run without a trace: host time in backward()
    OTHER_CPU = "other_cpu"  # other host work: Python between ops, long CPU ops, I/O
    DEPENDENCY_WAIT = "dependency_wait"  # the next work was queued: the GPU waited on a stream, event or collective
    UNEXPLAINED = "unexplained"  # nothing the profile records accounts for it


#: What each part means to a person (reports, the account's headline).
COMPONENT_LABELS: dict[str, str] = {
    Component.GPU_FP32_CONV.value: "FP32 convolutions",
    Component.GPU_FP32_MATMUL.value: "FP32 matmuls",
    Component.GPU_CONV.value: "convolutions",
    Component.GPU_MATMUL.value: "matmuls",
    Component.GPU_OPTIMIZER.value: "optimizer kernels",
    Component.GPU_COMPUTE.value: "other kernels",
    Component.H2D.value: "host→device copies",
    Component.D2H.value: "device→host copies",
    Component.COMM_EXPOSED.value: "exposed communication",
    Component.DATA_LOADING.value: "waiting for the DataLoader",
    Component.SYNC_WAIT.value: "host synchronizations",
    Component.LAUNCH_OVERHEAD.value: "launch and dispatch overhead",
    Component.OPTIMIZER.value: "the optimizer on the host",
    Component.CPU_COMPUTE.value: "op work (CPU)",
    Component.FORWARD.value: "forward (host)",
    Component.BACKWARD.value: "backward (host)",
    Component.OTHER_CPU.value: "other host work (Python, CPU ops)",
    Component.DEPENDENCY_WAIT.value: "waiting on another stream, event or collective",
    Component.UNEXPLAINED.value: "unexplained",
}

#: Parts in which the GPU is busy; every other part is host-side (the GPU idle, or no GPU).
DEVICE_COMPONENTS: frozenset[Component] = frozenset(
    {
        Component.GPU_FP32_CONV,
        Component.GPU_FP32_MATMUL,
        Component.GPU_CONV,
        Component.GPU_MATMUL,
        Component.GPU_OPTIMIZER,
        Component.GPU_COMPUTE,
        Component.H2D,
        Component.D2H,
    }
)


@dataclass(frozen=True, slots=True)
class StepBreakdown(Serde):
    """Where one step's time went: the ledger of one window. ``sum(parts_ns.values()) == dur_ns``."""

    step: int
    start_ns: int
    dur_ns: int
    parts_ns: dict[str, int]  # Component.value -> ns


@dataclass(frozen=True, slots=True)
class LedgerSlice(Serde):
    """One part of a ledger, over all its windows."""

    component: str  # Component.value
    ns: int  # over all windows of the ledger
    pct: float  # of Ledger.total_ns
    side: str  # "device" (the GPU busy: only faster kernels win it) or "host" (the GPU idle, or no GPU)
    detail: str = ""  # what mostly caused it ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
    source: SliceSource = SliceSource.UNSTATED  # what measured it
    after_sync_ns: int = 0  # of ns: GPU idle in gaps a synchronization began (the queue drained), GPU ledgers


@dataclass(frozen=True, slots=True)
class WindowWeight(Serde):
    """The profiler's weight on the steps a ledger's windows recorded (docs/account.md, "The accounting window")."""

    ratio: float  # window_step_ns / bare_step_ns
    window_step_ns: int  # median of the recorded steps the ledger's windows hold
    bare_step_ns: int  # median of the steady steps no instrument ran in
    window_steps: int
    bare_steps: int
    source: str  # what timed both: "CUDA events" (the rate the loop sustains) or "wall"
    scaled: bool = False  # the host-side parts were scaled to the unprofiled step (ratio above the threshold)
    removed_ns: int = 0  # host time the scaling took out of the ledger (all its windows)
    waits_removed_ns: int = 0  # of it, what the host's work could not hold: taken out of its waits
    scaled_windows: int = 0  # the windows of the trace ledger the scaling took it out of


@dataclass(frozen=True, slots=True)
class Ledger(Serde):
    """Step time split into exclusive parts that sum to it, exactly: ``sum(s.ns for s in slices) == total_ns``."""

    key: str  # which ledger: "trace:<path>", "steps" or "steps+trace:<path>" (claims name it)
    basis: LedgerBasis  # GPU (a trace, from the GPU's point of view), CPU (a CPU-only trace), STEPS (per-step records)
    label: str  # how a report names it: "rank 0", "train.pt.trace.json.gz", "120 steady steps"
    window: str  # what the windows are: "5 ProfilerStep windows", "the span of GPU activity", …
    windows: int  # number of windows (steps)
    total_ns: int
    slices: tuple[LedgerSlice, ...] = ()  # non-zero parts, in Component order
    device: int | None = None  # the GPU the ledger is of (basis "gpu")
    rank: int | None = None
    notes: tuple[str, ...] = ()
    device_windows: int = 0  # of the windows, steps on the device's timeline (the device limits them; basis "gpu")
    lead_ns: int | None = None  # how far the host ran ahead of the device in those steps (median)
    weight: WindowWeight | None = None  # against the unprofiled steps (None: too few of them, or a bare trace)

    @property
    def step_ns(self) -> float:  # mean time of one window
        return self.total_ns / self.windows if self.windows else 0.0

    def ns(self, *components: Component | str) -> int:
        keys = {c.value if isinstance(c, Component) else c for c in components}
        return sum(s.ns for s in self.slices if s.component in keys)

    def pct(self, *components: Component | str) -> float:
        return 100.0 * self.ns(*components) / self.total_ns if self.total_ns else 0.0

    def get(self, component: Component | str) -> LedgerSlice | None:
        key = component.value if isinstance(component, Component) else component
        return next((s for s in self.slices if s.component == key), None)

    @property
    def idle_pct(self) -> float:  # the host-side share: GPU idle on a GPU ledger
        return sum(s.pct for s in self.slices if s.side == "host")


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
    fp32_conv_op_ns: int | None = None  # part of fp32_eligible_op_ns launched by convolution ops (any kernel name)
    half_tensor_core_ns: int | None = None  # Tensor Core kernels neither TF32 by name nor of float32 ops: reduced precision
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
class DevicePeak(Serde):
    """A GPU's dense peak throughput and memory bandwidth: an entry of ``analysis.peaks``' table."""

    name: str  # the table's entry: "A100 SXM4 80GB", "Instinct MI300X"
    fp32_tflops: float  # without Tensor Cores (AMD Instinct: the FP32 matrix peak)
    tf32_tflops: float | None  # TF32 Tensor Cores (None: none)
    half_tflops: float  # BF16/FP16 Tensor Cores, FP32 accumulate
    fp8_tflops: float | None  # FP8 Tensor Cores (None: none)
    memory_gbps: float  # device memory bandwidth
    source: str  # the datasheet or whitepaper the figures come from


@dataclass(frozen=True, slots=True)
class RooflineRow(Serde):
    """The ops of one class in one precision (``analysis.roofline``): the work their input shapes
    say they did, and how fast their kernels did it."""

    op_class: str  # "matmul", "conv", "attention", "elementwise"
    dtype: str  # "fp32", "tf32" (float32 inputs on Tensor Core kernels), "bf16", "fp16", "fp8", "fp64", "other"
    ops: int  # op instances with a kernel in the window
    kernels: int
    kernel_ns: int  # GPU time of their kernels (sum)
    estimated_flops: int  # from the input shapes
    estimated_bytes: int  # the least device-memory traffic: each input read and each output written once
    achieved_tflops: float | None = None  # estimated_flops / kernel_ns
    achieved_gbps: float | None = None  # estimated_bytes / kernel_ns
    intensity_flop_per_byte: float | None = None  # estimated_flops / estimated_bytes
    peak_tflops: float | None = None  # the device's dense peak in this precision (None: unknown device, or none)
    peak_pct: float | None = None  # achieved_tflops, % of peak_tflops
    bandwidth_pct: float | None = None  # achieved_gbps, % of the device's memory bandwidth
    bound: str = ""  # "compute" (intensity at or above the ridge peak ÷ bandwidth), "memory", "" (no peak)
    top_op: str = ""  # the op of the row with the most kernel time


@dataclass(frozen=True, slots=True)
class Roofline(Serde):
    """How close the busy parts come to the device's peak (``analysis.roofline``; needs recorded
    shapes). Matmul, convolution and attention ops are the modelled work; elementwise ops are
    memory-bound by nature and reported by bandwidth, with the chains of them ``torch.compile``
    would fuse."""

    device: int  # the GPU the figures are of (the busiest)
    device_name: str = ""  # as the trace or the manifest names it ("" when neither does)
    peak: DevicePeak | None = None  # None: the device is not in the table (no share of peak is given)
    window: WindowKind = WindowKind.TRACE  # kernels that start in this window
    window_ns: int = 0  # the time MFU is of: the ProfilerStep windows, else the span of GPU activity
    kernel_ns: int = 0  # all kernel time on the device in the window
    modelled_kernel_ns: int = 0  # of which by matmul/conv/attention ops whose FLOPs were estimated
    modelled_pct: float | None = None  # modelled_kernel_ns, % of kernel_ns
    estimated_flops: int = 0  # of the matmul/conv/attention ops
    achieved_tflops: float | None = None  # estimated_flops / modelled_kernel_ns
    peak_pct: float | None = None  # the time their FLOPs need at each row's peak, % of modelled_kernel_ns
    mfu_pct: float | None = None  # model FLOPs utilization: the same time at peak, % of window_ns
    dtype: str = ""  # the precision of most of the FLOPs
    rows: tuple[RooflineRow, ...] = ()  # by class and precision, most kernel time first
    unmodelled_ns: int = 0  # kernel time of matmul/conv/attention ops whose shapes gave no estimate
    elementwise_kernels: int = 0  # ATen elementwise kernels (by name) on the device in the window
    elementwise_ns: int = 0
    chain_min_kernels: int = 3  # a chain: this many elementwise kernels or more in a row on one stream
    chains: int = 0
    chain_kernels: int = 0
    chain_ns: int = 0
    chain_fused_ns: int = 0  # the longest kernel of each chain, summed: what the chains would take fused
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CompiledStats(Serde):
    """Compiled and graphed execution in one trace (``analysis.compiled``): what torch.compile and
    CUDA / HIP graphs leave in it. Counted in the analysis windows (``window``): kernels and host
    events that start in them."""

    window: WindowKind
    windows: int  # analysis windows (steps) the counts are over
    kernels: int = 0  # every kernel in the windows
    kernel_ns: int = 0
    triton_kernels: int = 0  # Inductor's Triton kernels (triton_poi_…, triton_red_…, triton_per_…, triton_tem_…)
    triton_ns: int = 0
    triton_pct: float | None = None  # triton_ns, % of kernel_ns (None: no kernels)
    top_triton: tuple[NameStat, ...] = ()  # by kernel time
    cpp_kernels: int = 0  # Inductor's C++ kernels on a CPU (cpp_fused_… ops)
    cpp_ns: int = 0
    graph_launches: int = 0  # cudaGraphLaunch / cuGraphLaunch / hipGraphLaunch calls
    graph_launch_ns: int = 0  # host time in those calls
    graph_kernels: int = 0  # kernels they issued (each carries its launch's correlation id)
    graph_kernel_ns: int = 0
    graph_kernel_pct: float | None = None  # graph_kernel_ns, % of kernel_ns
    graph_kernels_max: int = 0  # the most kernels one launch issued
    launches: int = 0  # every kernel launch call (graph launches too)
    region_calls: int = 0  # "Torch-Compiled Region: F/C" ranges (a call of a frame Dynamo compiled)
    regions: tuple[str, ...] = ()  # the distinct "F/C" ids seen: frame F, its compilation C (C > 0: recompiled)
    compiled_function_calls: int = 0  # AOTAutograd's CompiledFunction (a compiled forward under autograd)
    compiled_backward_calls: int = 0  # CompiledFunctionBackward
    graph_calls: int = 0  # Inductor's "## Call CompiledFxGraph" annotations
    region_launches: int = 0  # kernel launch calls inside compiled code (a region, CompiledFunction, a graph call)

    @property
    def eager_launches(self) -> int:
        """Kernel launch calls outside compiled code and graphs: issued one op at a time."""
        return max(0, self.launches - self.graph_launches - self.region_launches)

    @property
    def compiled(self) -> bool:
        """The trace shows torch.compile at work (regions, compiled functions or generated kernels)."""
        return bool(self.region_calls or self.compiled_function_calls or self.graph_calls
                    or self.triton_kernels or self.cpp_kernels)

    @property
    def frames(self) -> tuple[str, ...]:
        """The compiled frames (F of F/C): more than one per step is a graph break or several compiled functions."""
        return tuple(sorted({r.split("/", 1)[0] for r in self.regions}, key=lambda f: (len(f), f)))

    @property
    def recompiled(self) -> tuple[str, ...]:
        """Region ids of a compilation after a frame's first (C > 0): that frame was recompiled."""
        return tuple(r for r in self.regions if r.split("/", 1)[-1] not in ("", "0"))


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
    breakdown: tuple[StepBreakdown, ...] = ()  # the ledger of each window (docs/account.md)
    breakdown_mean_pct: dict[str, float] = field(default_factory=dict)  # Component -> % of the windows' time
    ledger: Ledger | None = None  # the windows' time in exclusive parts, with the detail of each
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
    forward_ops: int | None = None  # top-level forward cpu_ops, recorded by autograd or not (outside DataLoader, backward, optimizer)
    backward_ops: int | None = None  # backward ops (autograd::engine::evaluate_function …)
    optimizer_steps: int | None = None  # Optimizer.step#… annotations
    host_loss_ops: tuple[NameStat, ...] = ()  # loss ops (*_loss, cross_entropy …) that launched no GPU kernel
    loss_ops: int | None = None  # loss ops (top-level) in the windows, wherever they ran (None: no cpu_op events)
    host_loss_after_d2h: int | None = None  # of those, the ones preceded in their step by a device→host copy
    comm: tuple[CommStats, ...] = ()  # collectives per device (NCCL/RCCL kernels; gloo ops on the host)
    backend: str = ""  # distributedInfo.backend of the trace ("nccl", "gloo" …; "" when absent)
    dataloader_iter: str = ""  # "multi-process" or "single-process": the DataLoader iterator the trace shows ("" none)
    roofline: Roofline | None = None  # achieved FLOP/s and bandwidth against the device's peak (needs shapes)
    compiled: CompiledStats | None = None  # torch.compile and CUDA graphs in the trace (None: neither seen)
    timelines: Timelines | None = None  # the profiled steps on the host's and the device's timelines (None: no steps or no GPU work)
    notes: tuple[str, ...] = ()  # "no ProfilerStep markers: the whole trace is one window", …
