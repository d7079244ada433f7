"""Hand-built runs and trace metrics for the rule and engine tests.

Every builder gives a small, plausible object with the fields a test names overridden;
``judge(code, run)`` runs one rule the way the engine does.
"""

from __future__ import annotations

import dataclasses

from gpudoctor.analysis.ledger import GAP_COMPONENT, ORDER
from gpudoctor.config import Thresholds
from gpudoctor.model import (
    AutocastUse,
    CallSite,
    Collected,
    CpuSummary,
    DataLoaderSetting,
    Device,
    DeviceInfo,
    DeviceUtilization,
    FlagSetting,
    GapCause,
    GapCauseTotal,
    GpuSample,
    HostSync,
    IdleGap,
    KernelStats,
    Manifest,
    MemoryStats,
    NameStat,
    OptimizerSetting,
    ProcessSample,
    PstatsEntry,
    RunData,
    Samples,
    Settings,
    StepRecord,
    StepWindow,
    SyncSummary,
    TraceMetrics,
    TransferStat,
    Window,
    WindowKind,
    WrapSetting,
)
from gpudoctor.model.metrics import Component, Ledger, LedgerSlice
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.registry import get
from gpudoctor.rules.results import RuleResult

MS = 1_000_000
GB = 10**9
SITE = CallSite("train.py", 31, "main")


# --------------------------------------------------------------------------- trace metrics


def step_windows(n: int = 5, step_ms: float = 10.0, start_ns: int = 0) -> tuple[StepWindow, ...]:
    d = int(step_ms * MS)
    return tuple(StepWindow(i, start_ns + i * d, start_ns + (i + 1) * d) for i in range(n))


def utilization(
    idle_pct: float,
    *,
    window_ns: int = 50 * MS,
    causes: dict[GapCause, float] | None = None,
    device: int = 0,
    with_steps: bool = True,
) -> DeviceUtilization:
    """Idle ``idle_pct`` of a ``window_ns`` step window; ``causes`` splits the idle time (fractions)."""
    idle_ns = int(window_ns * idle_pct / 100)
    causes = causes if causes is not None else {GapCause.OTHER: 1.0}
    totals = tuple(
        GapCauseTotal(c, count=10, total_ns=int(idle_ns * frac), share_of_idle_pct=100 * frac, top_detail="")
        for c, frac in causes.items()
    )
    span = Window(WindowKind.SPAN, 0, window_ns, "first to last GPU activity")
    steps = Window(WindowKind.STEPS, 0, window_ns, "5 ProfilerStep windows") if with_steps else None
    gaps = tuple(
        IdleGap(device, i * MS, i * MS + int(idle_ns * frac), c, "cudaStreamSynchronize" if c == GapCause.SYNC else "")
        for i, (c, frac) in enumerate(causes.items())
    )
    return DeviceUtilization(
        device=device,
        busy_ns_span=window_ns - idle_ns,
        span=span,
        idle_pct_span=idle_pct,
        busy_ns_steps=window_ns - idle_ns if with_steps else None,
        idle_pct_steps=idle_pct if with_steps else None,
        steps_window=steps,
        gaps_window=WindowKind.STEPS if with_steps else WindowKind.SPAN,
        gap_count=10 * len(causes),
        gaps_over_1ms=len(causes),
        gap_causes=totals,
        top_gaps=gaps,
    )


def kernels(**kw) -> KernelStats:
    base = dict(
        count=1000,
        total_ns=40 * MS,
        p50_ns=30_000,
        p90_ns=80_000,
        max_ns=500_000,
        under_10us_pct=10.0,
        launch_count=1000,
        launch_total_ns=5 * MS,
        launch_to_kernel_ratio=0.125,
    )
    base.update(kw)
    return KernelStats(**base)


def trace(**kw) -> TraceMetrics:
    """A GPU trace with five 10 ms steps, 10% idle, no transfers."""
    base = dict(
        path="rank0.pt.trace.json.gz",
        has_gpu_activity=True,
        devices=(DeviceInfo(0, "NVIDIA A100-SXM4-80GB", "8.0", 80 * GB),),
        step_source="ProfilerStep",
        steps=step_windows(),
        utilization=(utilization(10.0),),
        kernels=kernels(),
        syncs=SyncSummary(count=5, total_ns=int(0.5 * MS), share_of_steps_pct=1.0),
        has_stacks=True,
        has_shapes=True,
    )
    base.update(kw)
    if "ledger" not in kw:
        base["ledger"] = ledger_for(base)
    return TraceMetrics(**base)


