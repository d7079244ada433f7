"""What a run directory holds, as typed records (see ``docs/run-directory.md``).

``collect/`` writes these (through ``to_dict``); ``parse/`` reads them back
(``from_dict``). Times are integers in nanoseconds unless the name says otherwise;
``t_ns`` / ``start_ns`` of steps and samples count from the run's start
(``Manifest.started_at_unix_ns``) on the monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from gpudoctor.model._serde import Serde
from gpudoctor.model.layout import SCHEMA_VERSION  # noqa: F401 - the run directory's, re-exported


class RunStatus(str, Enum):
    COMPLETED = "completed"  # the script returned (exit code 0 or sys.exit(n))
    STOPPED = "stopped"  # --steps N reached: "stopped after N steps", exit 0
    FAILED = "failed"  # the script raised
    INTERRUPTED = "interrupted"  # SIGINT / Ctrl-C
    KILLED = "killed"  # the child died from a signal (SIGKILL, OOM killer, …)
    RUNNING = "running"  # written at start; a manifest still saying this was never finished


@dataclass(frozen=True, slots=True)
class CallSite(Serde):
    """Where in the user's code something was set: ``file:line`` (``function`` when known)."""

    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class ExceptionInfo(Serde):
    type: str
    message: str
    call_site: CallSite | None = None  # the innermost frame in the user's code


@dataclass(frozen=True, slots=True)
class Device(Serde):
    index: int
    name: str
    total_memory_bytes: int | None = None
    compute_capability: str | None = None  # "8.0"
    multiprocessor_count: int | None = None


@dataclass(frozen=True, slots=True)
class Collected(Serde):
    """Whether one instrument produced data, and why not when it did not."""

    name: str  # "torch.profiler", "cuda", "cprofile", "nvml", "psutil", "settings", "steps"
    ok: bool
    reason: str = ""  # "no GPU in this run", "NVML: permission denied", …
    detail: str = ""  # e.g. cProfile's window: "steps 5..end of script"
    partial: bool = False  # ok, but part of its data could not be written (``reason`` says what and why)


@dataclass(frozen=True, slots=True)
class WriteError(Serde):
    """A file of the run directory that could not be written, or not completely."""

    path: str  # the file gpudoctor meant to write, relative to the run directory
    error: str  # the system's reason: "No space left on device (ENOSPC)"
    what: str = ""  # what was lost, in words: "steps 212..399 (188 of 400)"
    kept: str = ""  # what is on disk instead, relative to the run directory ("" when nothing)


@dataclass(frozen=True, slots=True)
class ProfilerSchedule(Serde):
    skip_first: int
    wait: int
    warmup: int
    active: int
    repeat: int  # 0 = repeat until the end
    record_shapes: bool
    with_stack: bool
    profile_memory: bool
    detail_windows: int = 0  # windows (from the first) that record shapes/stacks/memory; later ones timings only; 0 = all


@dataclass(frozen=True, slots=True)
class RankEnd(Serde):
    """Distributed (torchrun): how one rank's training process ended."""

    rank: int
    local_rank: int | None = None
    pid: int | None = None
    status: RunStatus = RunStatus.RUNNING  # "running": the rank never reported how it ended (killed outright)
    status_detail: str = ""
    exit_code: int | None = None
    signal: int | None = None
    exception: ExceptionInfo | None = None
    ended_ns: int | None = None  # from the run's start (monotonic clock): orders the failures
    steps_seen: int = 0
    traces: tuple[str, ...] = ()  # its trace files, relative to the run directory


@dataclass(frozen=True, slots=True)
class StepMarker(Serde):
    """What marked the steps from ``first_step`` on (``docs/run-directory.md``, "steps.jsonl")."""

    marker: str  # "optimizer", "backward", "module", "dataloader"
    first_step: int  # the first step this marker ended
    detail: str = ""  # the call that marks: "torch.optim.AdamW.step()", "Net (root module)"


