"""Thresholds and rule selection: ``[tool.gpudoctor]`` in the user's pyproject and CLI flags.

``Thresholds`` is the one place a rule reads a number from. Each field has a unit
suffix and a comment saying where its value comes from. Imports nothing of ours.

The user's ``pyproject.toml`` (the nearest one at or above the script or run)::

    [tool.gpudoctor]
    select = ["GD1", "GD2"]          # codes or prefixes; empty or absent = every rule
    ignore = ["GD104"]
    [tool.gpudoctor.thresholds]
    dataloader_wait_share_pct = 10

CLI flags go on top: ``--select`` / ``--ignore`` replace the file's lists when
given, ``--set FIELD=VALUE`` overrides one threshold.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.errors import ConfigError

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


@dataclass(frozen=True, slots=True)
class Thresholds:
    # ---- Severity scale, the same for every rule: share of step time at stake.
    error_share_pct: float = 20.0  # ≥ this: error. Issue 4 ("≥ 20% error"): a fifth of every step
    warning_share_pct: float = 5.0  # ≥ this: warning, else info. torch-tb-profiler flags a 5% DataLoader share
    # A finding whose cost cannot be put in step time (memory headroom, a static or settings-only
    # finding) gets this severity: visible, never outranking a measured error. gpudoctor's choice.
    unquantified_severity: str = "warning"

    # ---- The account (docs/account.md, "The accounting window")
    # The profiler's own weight: the accounting window's recorded steps (median) over the run's unprofiled
    # steady steps (median), at the rate the loop sustains. Above this ratio the host-side work of the
    # account is scaled to the unprofiled step. Issue 37 ("where that exceeds ~10%"). Where the profiler's
    # cost does not show, a window's 5 recorded steps against the unprofiled ones differ by a few %: 1.00-1.02
    # on the device-bound H200 runs, 0.97-1.00 for starved_dataloader on 2 CPU cores; timings-only windows
    # weigh 1.15-1.35 where the host limits a GPU loop, 1.07-1.54 on CPU (median 1.075; docs/performance.md).
    profiler_weight_max_ratio: float = 1.10

    # ---- GD101 gpu-idle
    # GPU idle share of step time. Issue 4; SageMaker Debugger's LowGPUUtilization (p95 < 70%)
    # and torch-tb-profiler's "low utilization" (< 50% busy) are looser; 20% idle is where the
    # idle causes below become worth chasing.
    gpu_idle_share_pct: float = 20.0

    # ---- GD102 host-sync
    sync_share_pct: float = 5.0  # host blocked in syncs, % of step time. Issue 4 (same as torch-tb-profiler's 5%)

    # ---- GD103 launch-bound (HTA's kernel launch statistics: kernels shorter than their launch)
    launch_short_kernel_share_pct: float = 50.0  # % of kernels (by count) under 10 µs: "most kernels". Issue 4
    launch_to_kernel_min_ratio: float = 0.8  # mean launch call / median kernel: "about as long". Issue 4, HTA
    # The one launch-bound test GD101 and GD103 share: the ledger's launch_overhead part (GPU idle while
    # the host issues ops, in gaps under 1 ms, plus queued gaps under 10 µs) as a share of step time
    # (docs/account.md). The two thresholds above only pick the wording (tiny kernels vs host-side
    # dispatch). The warning scale: torch-tb-profiler's 5%. Measured on ../shared/traces: 0-3.4% on the
    # busy or otherwise-bound traces, 10-57% on the launch-bound ones (b200_eager 56.6%).
    launch_gap_min_share_pct: float = 5.0
    # CPU runs ("dispatch-bound", gpudoctor.analysis.dispatch): the per-op overhead (ops under 10 µs and
    # the glue gaps between ops) must be most of the typical step. Measured per trace on the 2-core CI
    # machine (torch 2.13 CPU): planted tiny_batch_launch_bound.py 63-90%, its fix (batch 256) 63-68%,
    # eval_without_no_grad.py 36-66%, every other sample script 16% or less. Issue 4 ("dominates")
    dispatch_share_pct: float = 50.0
    # ... and it must come from issuing many ops per sample (ops per step / the DataLoader's batch_size):
    # each op's fixed cost is shared by too few samples, so a larger batch is the lever. Measured: the
    # planted sample 899, its fix 14, eval_without_no_grad.py 22, the others 2-5. gpudoctor's choice,
    # between the planted run and the rest (a log-scale midpoint, rounded).
    dispatch_ops_per_sample_count: float = 100.0
    # Without a batch size (a bare trace), most op self time must instead be in ops under 10 µs: the GPU
    # side's "most kernels under 10 µs". Measured: planted 46-86%, fixed 45-47%, eval 13-52%. Issue 4
    dispatch_short_op_time_pct: float = 50.0
    # The batch size the fix suggests brings the measured overhead to this share of the step if the rest
    # of the step grows linearly with the batch. gpudoctor's choice: a quarter left is well amortized.
    dispatch_target_share_pct: float = 25.0
    # Profiled steps this many times longer than the typical step were disturbed (the process waited for
    # a CPU); the finding says so. gpudoctor's choice: step-to-step jitter alone stays under 1.5× here.
    dispatch_disturbed_ratio: float = 1.5
    # Per-step phases (steps.jsonl, timed by gpudoctor's hooks): the calls into the model (forward,
    # backward, optimizer) must take at least this share of the step for their per-op overhead to set
    # the step time; below it the step is the loop's own work (GD203). Measured on the 2-core CI
    # machine: every sample script, planted and fixed, 28% or more (the lowest: oversubscribed_threads
    # planted, which waits for data 66-72%); the planted tiny_batch_launch_bound.py 96%. gpudoctor's
    # choice: a quarter of the step.
    model_calls_min_share_pct: float = 25.0

    # ---- GD104 batch-too-small
    batch_memory_share_pct: float = 50.0  # peak GPU memory below this % of the device. Issue 4
    # "GPU under-used": torch-tb-profiler suggests a larger batch below 50% GPU utilization; we use the
    # same idle share as GD101 so the two rules agree on what "under-used" means.
    batch_gpu_idle_share_pct: float = 20.0

    # ---- GD105 recompiles (torch.compile's compilations, read at run time: Settings.compile)
    # A frame recompiled in this many different steps after its first compilation recompiles as the run
    # goes. torch's default (automatic dynamic shapes) recompiles a frame once when a dimension first
    # changes and from then on treats it as dynamic: one recompilation is warm-up, not churn; three, in
    # three steps, are a guard that keeps failing. gpudoctor's choice.
    recompile_min_count: int = 3

    # ---- GD106 gpu-throttled (NVML samples: clock event reasons, SM clock, power)
    # An NVML sample counts as the GPU at work when its utilization (the share of the sample period in
    # which a kernel ran, nvmlDeviceGetUtilizationRates) is at least this: an idle GPU lowers its clocks
    # by design ("gpu_idle"), which costs nothing. gpudoctor's choice: half the period.
    throttle_busy_util_pct: float = 50.0
    # The rule fires when a throttle reason (thermal, power cap, power brake, hardware slowdown) is
    # active, or the SM clock is throttle_clock_deficit_pct below the applications clock, in at least
    # this share of the busy samples. gpudoctor's choice: a tenth of the working time, the scale at
    # which a 10-20% slower clock shows in step time (about 1-2%, under the warning scale below it).
    throttle_min_share_pct: float = 10.0
    # SM clock this far below the applications clock (the clock the GPU runs at when nothing holds it
    # back, nvmlDeviceGetApplicationsClock) counts as slowed: GPU Boost moves the clock in steps of
    # about 15 MHz (under 1% of a 1.4-2 GHz clock), so a tenth is well past its jitter. gpudoctor's choice.
    throttle_clock_deficit_pct: float = 10.0
    # Power draw at or above this share of the enforced power limit counts as "at the cap" (NVML
    # nvmlDeviceGetEnforcedPowerLimit; the sample's power reading averages over about a second, so a
    # capped GPU reads a few percent under its limit). gpudoctor's choice.
    power_cap_ratio_pct: float = 97.0

    # ---- GD201 dataloader-stall
    dataloader_wait_share_pct: float = 5.0  # waiting for the next batch, % of step time. torch-tb-profiler
    # Cores left to the training process itself when GD201 derives num_workers (PyTorch's DataLoader
    # warns when num_workers exceeds the cores; the main process needs one to launch work).
    dataloader_reserved_cores: int = 1
    # Workers added to the derived num_workers so that one slow batch does not stall the loop
    # (the DataLoader docs' advice to tune with headroom). gpudoctor's choice.
    dataloader_spare_workers_count: int = 1
    # What receiving one batch from a worker costs the loop (unpickling, mapping its shared memory):
    # measured 1.2-1.4 ms per batch of 30 KB-0.5 MB on the 2-core VM CI uses, with workers far ahead
    # of the loop (a workstation does it in a few hundred µs). A per-batch wait under this is no more
    # than workers would still cost: GD201 does not recommend them for it.
    dataloader_handover_ms: float = 1.0
    # Standard errors of the mean step less its wait (a run without a GPU) that GD201's modelled win per
    # batch must exceed to be promised: two, about 95%. gpudoctor's choice.
    dataloader_win_noise_se_count: float = 2.0
    # A load whose CPU time is under this share of its wall time *waits* (storage, network, a sleep):
    # a worker spends most of each batch blocked, so the cores can run more workers than there are
    # cores. Above it the load *computes*: workers beyond the usable cores only share them. Half is
    # the point where two waiting workers fill one core. gpudoctor's choice.
    dataloader_waiting_cpu_max_pct: float = 50.0
    # The most workers GD201 recommends, however long the load waits: each is a process with its own
    # copy of the dataset object and prefetch_factor batches in flight, and the training process
    # receives every batch (dataloader_handover_ms). gpudoctor's choice, at the high end of what
    # image pipelines use per GPU (4-16).
    dataloader_max_workers_count: int = 16
    # The share of the machine's memory the workers may hold together (each at the RSS measured for
    # one, or for the training process when none ran): the rest is left to the training process, the
    # page cache and other work. gpudoctor's choice.
    dataloader_worker_memory_share_pct: float = 50.0
    # The quantile of the steps' time outside their data wait (per batch) that models take as the loop's
    # compute once its data is ready (analysis.load.step_compute): the CPU goes cold while a loop waits, so
    # the mean over steps that waited overstates what the work needs when workers hide the wait (issue 42:
    # a 2-layer MLP's step, bimodal: p10 1.30 ms, median 11.33 ms, 0.39 ms back to back). The tenth
    # percentile: the warm steps of such a run, and on a loop that never waits within its noise of the
    # median. Calibrated on the loops of docs/account.md, "Calibration".
    warm_compute_quantile_pct: float = 10.0
    # The median step's compute over the warm figure above which the evidence gives both ("1.3 ms when its
    # data is ready, 11.3 ms after a wait"): twice, beyond the step-to-step scatter of a quiet run's
    # compute (tuned_baseline on 2 cores: p10 to median within 1.3x). gpudoctor's choice.
    cold_compute_ratio: float = 2.0

    # ---- GD202 worker-restart
    # A worker start-up stall is "visible" when the first step of an epoch waits for data this many
    # median steps longer than the other steps do (shorter stalls are lost in step-to-step jitter).
    worker_startup_stall_steps: float = 1.0

    # ---- GD203 main-process-cpu-bound
    main_cpu_busy_pct: float = 90.0  # main process CPU, 100 = one full core. Issue 4 ("at a full core"), less sampling jitter
    # CPU runs: the step is serial Python when the main process uses less than this % of what its
    # intra-op threads could (min(num_threads, cores) × 100) while at a full core. gpudoctor's choice.
    cpu_run_thread_use_max_pct: float = 60.0
    # CPU runs with a trace: the step is serial Python when this share of a typical step runs between
    # torch ops in gaps of 1 ms or more (TraceMetrics.dispatch.long_gap_ns). Measured on 2 cores: the
    # planted cpu_preprocessing_in_loop.py 82%, every other sample script (planted and fixed) 8% or less.
    # gpudoctor's choice: most of the step. Takes precedence over the CPU % test, which spinning
    # OpenMP threads inflate (the planted sample reads 133% CPU).
    cpu_run_python_share_pct: float = 50.0
    # Per-step phases: the loop's own work (host time outside the DataLoader wait, forward, backward and
    # optimizer.step()) must take at least this share of the step for a busy training process to be
    # Python in the loop; below it the process is busy inside the model's calls (GD103's case).
    # Measured on the 2-core CI machine: planted cpu_preprocessing_in_loop.py 62-68%, planted
    # rnn_manual_updates.py 52-53%, every other sample script (planted and fixed) 16% or less.
    # gpudoctor's choice: a quarter of the step, between the two.
    loop_other_share_pct: float = 25.0

    # ---- GD204 cpu-oversubscription
    # runnable threads of the training process and its workers (on a core + waiting in the run queue,
    # Linux schedstat) / cores. Measured on 2 cores: 1.02-1.03 on tuned runs and fixed variants,
    # 2.7 on sample_scripts/oversubscribed_threads.py; 1.5 leaves a third of the demand unserved.
    oversubscription_ratio: float = 1.5

    # ---- GD205 cpu-contention
    # The training process waited in the run queue for a core at least this share of the time (Linux
    # schedstat, 100 = one thread waiting all the time), its own threads wanting no more than the cores.
    # Measured on the shared 2-core CI machine: 0.2-2.5% with other jobs busy on one core, 48-55% with
    # a CPU hog beside a CPU-bound loop (whose mean step then doubled). 10% is twice the warning scale.
    cpu_contention_wait_pct: float = 10.0
    # ... and, where the machine's load was recorded, other processes used at least this much CPU
    # (100 = one core): half a core, the least that can make a core's worth of waiting. gpudoctor's choice.
    cpu_contention_others_pct: float = 50.0

    # ---- GD301 pageable-h2d (Nsight Systems' cuda_memcpy_async expert rule)
    pageable_h2d_share_pct: float = 2.0  # pageable H2D copy time, % of step time. Issue 4
    pageable_h2d_max_bytes: int = 65536  # a pageable copy larger than this is flagged. nsys cuda_memcpy_async (64 KiB)

    # ---- GD302 blocking-copy (Nsight Systems' cuda_memcpy_sync expert rule)
    blocking_copy_share_pct: float = 2.0  # host blocked in synchronous copies, % of step time. Issue 4
    blocking_h2d_exempt_bytes: int = 65536  # synchronous H2D copies up to this size are exempt. nsys cuda_memcpy_sync

    # ---- GD303 d2h-every-step
    d2h_steps_pct: float = 90.0  # % of steps with a device→host copy that counts as "every step" (first step may differ)

    # ---- GD401 no-amp (torch-tb-profiler's AMP recommendation)
    amp_min_compute_capability: float = 7.0  # Tensor Cores from Volta on. CUDA programming guide, torch-tb-profiler
    amp_fp32_share_pct: float = 30.0  # FP32 conv/matmul kernel time, % of GPU kernel time. Issue 4
    amp_tensor_core_max_pct: float = 1.0  # "no Tensor Core kernels": below 1% of kernel time (name matching noise)
    bf16_min_compute_capability: float = 8.0  # bfloat16 Tensor Cores from Ampere on. NVIDIA Ampere whitepaper
    # The expected gain of GD401/GD402: kernels moved onto Tensor Cores get the datasheet's peak ratio,
    # at most this (rules/speedups.py). NVIDIA's mixed-precision training guide: up to 3x on matmul-heavy nets
    tensor_core_speedup_max_ratio: float = 3.0

    # ---- GD402 tf32-off
    tf32_min_compute_capability: float = 8.0  # TF32 from Ampere on. PyTorch CUDA semantics notes
    tf32_fp32_share_pct: float = 10.0  # FP32 matmul kernel time, % of kernel time, worth TF32. gpudoctor's choice

    # ---- GD403 cudnn-benchmark-off
    cudnn_conv_share_pct: float = 5.0  # convolution kernel time, % of kernel time, that makes autotuning worth it
    # Shapes vary when the window holds more distinct convolution input shapes than this many times
    # those of its busiest step (a last partial batch alone doubles them). PyTorch tuning guide's caveat.
    cudnn_shape_variety_ratio: float = 2.0

    # ---- GD404 unfused-optimizer
    # At least one kernel per parameter tensor per optimizer step means the for-each-tensor loop
    # (torch.optim's default implementations launch several per tensor; foreach/fused a few in all).
    optimizer_kernels_per_tensor: float = 1.0
    optimizer_min_kernels_per_step: float = 100.0  # without parameter counts (traces alone): "many small kernels"

    # ---- GD405 below-roofline (analysis.roofline: achieved FLOP/s against the device's peak)
    # FP32/TF32 matmul/conv/attention work that is compute-bound at its own precision's roof, % of step
    # time, worth moving to half-precision Tensor Cores. gpudoctor's choice, as GD402's 10%.
    roofline_fp32_share_pct: float = 10.0
    # "Far below peak": under this % of the device's BF16/FP16 Tensor Core peak. cuBLAS GEMMs of
    # training-sized layers in half precision reach 60-80% of it (NVIDIA's Matrix Multiplication
    # Background guide); FP32 on the regular units cannot pass fp32/half (6-13% on A100/H100).
    roofline_far_below_peak_pct: float = 25.0
    # Runs of 3+ ATen elementwise kernels in a row on one stream (eager code), % of step time, worth
    # fusing with torch.compile. gpudoctor's choice: a tenth of the step, GD402's scale.
    elementwise_chain_share_pct: float = 10.0

    # ---- GD501 memory-near-limit
    memory_near_limit_pct: float = 90.0  # peak memory, % of the device. torch-tb-profiler's memory rule

    # ---- GD502 allocator-churn
    allocator_calls_per_step: float = 1.0  # cudaMalloc/cudaFree per steady step; the caching allocator should need none

    # ---- GD503 host-allocator-churn (PyTorch's CPU performance tuning guide)
    host_sys_cpu_share_pct: float = 10.0  # system CPU, % of step wall time. Issue 4
    minor_faults_per_step: float = 1000.0  # "thousands": measured ~5,000/step ran 40% slower than ~1,300. Issue 4

    # ---- GD602 comm-exposed
    # Communication with no compute beside it, % of step time. torch-tb-profiler recommends gradient
    # compression / accumulation when communication takes more than 10% of the step.
    comm_exposed_share_pct: float = 10.0

    # ---- GD603 straggler (the slowest rank, the others waiting for it in collectives)
    # The others wait at least this % of the step for it: the warning scale's lower bound (5%), so
    # a straggler is never reported at info level as noise.
    straggler_delay_share_pct: float = 5.0
    # ... consistently: it is that far behind the others in at least this % of the steps compared,
    # one by one (4 of 5 profiled steps). gpudoctor's choice: two equal ranks swap places at random.
    straggler_consistency_pct: float = 80.0
    straggler_min_steps: int = 3  # fewer compared steps cannot show "consistently". gpudoctor's choice
    # ... and its excess stands out of the other ranks' own step-to-step variation: at least this many
    # times their median absolute deviation (3 MAD ≈ 2 standard deviations of normal noise), so that
    # scheduling jitter on a shared host is not called a straggler.
    straggler_excess_to_jitter_ratio: float = 3.0

    # ---- GD702 loss-on-cpu
    loss_cpu_min_bytes_per_step: int = 1024  # D2H bytes per step above a scalar's: outputs, not a logged loss

    # ---- --verify (gpudoctor.verify): a fix measured in trial runs
    # A fix is "confirmed" only when the bootstrap interval of its speed-up lies above 1 and the
    # speed-up is at least this; "refuted" when the whole interval lies below it. 1.05 is the
    # severity scale's warning level (a cause worth 5% of step time is worth a warning: its
    # removal gives 1/(1-0.05) ≈ 1.05×), and it sits above the 1-2% by which two runs of one
    # unchanged script commonly differ (compare's margin). gpudoctor's choice.
    verify_min_speedup_ratio: float = 1.05
    # The machine's load must be alike on both sides: when other processes took, on average over the
    # runs, more than this much more CPU (100 = one core) during the runs of one side than during the
    # other's, the verdict is inconclusive. Measured on the shared 2-core CI machine (benchmarks/
    # verify_aa.py, docs/verify.md): in 40 A/A sessions, other jobs running and a CPU hog beside both
    # sides in half of them, the two sides' means differed by 0-36; a hog beside one side's runs only
    # adds about one core (100). Half a core, between the two.
    verify_load_gap_pct: float = 50.0
    # The trial runs (the script untouched) must be comparable with the profiled run: when their median
    # step is more than this many times the profiled run's uninstrumented median step, the machine (or
    # the run) is not the one the findings describe, and the verdict is inconclusive. Issue 25: DCGAN's
    # trials ran 10x slower and "confirmed" 1.5x of a cause worth 1.11x. A CPU hog beside a CPU-bound
    # step on 2 cores makes it about 2x slower, which a comparison can still survive: gpudoctor's choice.
    verify_max_slowdown_ratio: float = 3.0
    # The ladder: a num_workers fix that is not confirmed is tried again with twice the workers, up to
    # this many per core. A waiting load (storage, network, sleep) can use more workers than cores
    # (issue 24: about load / compute of them); 4 per core bounds the processes and their memory.
    verify_workers_per_core_ratio: float = 4.0


_SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True, slots=True)
class Config:
    thresholds: Thresholds = field(default_factory=Thresholds)
    select: tuple[str, ...] = ()  # codes or prefixes ("GD2"); empty = all
    ignore: tuple[str, ...] = ()
    source: str = ""  # the pyproject.toml it came from, if any

    def rule_enabled(self, code: str) -> bool:
        code = code.upper()
        if self.select and not any(code.startswith(s.upper()) for s in self.select):
            return False
        return not any(code.startswith(s.upper()) for s in self.ignore)


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above ``start``."""
    start = start.resolve()
    for d in (start, *start.parents):
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