def ledger_for(m: dict) -> Ledger | None:
    """A ledger consistent with a hand-built trace (as ``analysis.ledger`` would split it):
    ``breakdown_mean_pct`` when the test gives one (the parts, in %, the rest GPU compute or
    unexplained); else the GPU-idle causes of the utilization as the host-side parts, the FP32
    and convolution kernel shares of ``kernels`` as device-side parts, the rest GPU compute; on a
    CPU trace its ``cpu`` summary (DataLoader, op work, Python)."""
    gpu = m.get("has_gpu_activity")
    utils = m.get("utilization") or ()
    u = max(utils, key=lambda x: x.busy_ns_span) if utils else None
    cpu = m.get("cpu")
    steps_ = m.get("steps") or ()
    if steps_:
        total = sum(s.end_ns - s.start_ns for s in steps_)
    elif gpu and u is not None:
        total = (u.steps_window if u.steps_window is not None else u.span).dur_ns
    elif cpu is not None:
        total = cpu.window.dur_ns
    else:
        return None
    if total <= 0:
        return None
    parts: dict[Component, int] = {}
    given = m.get("breakdown_mean_pct") or {}
    if given:
        for k, v in given.items():
            parts[Component(k)] = int(total * v / 100)
    elif gpu and u is not None:
        window = (u.steps_window if u.steps_window is not None else u.span).dur_ns
        for c in u.gap_causes:
            comp = GAP_COMPONENT[c.cause]
            parts[comp] = parts.get(comp, 0) + int(c.total_ns * total / window)
        k = m.get("kernels")
        busy = total - sum(parts.values())
        if k is not None and k.total_ns:
            conv = min(busy, k.conv_kernel_ns or 0)
            fp32 = min(busy, int(k.total_ns * (k.fp32_eligible_pct_of_gpu or 0) / 100))
            fp32_conv = min(conv, fp32)
            parts[Component.GPU_FP32_CONV] = fp32_conv
            parts[Component.GPU_FP32_MATMUL] = max(0, min(busy - conv, fp32 - fp32_conv))
            parts[Component.GPU_CONV] = conv - fp32_conv
        busy = total - sum(parts.values())
        for direction, comp in (("HtoD", Component.H2D), ("DtoH", Component.D2H)):
            ns = min(busy, sum(x.dur_ns for x in m.get("transfers") or () if x.direction == direction))
            if ns:
                parts[comp] = ns
                busy -= ns
    else:
        parts[Component.DATA_LOADING] = cpu.dataloader_ns
        parts[Component.CPU_COMPUTE] = cpu.op_ns
        parts[Component.OTHER_CPU] = cpu.python_ns
    exposed = sum(c.exposed_ns for c in m.get("comm") or ())
    if exposed and not given:
        # exposed communication: the GPU busy with it alone, or the host in a collective no op hides
        take_from = Component.GPU_COMPUTE if gpu else Component.CPU_COMPUTE
        parts[Component.COMM_EXPOSED] = exposed
        if not gpu:
            parts[take_from] = max(0, parts.get(take_from, 0) - max(0, sum(parts.values()) - total))
    rest = total - sum(parts.values())
    rest_comp = Component.GPU_COMPUTE if gpu else Component.UNEXPLAINED
    parts[rest_comp] = parts.get(rest_comp, 0) + max(rest, 0)
    device = {Component.GPU_FP32_CONV, Component.GPU_FP32_MATMUL, Component.GPU_CONV, Component.GPU_OPTIMIZER,
              Component.GPU_COMPUTE, Component.H2D, Component.D2H, Component.COMM_EXPOSED}
    slices = tuple(
        LedgerSlice(c.value, parts[c], round(100.0 * parts[c] / total, 4),
                    "device" if gpu and c in device else "host", "", "trace")
        for c in ORDER if parts.get(c, 0) > 0
    )
    n = len(m.get("steps") or ()) or 1
    return Ledger(
        key=f"trace:{m['path']}", basis="gpu" if gpu else "cpu", label=m["path"], window=f"{n} windows",
        windows=n, total_ns=sum(sl.ns for sl in slices), slices=slices, device=0 if gpu else None,
        rank=m.get("rank"),
    )


def cpu_trace(**kw) -> TraceMetrics:
    w = Window(WindowKind.STEPS, 0, 50 * MS, "5 ProfilerStep windows")
    base = dict(
        path="cpu.pt.trace.json.gz",
        has_gpu_activity=False,
        platform="cpu",
        steps=step_windows(),
        windows=(w,),
        cpu=CpuSummary(window=w, dataloader_ns=0, dataloader_pct=0.0, op_ns=40 * MS, op_pct=80.0,
                       python_ns=5 * MS, python_pct=10.0),
    )
    base.update(kw)
    if "ledger" not in kw:
        base["ledger"] = ledger_for(base)
    return TraceMetrics(**base)