@dataclass(frozen=True, slots=True)
class RootModuleUse(Serde):
    """The root module (the outermost ``nn.Module`` with parameters) and how it was called."""

    name: str  # its class: "RNNModel"
    calls: int = 0  # calls on the loop's thread
    # of them, calls whose output carried an autograd graph (grad mode on, parameters needing grad);
    # None in a run that trains (optimizer / backward marker), where it is not counted
    calls_with_grad: int | None = 0
    # calls made with the module in eval mode (``module.eval()``: an evaluation, also one inside a run that
    # trains), and of them those whose output carried an autograd graph; None in runs recorded before these
    eval_calls: int | None = None
    eval_calls_with_grad: int | None = None
    first_grad_call_site: CallSite | None = None  # where the script first called it with an output that carried a graph
    eval_grad_call_site: CallSite | None = None  # … and first did so in eval mode


@dataclass(frozen=True, slots=True)
class Manifest(Serde):
    schema_version: int
    gpudoctor_version: str
    run_id: str  # the run directory's name
    command: tuple[str, ...]  # what the user typed after `gpudoctor profile`
    script: str | None  # absolute path of the script (None with -m)
    module: str | None  # with -m
    argv: tuple[str, ...]  # sys.argv as the script saw it
    cwd: str
    started_at: str  # ISO 8601, local time with offset
    started_at_unix_ns: int
    ended_at: str | None = None
    duration_s: float | None = None
    status: RunStatus = RunStatus.RUNNING
    status_detail: str = ""  # "stopped after 40 steps", "killed by signal 9", …
    exit_code: int | None = None
    signal: int | None = None
    exception: ExceptionInfo | None = None
    versions: dict[str, str] = field(default_factory=dict)  # python, torch, cuda, cudnn, driver, nvml, gpudoctor
    hostname: str = ""
    cpu_count: int | None = None
    devices: tuple[Device, ...] = ()
    collected: tuple[Collected, ...] = ()
    profiler_owner: str = "gpudoctor"  # "gpudoctor" or "user" (the script ran torch.profiler itself)
    schedule: ProfilerSchedule | None = None
    # what marked the steps, most specific first: "optimizer", "backward", "module", "dataloader";
    # "time" (no step structure: a time-based window was recorded instead) or "none"
    step_source: str = "none"
    step_source_reason: str = ""  # in words: "loss.backward() ends each step; no optimizer object"
    step_markers: tuple[StepMarker, ...] = ()  # every marker in force, in order (the last is step_source)
    time_window_s: tuple[float, float] | None = None  # seconds of the script recorded when nothing marked steps
    root_module: RootModuleUse | None = None  # None: no module with parameters was called (or it could not be watched)
    steps_seen: int = 0
    max_steps: int | None = None  # --steps N
    traces: tuple[str, ...] = ()  # paths relative to the run directory
    rank: int | None = None
    world_size: int | None = None
    failed_rank: int | None = None  # the rank whose failure came first (the root cause), when one failed
    launcher: str = ""  # "torchrun" for a distributed job started by gpudoctor, "" for one process
    rank_ends: tuple[RankEnd, ...] = ()  # distributed: how each rank of this node ended
    write_errors: tuple[WriteError, ...] = ()  # files that could not be written (a full disk, a size limit …)
    script_sha256: str | None = None  # the script's SHA-256 when it started (verify refuses a changed script)

    def collected_ok(self, name: str) -> bool:
        return any(c.name == name and c.ok for c in self.collected)

    @property
    def status_text(self) -> str:
        """How the run ended, in words: :func:`status_text` of the status and its detail."""
        return status_text(self.status.value, self.status_detail)

    def not_collected_reason(self, name: str) -> str:
        for c in self.collected:
            if c.name == name and not c.ok:
                return c.reason
        return ""

    def warnings(self) -> list[str]:
        """What every figure of the run is to be read with, at warning level: its step figures are
        partial (step tracking stopped, or ``steps.jsonl`` could not all be written), and why."""
        return [f"the step figures are partial: {c.reason}" for c in self.collected
                if c.name == "steps" and c.partial and c.reason]


def status_text(status: str, detail: str, sep: str = " ({})") -> str:
    """A run's status with its detail: ``completed (stopped after 40 steps)``. A detail that begins
    with the status's own word stands alone: ``interrupted (SIGINT / Ctrl-C)``, never ``interrupted
    (interrupted (SIGINT / Ctrl-C))``; ``sep`` places the detail (``": {}"``: ``failed: …``)."""
    if not detail:
        return status
    if detail == status or detail.startswith(status + " "):
        return detail
    return status + sep.format(detail)


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class FlagSetting(Serde):
    """A global switch and, when the script changed it, where."""

    name: str  # "torch.backends.cudnn.benchmark"
    value: Any  # bool / str / None when unknown
    call_site: CallSite | None = None  # None: left at the default


