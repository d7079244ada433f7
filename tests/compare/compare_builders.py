"""Hand-built before/after pairs for the compare tests.

``run(...)`` gives a plausible ``RunData`` (manifest, settings, per-step records with
deterministic jitter, optionally one trace); ``report(...)`` a ``Report`` with the
findings, rules run and checklist a test names.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gpudoctor.model import (
    CallSite,
    ChecklistItem,
    ChecklistStatus,
    Component,
    Confidence,
    CpuSummary,
    DataLoaderSetting,
    Device,
    DeviceInfo,
    DeviceUtilization,
    Finding,
    Fix,
    Gain,
    Location,
    Manifest,
    Report,
    RunData,
    RunStatus,
    Settings,
    Severity,
    StepBreakdown,
    StepRecord,
    StepWindow,
    SyncSummary,
    TraceMetrics,
    Window,
    WindowKind,
)

MS = 1_000_000
GB = 10**9
SITE = CallSite("/work/train.py", 31, "main")


def step_records(
    n: int = 40,
    wall_ms: float = 100.0,
    *,
    jitter_pct: float = 3.0,
    wait_ms: float = 0.0,
    seed: int = 1,
    windows: dict[int, str] | None = None,
    rank: int | None = None,
    first_ms: float | None = 500.0,
) -> tuple[StepRecord, ...]:
    """``n`` steps around ``wall_ms`` (uniform jitter of ±``jitter_pct``%); step 0 lasts ``first_ms``."""
    rng = np.random.default_rng(seed)
    out = []
    t = 0
    for i in range(n):
        wall = wall_ms * (1 + rng.uniform(-jitter_pct, jitter_pct) / 100)
        if i == 0 and first_ms is not None:
            wall = first_ms
        wall_ns = int(wall * MS)
        out.append(StepRecord(
            index=i, start_ns=t, wall_ns=wall_ns, data_wait_ns=int(min(wait_ms, wall) * MS),
            window=(windows or {}).get(i, ""), rank=rank,
        ))
        t += wall_ns
    return tuple(out)


def loader(**kw) -> DataLoaderSetting:
    base = dict(call_site=SITE, dataset="Images", batch_size=32, num_workers=0, pin_memory=False,
                prefetch_factor=None, persistent_workers=False, iterations_started=1, dataset_len=4096)
    base.update(kw)
    return DataLoaderSetting(**base)


def settings(**kw) -> Settings:
    base = dict(device_type="cuda", dataloaders=(loader(),), num_threads=8, cpu_count=8)
    base.update(kw)
    return Settings(**base)


def manifest(**kw) -> Manifest:
    base = dict(
        schema_version=1, gpudoctor_version="0.1.0", run_id="train-1", command=("/work/train.py",),
        script="/work/train.py", module=None, argv=("/work/train.py", "--epochs", "1"), cwd="/work",
        started_at="2026-01-01T00:00:00+00:00", started_at_unix_ns=0, status=RunStatus.STOPPED,
        status_detail="stopped after 40 steps", versions={"python": "3.11.9", "torch": "2.13.0"},
        hostname="gpu-box", cpu_count=8, devices=(Device(0, "NVIDIA A100-SXM4-80GB", 80 * GB, "8.0", 108),),
        step_source="optimizer", steps_seen=40, max_steps=40,
    )
    base.update(kw)
    return Manifest(**base)


def utilization(idle_steps_pct: float | None, idle_span_pct: float, *, steps_desc: str = "5 ProfilerStep windows (#10..#14)") -> DeviceUtilization:
    span = Window(WindowKind.SPAN, 0, 50 * MS, "first to last GPU activity")
    steps = Window(WindowKind.STEPS, 0, 50 * MS, steps_desc) if idle_steps_pct is not None else None
    return DeviceUtilization(
        device=0, busy_ns_span=int(50 * MS * (1 - idle_span_pct / 100)), span=span, idle_pct_span=idle_span_pct,
        idle_pct_steps=idle_steps_pct, steps_window=steps,
    )


def breakdown(parts_ms: dict[str, float], n: int = 5, first: int = 10) -> tuple[StepBreakdown, ...]:
    parts = {k: int(v * MS) for k, v in parts_ms.items()}
    dur = sum(parts.values())
    return tuple(StepBreakdown(first + i, i * dur, dur, dict(parts)) for i in range(n))


def mean_pct(bd: tuple[StepBreakdown, ...]) -> dict[str, float]:
    total = sum(b.dur_ns for b in bd)
    keys = [c.value for c in Component]
    return {k: round(100.0 * sum(b.parts_ns.get(k, 0) for b in bd) / total, 3) for k in keys}


def gpu_trace(
    *,
    idle_steps_pct: float | None = 30.0,
    idle_span_pct: float = 25.0,
    parts_ms: dict[str, float] | None = None,
    step_ms: float | None = None,
    steps_desc: str = "5 ProfilerStep windows (#10..#14)",
    step_times_ms: list[float] | None = None,
    sync_pct: float | None = 2.0,
    dataloader_pct: float = 20.0,
    rank: int | None = None,
    device: str = "NVIDIA A100-SXM4-80GB",
    first_step: int = 10,
    n_steps: int = 5,
) -> TraceMetrics:
    parts_ms = parts_ms or {"gpu_compute": 70.0, "data_loading": 20.0, "other_cpu": 5.0, "idle": 5.0}
    bd = breakdown(parts_ms, n=n_steps, first=first_step)
    with_steps = idle_steps_pct is not None
    if step_times_ms is not None:
        t = 0
        steps = []
        for i, ms in enumerate(step_times_ms):
            steps.append(StepWindow(10 + i, t, t + int(ms * MS)))
            t += int(ms * MS)
        steps = tuple(steps)
    elif with_steps:
        steps = tuple(StepWindow(b.step, b.start_ns, b.start_ns + b.dur_ns) for b in bd)
    else:
        steps = ()
    wsteps = Window(WindowKind.STEPS, 0, 50 * MS, steps_desc)
    return TraceMetrics(
        path="rank0.pt.trace.json.gz",
        has_gpu_activity=True,
        devices=(DeviceInfo(0, device, "8.0", 80 * GB),),
        step_source="ProfilerStep" if with_steps else "trace",
        steps=steps,
        windows=(wsteps,) if with_steps else (Window(WindowKind.TRACE, 0, 50 * MS, "first to last event of the trace"),),
        utilization=(utilization(idle_steps_pct, idle_span_pct, steps_desc=steps_desc),),
        breakdown=bd if with_steps else bd[:1],
        breakdown_mean_pct=mean_pct(bd),
        syncs=SyncSummary(count=5, total_ns=MS, share_of_steps_pct=sync_pct) if sync_pct is not None else None,
        cpu=CpuSummary(window=wsteps, dataloader_ns=int(dataloader_pct * MS), dataloader_pct=dataloader_pct,
                       op_ns=0, op_pct=0.0, python_ns=0, python_pct=None),
        rank=rank,
    )


def run(
    *,
    source: str = "runs/a",
    wall_ms: float = 100.0,
    n: int = 40,
    jitter_pct: float = 3.0,
    wait_ms: float = 0.0,
    seed: int = 1,
    windows: dict[int, str] | None = None,
    metrics: tuple[TraceMetrics, ...] = (),
    steps: tuple[StepRecord, ...] | None = None,
    settings_kw: dict | None = None,
    manifest_kw: dict | None = None,
    no_manifest: bool = False,
) -> RunData:
    recs = steps if steps is not None else step_records(n, wall_ms, jitter_pct=jitter_pct, wait_ms=wait_ms,
                                                        seed=seed, windows=windows)
    return RunData(
        source=source,
        manifest=None if no_manifest else manifest(**(manifest_kw or {})),
        settings=None if no_manifest else settings(**(settings_kw or {})),
        steps=() if no_manifest else recs,
        metrics=metrics,
    )


def finding(code: str, name: str, share: float | None, *, severity: Severity = Severity.WARNING,
            message: str = "", rank: int | None = None, line: int = 31) -> Finding:
    return Finding(
        code=code, name=name, severity=severity, confidence=Confidence.MEASURED,
        message=message or f"{name}: {share}% of step time", fix=Fix(f"fix {name}"),
        gain=Gain(share, None if share is None else round(1 / (1 - share / 100), 3)),
        location=Location("/work/train.py", line, function="main"), rank=rank,
    )


def report(
    findings: tuple[Finding, ...] = (),
    *,
    rules_run: tuple[str, ...] = ("GD101", "GD102", "GD201", "GD203", "GD301", "GD401", "GD403", "GD404"),
    checklist: tuple[ChecklistItem, ...] = (),
    errors: tuple[str, ...] = (),
    source: str = "runs/a",
) -> Report:
    return Report(
        schema_version=1, gpudoctor_version="0.1.0", kind="analyze", source=source,
        created_at="2026-01-01T00:00:00+00:00", findings=findings, checklist=checklist,
        errors=errors, rules_run=rules_run,
    )


def not_measurable(code: str, reason: str) -> ChecklistItem:
    return ChecklistItem(key=f"item-{code}", title=f"item {code}", status=ChecklistStatus.NOT_MEASURABLE,
                         reason=reason, codes=(code,))


def replace(obj, **kw):
    return dataclasses.replace(obj, **kw)