def transfer(direction: str = "HtoD", kind: str = "pinned", count: int = 5, nbytes: int = 5 * 10**6,
             dur_ns: int = MS // 2, **kw) -> TransferStat:
    return TransferStat(direction=direction, memory_kind=kind, count=count, bytes=nbytes, dur_ns=dur_ns,
                        bandwidth_gbps=nbytes / dur_ns if dur_ns else None, max_bytes=kw.pop("max_bytes", nbytes // max(count, 1)),
                        **kw)


# --------------------------------------------------------------------------- run directory


def steps(n: int = 20, wall_ms: float = 100.0, wait_ms: float = 0.0, *, epochs: int | None = None,
          sys_ms: float | None = None, faults: int | None = None, user_ms: float | None = None,
          first_wait_ms: float | None = None) -> tuple[StepRecord, ...]:
    """``n`` steps; with ``epochs``, split evenly, and the first step of each epoch waits ``first_wait_ms``."""
    out = []
    t = 0
    per_epoch = n // epochs if epochs else n
    for i in range(n):
        epoch = i // per_epoch if epochs else None
        first = epochs is not None and i % per_epoch == 0
        wait = first_wait_ms if (first and first_wait_ms is not None) else wait_ms
        wall = wall_ms + (wait - wait_ms)
        out.append(StepRecord(
            index=i, start_ns=t, wall_ns=int(wall * MS), data_wait_ns=int(wait * MS),
            user_cpu_ns=int(user_ms * MS) if user_ms is not None else None,
            sys_cpu_ns=int(sys_ms * MS) if sys_ms is not None else None,
            minor_faults=faults, epoch=epoch,
        ))
        t += int(wall * MS)
    return tuple(out)


def dataloader(**kw) -> DataLoaderSetting:
    base = dict(call_site=SITE, dataset="SlowDataset", batch_size=32, num_workers=0, pin_memory=False,
                prefetch_factor=None, persistent_workers=False, iterations_started=1, dataset_len=640)
    base.update(kw)
    return DataLoaderSetting(**base)


def settings(**kw) -> Settings:
    base = dict(device_type="cuda", dataloaders=(dataloader(),), num_threads=8, cpu_count=8)
    base.update(kw)
    return Settings(**base)


def manifest(**kw) -> Manifest:
    base = dict(
        schema_version=1, gpudoctor_version="0.1.0", run_id="train-1", command=("train.py",),
        script="/work/train.py", module=None, argv=("train.py",), cwd="/work",
        started_at="2026-01-01T00:00:00+00:00", started_at_unix_ns=0,
        versions={"python": "3.11.9", "torch": "2.13.0", "cuda": "12.4"},
        cpu_count=8, devices=(Device(0, "NVIDIA A100-SXM4-80GB", 80 * GB, "8.0", 108),),
        collected=(Collected("cuda", True),), step_source="optimizer", steps_seen=20,
    )
    base.update(kw)
    return Manifest(**base)


def cpu_manifest(**kw) -> Manifest:
    base = dict(devices=(), collected=(Collected("cuda", False, "no GPU in this run"),))
    base.update(kw)
    return manifest(**base)


def proc_samples(cpu_pct: float, n: int = 20, *, role: str = "main", pid: int = 100, period_ms: float = 100.0,
                 threads: int = 8, runq_wait_pct: float | None = None) -> tuple[ProcessSample, ...]:
    return tuple(ProcessSample(int(i * period_ms * MS), pid, role, cpu_pct, 10**9, threads,
                               runq_wait_pct=runq_wait_pct) for i in range(n))


def gpu_samples(util: float, used: int, total: int = 80 * GB, n: int = 10) -> tuple[GpuSample, ...]:
    return tuple(GpuSample(i * 100 * MS, 0, util_pct=util, mem_used_bytes=used, mem_total_bytes=total) for i in range(n))


def run(**kw) -> RunData:
    base = dict(source="gpudoctor-runs/train-1")
    base.update(kw)
    return RunData(**base)


# --------------------------------------------------------------------------- running a rule


def judge(code: str, data: RunData, **threshold_overrides) -> RuleResult:
    rule = get(code)
    th = dataclasses.replace(Thresholds(), **threshold_overrides)
    return rule.check(RuleContext(data, th).for_rule(rule.code, rule.name))


__all__ = [
    "AutocastUse", "CallSite", "FlagSetting", "GapCause", "HostSync", "MemoryStats", "NameStat",
    "OptimizerSetting", "PstatsEntry", "Samples", "SyncSummary", "WrapSetting",
    "GB", "MS", "SITE", "cpu_manifest", "cpu_trace", "dataloader", "gpu_samples", "judge", "kernels",
    "ledger_for", "manifest", "proc_samples", "run", "settings", "step_windows", "steps", "trace", "transfer",
    "utilization",
]