_CODE_RE = re.compile(r"^GD\d{0,3}$", re.IGNORECASE)
_KNOWN_KEYS = ("select", "ignore", "thresholds")


def _codes(value: Any, what: str) -> tuple[str, ...]:
    """A list of rule codes or prefixes ("GD201", "GD2"), upper-cased; ConfigError otherwise."""
    if isinstance(value, str):
        items = [v for v in re.split(r"[,\s]+", value) if v]
    elif isinstance(value, (list, tuple)):
        items = []
        for v in value:
            if not isinstance(v, str):
                raise ConfigError(f"{what}: expected rule codes like \"GD201\" or prefixes like \"GD2\", got {v!r}")
            items.extend(x for x in re.split(r"[,\s]+", v) if x)
    else:
        raise ConfigError(f"{what}: expected a list of rule codes like [\"GD201\", \"GD3\"], got {value!r}")
    for item in items:
        if not _CODE_RE.match(item):
            raise ConfigError(
                f"{what}: {item!r} is not a rule code or prefix (e.g. GD201, GD2); see `gpudoctor rules`"
            )
    return tuple(i.upper() for i in items)


_FIELD_TYPES: dict[str, type] = {
    f.name: (int if f.type in ("int", int) else str if f.type in ("str", str) else float)
    for f in dataclasses.fields(Thresholds)
}