@dataclass(frozen=True, slots=True)
class DataLoaderSetting(Serde):
    call_site: CallSite | None
    dataset: str  # class name of the dataset
    batch_size: int | None
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None  # None when num_workers == 0
    persistent_workers: bool
    drop_last: bool = False
    multiprocessing_context: str | None = None  # "fork", "spawn", "forkserver"
    has_worker_init_fn: bool = False
    iterations_started: int = 0  # times iter() was called on it (epochs)
    dataset_len: int | None = None
    # the arguments the call passed, by position or by name ("batch_size", "num_workers" …): the script chose
    # those, and left the others at DataLoader's defaults; None where not recorded (runs before this field)
    passed_args: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class OptimizerSetting(Serde):
    call_site: CallSite | None
    cls: str  # "torch.optim.AdamW"
    foreach: bool | None
    fused: bool | None
    supports_fused: bool = False
    num_params: int = 0
    num_param_tensors: int = 0


@dataclass(frozen=True, slots=True)
class AutocastUse(Serde):
    call_site: CallSite | None
    device_type: str
    dtype: str  # "torch.bfloat16"
    enabled: bool = True
    deprecated_api: bool = False  # torch.cuda.amp.autocast


@dataclass(frozen=True, slots=True)
class WrapSetting(Serde):
    """nn.DataParallel / DistributedDataParallel / torch.compile around a module."""

    kind: str  # "DataParallel", "DistributedDataParallel", "torch.compile"
    call_site: CallSite | None
    module: str = ""  # class name of the wrapped module
    options: dict[str, Any] = field(default_factory=dict)  # bucket_cap_mb, find_unused_parameters, mode, backend …


@dataclass(frozen=True, slots=True)
class CompileEvent(Serde):
    """One compilation ``torch.compile`` ran during the run, with the step it happened in (Dynamo's
    compile callbacks and its compilation metrics, read at run time)."""

    compile_id: str  # "0/0": frame 0, its first compilation; "0/3": its fourth (a recompilation)
    step: int | None  # StepRecord.index of the step in progress when it began (None: not known)
    start_ns: int | None = None  # from the run's start, the steps' clock
    dur_ns: int | None = None  # None: not ended (or not timed) when the settings were written
    trigger: str = "dynamo"  # "dynamo" (a frame traced), "lazy_backward" (the backward graph, at its first use), "cudagraph_recording"
    frame: str = ""  # the name of the code object compiled ("forward")
    call_site: CallSite | None = None  # where that code is
    reason: str = ""  # why it recompiled: the guard that failed ("tensor 'x' size mismatch at index 1. expected 17, actual 23")
    graph_breaks: int | None = None  # graph breaks Dynamo made tracing this frame
    failed: str = ""  # why the compilation failed or was refused ("Dynamo recompile limit exceeded"); "" when it compiled


@dataclass(frozen=True, slots=True)
class CompileState(Serde):
    """What ``torch.compile`` did during the run (``collect.compile_watch``): every compilation with
    the step it happened in, the graph breaks, and the frames that hit the recompile limit."""

    events: tuple[CompileEvent, ...] = ()  # in order; the first and the latest when there were more than kept
    events_dropped: int = 0  # compilations left out of ``events`` (a run that compiles without end)
    graph_breaks: dict[str, int] = field(default_factory=dict)  # reason (its first line) -> times Dynamo broke the graph for it
    recompile_limit: int | None = None  # torch._dynamo.config.recompile_limit (cache_size_limit before 2.6)
    limit_hits: int = 0  # frames that reached it: Dynamo runs them eagerly from then on
    errors: tuple[str, ...] = ()  # what could not be read (an older torch without compile callbacks …)


@dataclass(frozen=True, slots=True)
class Injection(Serde):
    """One change ``--verify`` makes to a trial run of the script without editing its source.

    The child applies it through the same hooks that read the settings: DataLoader
    arguments at the named call site, flags after the script sets them, the environment
    before the script starts, the optimizer's constructor arguments.
    """

    kind: str  # "dataloader", "flag", "threads", "worker_threads", "optimizer", "env", "non_blocking", "skip_call"
    key: str  # "num_workers", "torch.backends.cudnn.benchmark", "OMP_NUM_THREADS", "fused", "torch.cuda.empty_cache"
    value: Any  # the value set: 4, True, "high", "4294967296"
    call_site: CallSite | None = None  # the DataLoader / optimizer / call it applies to; None: the whole run
    target: str = ""  # the optimizer class it applies to ("torch.optim.AdamW"); "" otherwise
    text: str = ""  # in words: "num_workers=1 at train.py:31"


@dataclass(frozen=True, slots=True)
class AppliedInjection(Serde):
    """A ``--verify`` trial's account of one injection: how often it took effect."""

    injection: Injection
    applied: int  # times it took effect: DataLoaders built with it, flag writes overridden, copies made non-blocking …
    note: str = ""  # why it never took effect (no DataLoader at that call site, …), or a caveat


@dataclass(frozen=True, slots=True)
class Settings(Serde):
    """The configuration the script actually used, read at run time."""

    device_type: str = "cpu"  # "cuda" when the script put tensors on a GPU
    dataloaders: tuple[DataLoaderSetting, ...] = ()
    optimizers: tuple[OptimizerSetting, ...] = ()
    flags: tuple[FlagSetting, ...] = ()  # cudnn.benchmark, cudnn.deterministic, TF32 flags, matmul precision
    autocast: tuple[AutocastUse, ...] = ()
    grad_scalers: tuple[CallSite, ...] = ()
    wrappers: tuple[WrapSetting, ...] = ()
    empty_cache_calls: tuple[CallSite, ...] = ()  # torch.cuda.empty_cache() call sites
    empty_cache_count: int = 0
    num_threads: int | None = None  # torch.get_num_threads() in the training process
    interop_threads: int | None = None
    cpu_count: int | None = None  # cores available to the process
    env: dict[str, str] = field(default_factory=dict)  # OMP_NUM_THREADS, PYTORCH_CUDA_ALLOC_CONF, LD_PRELOAD …
    injected: tuple[AppliedInjection, ...] = ()  # a --verify trial: the changes gpudoctor made to this run
    compile: CompileState | None = None  # what torch.compile did (None: the script never called it)

    def flag(self, name: str) -> FlagSetting | None:
        for f in self.flags:
            if f.name == name:
                return f
        return None


# --------------------------------------------------------------------------- steps and samples


@dataclass(frozen=True, slots=True)
class StepRecord(Serde):
    """One training step (every step of the run, profiled or not)."""

    index: int  # 0-based
    start_ns: int  # from the run's start
    wall_ns: int
    data_wait_ns: int = 0  # blocked in DataLoader.__next__ during this step
    user_cpu_ns: int | None = None  # training process CPU time in this step
    sys_cpu_ns: int | None = None
    minor_faults: int | None = None
    major_faults: int | None = None
    # how many steps the four CPU figures above cover: this one and the ones right before it that carry
    # none (a short step does not read getrusage: a system call costs more than a few-µs step can pay);
    # null with the figures null, and in runs recorded before this field (each row then covers itself)
    cpu_steps: int | None = None
    gpu_ns: int | None = None  # from CUDA events, when CUDA is present
    profiled: bool = False  # inside an active torch.profiler window
    epoch: int | None = None
    rank: int | None = None
    window: str = ""  # instrument on during this step: "" (none), "warmup", "active" (torch.profiler) or "cprofile"
    marker: str = ""  # what ended this step: "optimizer", "backward", "module", "dataloader" ("" before this field)
    # host time in each phase of the step, exclusive (a backward() inside optimizer.step() is backward's);
    # null where the phase could not be watched (forward: no root module found). The rest of
    # wall_ns (less data_wait_ns) is "other": the loop's own Python work
    forward_ns: int | None = None  # in calls of the root module
    backward_ns: int | None = None  # in torch.autograd.backward / Tensor.backward
    optimizer_ns: int | None = None  # in optimizer.step()
    # backward() calls in the step (DataLoader batches when none); in a step in which another optimizer also
    # stepped (a GAN's two), its DataLoader batches (1 when none): those backward() calls are no accumulation
    micro_batches: int | None = None
    batches: int | None = None  # DataLoader batches the step received

    def other_ns(self) -> int | None:
        """Host time outside data wait, forward, backward and optimizer (None without phase times)."""
        if self.backward_ns is None or self.optimizer_ns is None:
            return None
        used = self.data_wait_ns + (self.forward_ns or 0) + self.backward_ns + self.optimizer_ns
        return max(0, self.wall_ns - used)