def _coerce(name: str, value: Any, where: str) -> Any:
    if name not in _FIELD_TYPES:
        close = [n for n in _FIELD_TYPES if name.split("_")[0] in n][:3]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(
            f"{where}: unknown threshold {name!r}{hint}; the fields are listed in `gpudoctor explain` and docs/rules"
        )
    tp = _FIELD_TYPES[name]
    if tp is str:
        if not isinstance(value, str) or value.lower() not in _SEVERITIES:
            raise ConfigError(f"{where}: {name} must be one of {', '.join(_SEVERITIES)}, got {value!r}")
        return value.lower()
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {name} must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigError(f"{where}: {name} must be a number, got {value!r}") from None
    if not isinstance(value, (int, float)) or value != value or value < 0:
        raise ConfigError(f"{where}: {name} must be a non-negative number, got {value!r}")
    if tp is int:
        if float(value) != int(value):
            raise ConfigError(f"{where}: {name} must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def _apply(th: Thresholds, changes: dict[str, Any], where: str) -> Thresholds:
    coerced = {k: _coerce(k, v, where) for k, v in changes.items()}
    new = dataclasses.replace(th, **coerced)
    if new.warning_share_pct > new.error_share_pct:
        raise ConfigError(
            f"{where}: warning_share_pct ({new.warning_share_pct}) must not exceed error_share_pct ({new.error_share_pct})"
        )
    return new


def parse_override(text: str) -> tuple[str, str]:
    """``FIELD=VALUE`` of ``--set``."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected FIELD=VALUE, e.g. --set dataloader_wait_share_pct=10")
    name, _, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not name or not value:
        raise ConfigError(f"--set {text!r}: expected FIELD=VALUE, e.g. --set dataloader_wait_share_pct=10")
    return name, value


def config_from_table(table: Any, where: str) -> Config:
    """A ``Config`` from the ``[tool.gpudoctor]`` table (already parsed TOML)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [tool.gpudoctor] must be a table")
    unknown = sorted(set(table) - set(_KNOWN_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} in [tool.gpudoctor]; allowed: {', '.join(_KNOWN_KEYS)}"
        )
    select = _codes(table.get("select", ()), f"{where}: select")
    ignore = _codes(table.get("ignore", ()), f"{where}: ignore")
    th_table = table.get("thresholds", {})
    if not isinstance(th_table, dict):
        raise ConfigError(f"{where}: [tool.gpudoctor.thresholds] must be a table of FIELD = number")
    thresholds = _apply(Thresholds(), th_table, where)
    return Config(thresholds=thresholds, select=select, ignore=ignore, source=where)


def load_config(
    where: Path,
    select: tuple[str, ...] = (),
    ignore: tuple[str, ...] = (),
    overrides: tuple[str, ...] = (),
) -> Config:
    """``[tool.gpudoctor]`` from the nearest pyproject.toml, then CLI flags on top.

    ``--select`` / ``--ignore`` replace the file's lists when given; each ``--set FIELD=VALUE``
    overrides one threshold. Bad keys or values raise ``ConfigError`` with a one-line message.
    """
    config = Config()
    path = find_pyproject(where) if where.exists() else find_pyproject(where.parent)
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: not valid TOML ({err}); fix it or run from another folder") from None
        table = data.get("tool", {}).get("gpudoctor") if isinstance(data.get("tool"), dict) else None
        if table is not None:
            config = config_from_table(table, str(path))
    if select:
        config = dataclasses.replace(config, select=_codes(list(select), "--select"))
    if ignore:
        config = dataclasses.replace(config, ignore=_codes(list(ignore), "--ignore"))
    if overrides:
        changes: dict[str, Any] = {}
        for text in overrides:
            name, value = parse_override(text)
            changes[name] = value
        config = dataclasses.replace(config, thresholds=_apply(config.thresholds, changes, "--set"))
    return config