@dataclass(frozen=True, slots=True)
class ProcessSample(Serde):
    """psutil: the training process, or one DataLoader worker."""

    t_ns: int
    pid: int
    role: str  # "main", "worker" (DataLoader / multiprocessing), "child" (another process the script started) or "launcher" (torchrun)
    cpu_pct: float  # 100 = one full core
    rss_bytes: int
    threads: int
    rank: int | None = None
    # time its threads were runnable but waited for a core since the previous sample, % of the
    # interval (100 = one thread waiting all the time; Linux schedstat; None where unreadable)
    runq_wait_pct: float | None = None


@dataclass(frozen=True, slots=True)
class GpuSample(Serde):
    """NVML, one device."""

    t_ns: int
    index: int
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    power_w: float | None = None
    temp_c: float | None = None
    throttle_reasons: tuple[str, ...] = ()  # NVML's clock event reasons active at the sample ("sw_power_cap", …)
    pcie_tx_kbps: float | None = None
    pcie_rx_kbps: float | None = None
    # the SM clock the applications clocks setting asks for (the clock the GPU runs at when nothing
    # holds it back) and the most it may boost to, and the power limit enforced (runs recorded before
    # these fields, or a device that does not report them: None)
    app_sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    power_limit_w: float | None = None
    throttle_read: bool | None = None  # the reasons were read (an empty throttle_reasons then means none); None: older runs


@dataclass(frozen=True, slots=True)
class HostSample(Serde):
    """psutil / ``/proc``: the whole machine, every process on it (the training's among them).

    What the machine gave to *other* work, beside the training's own process tree, tells a
    timing on a busy machine from one on an idle machine (``--verify``, GD205)."""

    t_ns: int
    cpu_pct: float  # every process together, since the previous sample; 100 = one core (like ProcessSample)
    steal_pct: float | None = None  # time the hypervisor gave this VM's cores to others; 100 = one core (None: not reported)
    procs_running: int | None = None  # runnable threads on the machine now, on a core or waiting (Linux /proc/stat)
    load1: float | None = None  # the 1-minute load average (os.getloadavg; None where there is none)


@dataclass(frozen=True, slots=True)
class Samples(Serde):
    process: tuple[ProcessSample, ...] = ()
    gpu: tuple[GpuSample, ...] = ()
    interval_ms: float | None = None
    system_cpu_count: int | None = None
    host: tuple[HostSample, ...] = ()  # the machine's load (runs recorded before this field: none)
    system_memory_bytes: int | None = None  # the machine's physical memory (psutil; None: not recorded)


@dataclass(frozen=True, slots=True)
class HostLoad(Serde):
    """How busy the machine was over a span of a run, from its samples (``analysis.load``).

    Means over the sample instants of the span; the training's own process tree (the
    training process and its workers and children) is told apart from everything else."""

    samples: int  # sample instants averaged
    cores: int | None  # logical cores of the machine
    training_cpu_pct: float  # the training's process tree; 100 = one core
    runq_wait_pct: float | None  # the training process waiting for a core (schedstat); 100 = one thread all the time
    system_cpu_pct: float | None = None  # every process on the machine; 100 = one core (None: no host samples)
    others_cpu_pct: float | None = None  # system less the training's tree, never below 0; 100 = one core
    steal_pct: float | None = None  # taken by the hypervisor; 100 = one core
    procs_running: float | None = None  # runnable threads on the machine (Linux)


@dataclass(frozen=True, slots=True)
class PstatsEntry(Serde):
    """One function from ``profile.pstats`` (the top ones by cumulative time, and those that take the
    most time inside the DataLoader's fetch when the training process loads its own batches)."""

    file: str
    line: int
    function: str
    calls: int
    tottime_s: float
    cumtime_s: float
    # the part of tottime_s / cumtime_s spent inside the DataLoader's fetch in this process (the dataset's
    # __getitem__ and the collate_fn, ``torch.utils.data._utils.fetch``: num_workers=0), shared out along
    # cProfile's caller edges; 0 for a function never called from it
    loader_tottime_s: float = 0.0
    loader_cumtime_s: float = 0.0
