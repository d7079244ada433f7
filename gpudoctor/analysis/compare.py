"""Before and after: two analysed runs (and their reports) → a ``Comparison``.

``compare_runs(run_a, run_b, report_a, report_b)`` is a pure function of the model: it
computes every number ``gpudoctor compare`` shows, once, with its unit and the window
it is of. What it compares:

Step time. The per-step wall times of ``steps.jsonl`` after the first step of each
epoch (one-off costs; the engine's "steady steps"), and of those only the steps outside
the torch.profiler and cProfile windows when both runs have at least ``min_steps`` of
them: profiler overhead differs between the instrumented steps and the rest, and two
runs need not have been instrumented alike. Without ``steps.jsonl`` on a side (a bare
Kineto trace) both sides are compared on their ProfilerStep windows. Multi-rank runs
are compared on one rank (the lowest both have).

Noise. Steps vary; a single median hides how much. The judgement combines
a two-sided Mann–Whitney U test on the two sets of step times (exact distribution for
small samples without ties, else the normal approximation with tie and continuity
corrections), and a bootstrap confidence interval of the speed-up (ratio of medians,
``resamples`` resamples with a fixed seed, so the output is deterministic; a run of more
than ``BOOTSTRAP_MAX_STEPS`` steps is resampled from that many spread over it), both from
``scipy.stats`` through ``analysis.stats``, which ``--verify`` shares. B is faster
(or slower) only when the test rejects "same distribution" at ``1 - confidence``, the
interval excludes 1, and the change is at least ``min_change_pct``: two runs of one
unchanged script on one machine commonly differ by a percent or two in median step
time (clock boost, placement, page cache), which no test on the steps of a single
pair of runs can see. Fewer than ``min_steps`` steps on a side: too few to tell.
Steps of one run are not independent draws (a slow phase lasts several steps), so the
p-value is optimistic; the margin and the interval are the guard.

When the main DataLoader's batch size changed, a step does different work: the
speed-up and the test are on time per sample (step time / batch size) instead.

Also: the data-wait share (time blocked in ``DataLoader.__next__``, % of the same
steps), GPU idle % (over the ProfilerStep windows on both sides, else the first-to-last
GPU activity span on both sides, never one of each), host-sync share, throughput,
NVML utilization, the step breakdown side by side, the findings fixed / remaining /
new (a finding gone from B is "fixed" only when B's run was judged by that rule), the
settings that changed (with the ``file:line`` that set them), and warnings when the
runs are of different scripts, arguments, devices or machines.
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpudoctor import __version__
from gpudoctor.analysis.ranks import steady_of
from gpudoctor.analysis.stats import (
    CONFIDENCE_PCT,
    RESAMPLES,
    SpeedupStats,
    bootstrap_speedup_ci,
    mann_whitney_p,
    speedup_stats,
)
from gpudoctor.model.compare import (
    COMPARISON_SCHEMA_VERSION,
    BreakdownChange,
    Comparison,
    ComponentChange,
    FindingChange,
    FindingStatus,
    MetricChange,
    RunSide,
    SettingChange,
    StepTimeChange,
    StepTimes,
    StepTimeVerdict,
)
from gpudoctor.model.findings import ChecklistStatus, Finding, Report, RunData, Severity
from gpudoctor.model.metrics import Component, DeviceUtilization, TraceMetrics, WindowKind
from gpudoctor.model.run import DataLoaderSetting, OptimizerSetting, Settings, StepRecord
from gpudoctor.model.units import duration_text

__all__ = [
    "compare_runs",
    "mann_whitney_p",
    "bootstrap_speedup_ci",
]

MIN_STEPS = 5  # fewer steps on a side: the test and the interval mean little (gpudoctor's choice)
MIN_CHANGE_PCT = 2.0  # margin for the run-to-run variation of two runs of one unchanged script (gpudoctor's choice)
PCT_TOLERANCE_PP = 0.5  # a share that moved less than this is "no change" (percentage points)

GD000 = "GD000"  # the engine's "rule crashed" finding: not a finding about the script


def _p90(values: Sequence[int]) -> int:
    vals = sorted(values)
    k = max(0, min(len(vals) - 1, -(-90 * len(vals) // 100) - 1))
    return vals[k]


def _medians_only(a: list[float], b: list[float], confidence_pct: float) -> SpeedupStats:
    """The medians of two samples too small for a test or an interval (a side with one step)."""
    med_a = float(statistics.median(a)) if a else 0.0
    med_b = float(statistics.median(b)) if b else 0.0
    return SpeedupStats(med_a, med_b, med_a / med_b if med_b > 0 else None,
                        100.0 * (med_b - med_a) / med_a if med_a > 0 else None, None, None, None,
                        "none (too few steps)", confidence_pct)


def _step_times(values: Sequence[int], window: str) -> StepTimes:
    return StepTimes(
        count=len(values),
        median_ns=int(statistics.median(values)),
        p90_ns=_p90(values),
        mean_ns=int(sum(values) / len(values)),
        min_ns=min(values),
        max_ns=max(values),
        window=window,
    )


# --------------------------------------------------------------------------- text


def _ms(ns: float | int | None) -> str:
    return "?" if ns is None else duration_text(ns)  # as the reports print durations


def _x(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "?"
    return f"{v:.2f}×"


def _p(p: float | None) -> str:
    if p is None:
        return "p = ?"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _val(v: Any) -> str:
    """A setting's value as Python spells it."""
    if isinstance(v, str):
        return v
    return repr(v)



# --------------------------------------------------------------------------- the runs


def _primary(run: RunData) -> TraceMetrics | None:
    """The trace a side's trace figures come from: the first with GPU activity, lowest rank
    first (the engine's choice for its headline numbers)."""
    gpu = [m for m in run.metrics if m.has_gpu_activity]
    pool = gpu or list(run.metrics)
    if not pool:
        return None
    return min(pool, key=lambda m: (m.rank if m.rank is not None else -1))


def _util(m: TraceMetrics | None) -> DeviceUtilization | None:
    if m is None or not m.utilization:
        return None
    return max(m.utilization, key=lambda u: u.busy_ns_span)


def _device_names(run: RunData) -> tuple[str, ...]:
    if run.manifest is not None and run.manifest.devices:
        return tuple(d.name for d in run.manifest.devices)
    names: list[str] = []
    for m in run.metrics:
        for d in m.devices:
            if d.name and d.name not in names:
                names.append(d.name)
    return tuple(names)


def _side(label: str, run: RunData, report: Report | None) -> RunSide:
    mf = run.manifest
    if mf is None:
        return RunSide(
            label=label,
            source=run.source,
            kind="trace",
            devices=_device_names(run),
            device_type=run.settings.device_type if run.settings is not None else "",
            world_size=next((m.world_size for m in run.metrics if m.world_size), None),
            steps_recorded=len(run.steps),
            traces=len(run.metrics),
            findings=len(report.findings) if report is not None else None,
        )
    status = mf.status.value + (f" ({mf.status_detail})" if mf.status_detail else "")
    return RunSide(
        label=label,
        source=run.source,
        kind="run",
        run_id=mf.run_id,
        script=mf.script,
        module=mf.module,
        args=tuple(mf.argv[1:]),
        started_at=mf.started_at,
        status=status,
        devices=_device_names(run),
        device_type=run.settings.device_type if run.settings is not None else "",
        host=mf.hostname,
        torch_version=mf.versions.get("torch", ""),
        world_size=mf.world_size,
        steps_recorded=len(run.steps),
        traces=len(run.metrics),
        findings=len(report.findings) if report is not None else None,
    )


def _main_loader(settings: Settings | None) -> DataLoaderSetting | None:
    if settings is None or not settings.dataloaders:
        return None
    return max(settings.dataloaders, key=lambda d: d.iterations_started)


# --------------------------------------------------------------------------- step time


@dataclass(frozen=True, slots=True)
class _Basis:
    kind: str  # "plain_steps", "steady_steps", "profiler_steps", ""
    text: str
    a: list[int]
    b: list[int]
    window_a: str
    window_b: str
    steps_a: list[StepRecord]  # the records behind a / b (empty for profiler_steps)
    steps_b: list[StepRecord]
    notes: tuple[str, ...] = ()
    why_not: str = ""  # when kind == ""


def _ranks(steps: Iterable[StepRecord]) -> list[int]:
    return sorted({s.rank for s in steps if s.rank is not None})


def _rank_choice(run_a: RunData, run_b: RunData) -> tuple[int | None, int | None, list[str]]:
    """The rank whose steps each side is judged by, and a note when a run has several."""
    ra, rb = _ranks(run_a.steps), _ranks(run_b.steps)
    notes: list[str] = []
    if len(ra) <= 1 and len(rb) <= 1:
        return (ra[0] if ra else None), (rb[0] if rb else None), notes
    common = sorted(set(ra) & set(rb))
    if common:
        r = common[0]
        notes.append(f"step times are those of rank {r} on both sides (A has {len(ra)} rank(s), B {len(rb)})")
        return r, r, notes
    a = ra[0] if ra else None
    b = rb[0] if rb else None
    notes.append(f"no rank in common: step times are of rank {a} in A and rank {b} in B")
    return a, b, notes


def _records(run: RunData, rank: int | None) -> list[StepRecord]:
    recs = [s for s in run.steps if rank is None or s.rank == rank]
    return sorted(recs, key=lambda s: s.index)


def _profiler_windows(run: RunData) -> tuple[list[int], str]:
    """ProfilerStep durations of the primary trace's rank (each step number once)."""
    m = _primary(run)
    if m is None:
        return [], ""
    seen: dict[int, int] = {}
    for t in run.metrics:
        if t.rank != m.rank:
            continue
        for w in t.steps:
            seen.setdefault(w.step, w.end_ns - w.start_ns)
    if not seen:
        return [], ""
    nums = sorted(seen)
    rank = f" of rank {m.rank}" if m.rank is not None and len(run.metrics) > 1 else ""
    return [seen[k] for k in nums], f"{len(nums)} ProfilerStep windows (#{nums[0]}..#{nums[-1]}){rank} of the trace"


def _basis(run_a: RunData, run_b: RunData, min_steps: int) -> _Basis:
    rank_a, rank_b, notes = _rank_choice(run_a, run_b)
    steady_a = steady_of(_records(run_a, rank_a))
    steady_b = steady_of(_records(run_b, rank_b))
    if steady_a and steady_b:
        plain_a = [s for s in steady_a if not s.window]
        plain_b = [s for s in steady_b if not s.window]
        if len(plain_a) >= min_steps and len(plain_b) >= min_steps:
            return _Basis(
                "plain_steps",
                "wall time of the steady steps outside the profiler windows (steps.jsonl)",
                [s.wall_ns for s in plain_a],
                [s.wall_ns for s in plain_b],
                f"{len(plain_a)} steady steps outside the profiler windows",
                f"{len(plain_b)} steady steps outside the profiler windows",
                plain_a,
                plain_b,
                tuple(notes),
            )
        notes.append(
            f"too few steps outside the profiler windows to compare those alone (A {len(plain_a)}, "
            f"B {len(plain_b)}; {min_steps} needed): step times include steps under torch.profiler or "
            "cProfile, whose overhead may differ between the runs; profile more steps (--steps) for a cleaner comparison"
        )
        return _Basis(
            "steady_steps",
            "wall time of the steady steps, instrumented ones included (steps.jsonl)",
            [s.wall_ns for s in steady_a],
            [s.wall_ns for s in steady_b],
            f"{len(steady_a)} steady steps",
            f"{len(steady_b)} steady steps",
            list(steady_a),
            list(steady_b),
            tuple(notes),
        )
    wa, win_a = _profiler_windows(run_a)
    wb, win_b = _profiler_windows(run_b)
    if wa and wb:
        if steady_a or steady_b:
            has = "A" if steady_a else "B"
            notes.append(
                f"only {has} has per-step records (steps.jsonl): both sides are compared on their ProfilerStep "
                "windows, which carry the profiler's overhead"
            )
        return _Basis(
            "profiler_steps",
            "duration of the ProfilerStep windows of the traces (profiled steps)",
            wa, wb, win_a, win_b, [], [], tuple(notes),
        )
    missing = [s for s, steady, w in (("A", steady_a, wa), ("B", steady_b, wb)) if not steady and not w]
    why = (
        f"no step times on side {' and '.join(missing)}: no steps.jsonl records and no ProfilerStep windows in the trace"
        if missing
        else "one side has only per-step records and the other only ProfilerStep windows"
    )
    return _Basis("", "", [], [], "", "", [], [], tuple(notes), why)


def _step_change(
    basis: _Basis,
    batch_a: int | None,
    batch_b: int | None,
    *,
    min_steps: int,
    min_change_pct: float,
    confidence_pct: float,
    resamples: int,
) -> StepTimeChange:
    if not basis.kind:
        return StepTimeChange(
            basis="",
            basis_text="",
            verdict=StepTimeVerdict.NOT_MEASURED,
            verdict_text=f"Step times not compared: {basis.why_not}.",
            min_steps=min_steps,
            min_change_pct=min_change_pct,
            confidence_pct=confidence_pct,
            batch_size_a=batch_a,
            batch_size_b=batch_b,
        )
    ta = _step_times(basis.a, basis.window_a)
    tb = _step_times(basis.b, basis.window_b)
    per_sample = bool(batch_a and batch_b and batch_a != batch_b)
    xa = [v / batch_a for v in basis.a] if per_sample and batch_a else [float(v) for v in basis.a]
    xb = [v / batch_b for v in basis.b] if per_sample and batch_b else [float(v) for v in basis.b]
    if len(xa) >= 2 and len(xb) >= 2:
        st = speedup_stats(xa, xb, confidence_pct, resamples)
    else:  # a side of one step (or none): medians only, the verdict below says there are too few to tell
        st = _medians_only(xa, xb, confidence_pct)
    med_a, med_b = st.median_a, st.median_b
    speedup, change, p, test = st.speedup, st.change_pct, st.p_value, st.test
    lo, hi = st.ci_low, st.ci_high
    ci_ok = lo is not None and hi is not None
    what = "median time per sample" if per_sample else "median step"
    moved = f"{what} {_ms(med_a)} → {_ms(med_b)}"
    stats = f"{confidence_pct:g}% CI {_x(lo)}–{_x(hi)}, {_p(p)}" if ci_ok else _p(p)
    alpha = 1.0 - confidence_pct / 100.0
    if ta.count < min_steps or tb.count < min_steps:
        verdict = StepTimeVerdict.TOO_FEW_STEPS
        text = (
            f"Too few steps to tell: A has {ta.count}, B {tb.count} ({min_steps} on each side needed); "
            f"{moved} ({_x(speedup)})."
        )
    elif speedup is None or change is None:
        verdict = StepTimeVerdict.NOT_MEASURED
        text = "Step times not compared: a median step time is zero."
    else:
        significant = st.significant
        if significant and abs(change) >= min_change_pct:
            if speedup > 1:
                verdict = StepTimeVerdict.FASTER
                text = f"B is {_x(speedup)} faster than A: {moved} ({stats})."
            else:
                verdict = StepTimeVerdict.SLOWER
                text = f"B is {_x(1.0 / speedup)} slower than A: {moved} ({stats})."
        elif significant:
            verdict = StepTimeVerdict.WITHIN_NOISE
            text = (
                f"No meaningful change: {moved} ({change:+.1f}%, {stats}) is under the {min_change_pct:g}% "
                "that two runs of one script commonly differ by."
            )
        else:
            verdict = StepTimeVerdict.WITHIN_NOISE
            why = (
                "the speed-up's interval includes 1×"
                if p < alpha
                else "the test cannot tell the two sets of steps apart"
            )
            text = (
                f"Within noise: {moved} ({_x(speedup)}, {stats}) is not distinguishable from step-to-step "
                f"variation ({why})."
            )
    return StepTimeChange(
        basis=basis.kind,
        basis_text=basis.text + (f"; compared per sample (batch size {batch_a} → {batch_b})" if per_sample else ""),
        verdict=verdict,
        verdict_text=text,
        a=ta,
        b=tb,
        speedup=round(speedup, 4) if speedup is not None else None,
        change_pct=round(change, 3) if change is not None else None,
        ci_low=round(lo, 4) if lo is not None else None,
        ci_high=round(hi, 4) if hi is not None else None,
        confidence_pct=confidence_pct,
        p_value=p,
        test=test,
        min_steps=min_steps,
        min_change_pct=min_change_pct,
        per_sample=per_sample,
        batch_size_a=batch_a,
        batch_size_b=batch_b,
    )


# --------------------------------------------------------------------------- headline figures


def _metric(
    key: str,
    label: str,
    unit: str,
    a: float | None,
    b: float | None,
    window_a: str,
    window_b: str,
    *,
    lower_is_better: bool,
    tolerance: float,
    note: str = "",
) -> MetricChange:
    a = None if a is None else round(a, 3)
    b = None if b is None else round(b, 3)
    delta = improved = None
    if a is not None and b is not None:
        delta = round(b - a, 3)  # of the values as shown
        if abs(delta) >= tolerance:
            improved = (delta < 0) if lower_is_better else (delta > 0)
    return MetricChange(
        key=key,
        label=label,
        unit=unit,
        a=a,
        b=b,
        delta=delta,
        delta_unit="pp" if unit == "%" else unit,
        window_a=window_a,
        window_b=window_b,
        improved=improved,
        note=note,
    )


def _wait_share(steps: Sequence[StepRecord]) -> float | None:
    total = sum(s.wall_ns for s in steps)
    return 100.0 * sum(s.data_wait_ns for s in steps) / total if total > 0 else None


def _data_wait(basis: _Basis, run_a: RunData, run_b: RunData) -> MetricChange | None:
    label = "waiting for data"
    if basis.kind in ("plain_steps", "steady_steps"):
        return _metric(
            "data_wait_share", label, "%", _wait_share(basis.steps_a), _wait_share(basis.steps_b),
            basis.window_a, basis.window_b, lower_is_better=True, tolerance=PCT_TOLERANCE_PP,
        )
    ma, mb = _primary(run_a), _primary(run_b)
    ca = ma.cpu if ma is not None else None
    cb = mb.cpu if mb is not None else None
    if ca is None and cb is None:
        return None
    note = "" if ca is not None and cb is not None else (
        f"no DataLoader figures on side {'A' if ca is None else 'B'} (no per-step records and no CPU side in its trace)"
    )
    return _metric(
        "data_wait_share", label + " (DataLoader share of the trace window)", "%",
        ca.dataloader_pct if ca is not None else None,
        cb.dataloader_pct if cb is not None else None,
        ca.window.description if ca is not None else "",
        cb.window.description if cb is not None else "",
        lower_is_better=True, tolerance=PCT_TOLERANCE_PP, note=note,
    )


def _gpu_idle(run_a: RunData, run_b: RunData) -> MetricChange | None:
    ma, mb = _primary(run_a), _primary(run_b)
    ua, ub = _util(ma), _util(mb)
    if ua is None and ub is None:
        return None  # no GPU activity on either side (CPU runs): nothing to compare, said in the notes
    if ua is None or ub is None:
        side = "A" if ua is None else "B"
        return _metric("gpu_idle", "GPU idle", "%", None, None, "", "", lower_is_better=True, tolerance=PCT_TOLERANCE_PP,
                       note=f"no GPU activity in side {side}'s trace: GPU idle cannot be compared")
    if ua.idle_pct_steps is not None and ub.idle_pct_steps is not None and ua.steps_window and ub.steps_window:
        assert ma is not None and mb is not None
        wa, wb = _steps_text(ma), _steps_text(mb)
        note = ""
        if [s.step for s in ma.steps] != [s.step for s in mb.steps]:
            note = "the runs profiled different steps: each percentage is of its own run's ProfilerStep windows"
        return _metric("gpu_idle", "GPU idle (ProfilerStep windows)", "%", ua.idle_pct_steps, ub.idle_pct_steps,
                       wa, wb, lower_is_better=True, tolerance=PCT_TOLERANCE_PP, note=note)
    without = [s for s, u in (("A", ua), ("B", ub)) if u.idle_pct_steps is None]
    note = (
        f"side {' and '.join(without)} has no ProfilerStep markers: GPU idle is compared over the first-to-last "
        "GPU activity span on both sides"
        if len(without) == 1
        else ""
    )
    return _metric("gpu_idle", "GPU idle (first to last GPU activity)", "%", ua.idle_pct_span, ub.idle_pct_span,
                   ua.span.description or WindowKind.SPAN.value, ub.span.description or WindowKind.SPAN.value,
                   lower_is_better=True, tolerance=PCT_TOLERANCE_PP, note=note)


def _host_sync(run_a: RunData, run_b: RunData) -> MetricChange | None:
    ma, mb = _primary(run_a), _primary(run_b)
    if ma is None or mb is None or not (ma.has_gpu_activity or mb.has_gpu_activity):
        return None
    sa = ma.syncs.share_of_steps_pct if ma.syncs is not None else None
    sb = mb.syncs.share_of_steps_pct if mb.syncs is not None else None
    if sa is None and sb is None:
        return None

    note = ""
    if (ma.step_source == "ProfilerStep") != (mb.step_source == "ProfilerStep"):
        note = "one trace has ProfilerStep markers and the other not: the windows differ"
    return _metric("host_sync_share", "host blocked in syncs", "%", sa, sb, _steps_text(ma), _steps_text(mb),
                   lower_is_better=True, tolerance=PCT_TOLERANCE_PP, note=note)


def _throughput(step: StepTimeChange) -> MetricChange | None:
    if step.a is None or step.b is None or not step.batch_size_a or not step.batch_size_b:
        return None
    if step.a.median_ns <= 0 or step.b.median_ns <= 0:
        return None
    a = step.batch_size_a * 1e9 / step.a.median_ns
    b = step.batch_size_b * 1e9 / step.b.median_ns
    return _metric(
        "throughput", "throughput (batch size / median step)", "samples/s", a, b,
        f"batch size {step.batch_size_a}, {step.a.window}", f"batch size {step.batch_size_b}, {step.b.window}",
        lower_is_better=False, tolerance=max(a, b) * step.min_change_pct / 100.0,
    )


def _nvml(run_a: RunData, run_b: RunData) -> MetricChange | None:
    def med(run: RunData) -> float | None:
        vals = [g.util_pct for g in (run.samples.gpu if run.samples else ()) if g.util_pct is not None]
        return statistics.median(vals) if vals else None

    a, b = med(run_a), med(run_b)
    if a is None and b is None:
        return None
    note = "" if a is not None and b is not None else f"no NVML samples on side {'A' if a is None else 'B'}"
    return _metric("gpu_util_nvml", "GPU utilization, NVML (median)", "%", a, b,
                   "NVML samples over the run" if a is not None else "",
                   "NVML samples over the run" if b is not None else "",
                   lower_is_better=False, tolerance=PCT_TOLERANCE_PP, note=note)


# --------------------------------------------------------------------------- breakdown


def _steps_text(m: TraceMetrics) -> str:
    """The window a trace's step percentages are of, in words."""
    if m.step_source != "ProfilerStep" or not m.steps:
        return m.ledger.window if m.ledger is not None else "the whole trace (no ProfilerStep markers)"
    nums = [s.step for s in m.steps]
    if len(nums) == 1:
        return f"1 ProfilerStep window (#{nums[0]})"
    return f"{len(nums)} ProfilerStep windows (#{min(nums)}..#{max(nums)})"


def _breakdown(run_a: RunData, run_b: RunData) -> tuple[BreakdownChange | None, str]:
    ma, mb = _primary(run_a), _primary(run_b)
    missing = [s for s, m in (("A", ma), ("B", mb)) if m is None or not m.breakdown_mean_pct]
    if missing:
        return None, f"no step breakdown on side {' and '.join(missing)} (no trace)"
    assert ma is not None and mb is not None
    notes: list[str] = []
    same_kind = (ma.step_source == "ProfilerStep") == (mb.step_source == "ProfilerStep")
    if not same_kind:
        notes.append(
            "one trace has ProfilerStep markers and the other not: shares are comparable, time per step is not shown"
        )
    if ma.has_gpu_activity != mb.has_gpu_activity:
        notes.append(f"only {'A' if ma.has_gpu_activity else 'B'}'s trace has GPU activity")

    def per_step(m: TraceMetrics, key: str) -> int | None:
        if not same_kind or m.step_source != "ProfilerStep" or not m.breakdown:
            return None
        return int(sum(b.parts_ns.get(key, 0) for b in m.breakdown) / len(m.breakdown))

    keys = [c.value for c in Component if c.value in ma.breakdown_mean_pct or c.value in mb.breakdown_mean_pct]
    keys += sorted(k for k in {*ma.breakdown_mean_pct, *mb.breakdown_mean_pct} if k not in keys)
    rows = []
    for k in keys:
        pa, pb = ma.breakdown_mean_pct.get(k), mb.breakdown_mean_pct.get(k)
        if not pa and not pb:
            continue  # nothing on either side (the GPU components of two CPU runs)
        na, nb = per_step(ma, k), per_step(mb, k)
        rows.append(ComponentChange(
            component=k,
            a_pct=pa,
            b_pct=pb,
            delta_pp=round(pb - pa, 3) if pa is not None and pb is not None else None,
            a_ns=na,
            b_ns=nb,
            delta_ns=nb - na if na is not None and nb is not None else None,
        ))

    def mean_step(m: TraceMetrics) -> int | None:
        if not same_kind or m.step_source != "ProfilerStep" or not m.breakdown:
            return None
        return int(sum(b.dur_ns for b in m.breakdown) / len(m.breakdown))

    return BreakdownChange(
        rows=tuple(rows),
        window_a=_steps_text(ma),
        window_b=_steps_text(mb),
        steps_a=len(ma.breakdown),
        steps_b=len(mb.breakdown),
        step_mean_a_ns=mean_step(ma),
        step_mean_b_ns=mean_step(mb),
        notes=tuple(notes),
    ), ""


# --------------------------------------------------------------------------- findings


@dataclass(frozen=True, slots=True)
class _Group:
    code: str
    name: str
    rank: int | None
    findings: tuple[Finding, ...]

    @property
    def top(self) -> Finding:
        return self.findings[0]  # the report's order: most severe, largest gain first

    @property
    def share(self) -> float | None:
        shares = [f.gain.share_pct for f in self.findings if f.gain.share_pct is not None]
        return max(shares) if shares else None

    @property
    def severity(self) -> Severity:
        return min((f.severity for f in self.findings), key=lambda s: s.rank)


def _run_ranks(run: RunData) -> set[int]:
    return {m.rank for m in run.metrics if m.rank is not None} | {s.rank for s in run.steps if s.rank is not None}


def _groups(report: Report, per_rank: bool) -> dict[tuple[str, int | None], _Group]:
    out: dict[tuple[str, int | None], list[Finding]] = {}
    for f in report.findings:
        if f.code == GD000:
            continue
        out.setdefault((f.code, f.rank if per_rank else None), []).append(f)
    return {k: _Group(k[0], v[0].name, k[1], tuple(v)) for k, v in out.items()}


def _not_judged(report: Report, code: str) -> str:
    """Why ``report`` could not judge rule ``code`` ("" when it could)."""
    if code not in report.rules_run:
        return "the rule did not run (excluded by select/ignore, or a `gpudoctor check` rule)"
    items = [i for i in report.checklist if code in i.codes]
    if items and all(i.status == ChecklistStatus.NOT_MEASURABLE for i in items):
        return items[0].reason
    if any(f"rule {code} " in e for e in report.errors):
        return "the rule crashed"
    return ""


def _findings(report_a: Report, report_b: Report, per_rank: bool) -> tuple[tuple[FindingChange, ...], str]:
    """Findings matched by rule code (and by rank when both runs have the same several ranks)."""
    ga, gb = _groups(report_a, per_rank), _groups(report_b, per_rank)
    out: list[FindingChange] = []
    for key in sorted(set(ga) | set(gb), key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        a, b = ga.get(key), gb.get(key)
        ref = b or a
        assert ref is not None
        note = ""
        if a is not None and b is not None:
            status = FindingStatus.REMAINING
        elif a is not None:
            why = _not_judged(report_b, key[0])
            status = FindingStatus.NOT_JUDGED if why else FindingStatus.FIXED
            if why:
                note = f"gone from B, but B could not be judged by this rule: {why}"
        else:
            status = FindingStatus.NEW
            why = _not_judged(report_a, key[0])
            if why:
                note = f"A could not be judged by this rule ({why}): it may have been there before"
        sa = a.share if a is not None else None
        sb = b.share if b is not None else None
        out.append(FindingChange(
            code=key[0],
            name=ref.name,
            status=status,
            rank=key[1],
            severity_a=a.severity.value if a is not None else None,
            severity_b=b.severity.value if b is not None else None,
            share_a_pct=sa,
            share_b_pct=sb,
            delta_pp=round(sb - sa, 3) if sa is not None and sb is not None else None,
            count_a=len(a.findings) if a is not None else 0,
            count_b=len(b.findings) if b is not None else 0,
            message_a=a.top.message if a is not None else "",
            message_b=b.top.message if b is not None else "",
            location=(b.top.location if b is not None and b.top.location is not None
                      else (a.top.location if a is not None else None)),
            note=note,
        ))
    order = {FindingStatus.FIXED: 0, FindingStatus.REMAINING: 1, FindingStatus.NEW: 2, FindingStatus.NOT_JUDGED: 3}
    out.sort(key=lambda c: (order[c.status], c.code, -1 if c.rank is None else c.rank))
    parts = []
    for status, word in ((FindingStatus.FIXED, "fixed"), (FindingStatus.REMAINING, "remaining"),
                         (FindingStatus.NEW, "new"), (FindingStatus.NOT_JUDGED, "not judged in B")):
        codes = [c.code + (f" (rank {c.rank})" if c.rank is not None else "") for c in out if c.status == status]
        if codes or status != FindingStatus.NOT_JUDGED:
            parts.append(f"{len(codes)} {word}" + (f" ({', '.join(codes)})" if codes else ""))
    return tuple(out), ", ".join(parts)


def _rank_list(ranks: set[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks)) or "none"


# --------------------------------------------------------------------------- settings


def _pair(
    items_a: Sequence[Any],
    items_b: Sequence[Any],
    keys: Sequence[Callable[[Any], Any]],
) -> list[tuple[Any | None, Any | None]]:
    """Match items of A with items of B: by each key in turn (in order), the rest by position."""
    left_a = list(range(len(items_a)))
    left_b = list(range(len(items_b)))
    pairs: list[tuple[int | None, int | None]] = []
    for key in keys:
        for i in list(left_a):
            ka = key(items_a[i])
            if ka is None:
                continue
            for j in left_b:
                if key(items_b[j]) == ka:
                    pairs.append((i, j))
                    left_a.remove(i)
                    left_b.remove(j)
                    break
    pairs += list(zip(left_a, left_b, strict=False))
    n = min(len(left_a), len(left_b))
    pairs += [(i, None) for i in left_a[n:]] + [(None, j) for j in left_b[n:]]
    pairs.sort(key=lambda p: (p[0] if p[0] is not None else len(items_a), p[1] if p[1] is not None else 0))
    return [(items_a[i] if i is not None else None, items_b[j] if j is not None else None) for i, j in pairs]


def _site_key(item: Any) -> tuple[str, int] | None:
    site = item.call_site
    return (site.file, site.line) if site is not None else None


_LOADER_FIELDS = ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "drop_last",
                  "multiprocessing_context")
_OPTIMIZER_FIELDS = ("foreach", "fused")


def _fields_text(item: Any, fields: Sequence[str]) -> str:
    return ", ".join(f"{k}={_val(getattr(item, k))}" for k in fields)


def _unique_labels(labels: list[str], pairs: list[tuple[Any, Any]]) -> list[str]:
    out = []
    for lab, (a, b) in zip(labels, pairs, strict=True):
        if labels.count(lab) > 1:
            site = (b or a).call_site
            lab = f"{lab} at {site}" if site is not None else lab
        out.append(lab)
    return out


def _settings(sa: Settings, sb: Settings) -> list[SettingChange]:
    out: list[SettingChange] = []
    # DataLoaders
    pairs = _pair(sa.dataloaders, sb.dataloaders, [_site_key, lambda d: d.dataset])
    labels = _unique_labels([f"DataLoader({(a or b).dataset})" for a, b in pairs], pairs)
    for label, (a, b) in zip(labels, pairs, strict=True):
        if a is None or b is None:
            out.append(SettingChange(
                "DataLoader", label,
                "absent" if a is None else _fields_text(a, _LOADER_FIELDS[:4]),
                "absent" if b is None else _fields_text(b, _LOADER_FIELDS[:4]),
                a.call_site if a else None, b.call_site if b else None,
            ))
            continue
        for k in _LOADER_FIELDS:
            va, vb = getattr(a, k), getattr(b, k)
            if va != vb:
                out.append(SettingChange("DataLoader", f"{label}.{k}", _val(va), _val(vb), a.call_site, b.call_site))
    # optimizers
    opairs = _pair(sa.optimizers, sb.optimizers, [_site_key, lambda o: o.cls])
    olabels = _unique_labels([f"optimizer({_short(o.cls)})" for o in (a or b for a, b in opairs)], opairs)
    for label, (a, b) in zip(olabels, opairs, strict=True):
        if a is None or b is None:
            out.append(SettingChange(
                "optimizer", label,
                "absent" if a is None else _opt_text(a),
                "absent" if b is None else _opt_text(b),
                a.call_site if a else None, b.call_site if b else None,
            ))
            continue
        if a.cls != b.cls:
            out.append(SettingChange("optimizer", f"{label}.class", a.cls, b.cls, a.call_site, b.call_site))
        for k in _OPTIMIZER_FIELDS:
            va, vb = getattr(a, k), getattr(b, k)
            if va != vb:
                out.append(SettingChange("optimizer", f"{label}.{k}", _val(va), _val(vb), a.call_site, b.call_site))
    # global flags (cudnn, TF32, matmul precision)
    fa = {f.name: f for f in sa.flags}
    fb = {f.name: f for f in sb.flags}
    for name in [*fa, *(n for n in fb if n not in fa)]:
        a_flag, b_flag = fa.get(name), fb.get(name)
        va = a_flag.value if a_flag is not None else None
        vb = b_flag.value if b_flag is not None else None
        if (a_flag is None) != (b_flag is None) or va != vb:
            out.append(SettingChange(
                "flags", name,
                _val(va) if a_flag is not None else "unknown",
                _val(vb) if b_flag is not None else "unknown",
                a_flag.call_site if a_flag else None, b_flag.call_site if b_flag else None,
            ))
    # AMP
    am_a, am_b = _autocast_text(sa), _autocast_text(sb)
    if am_a != am_b:
        out.append(SettingChange("AMP", "autocast", am_a, am_b,
                                 sa.autocast[0].call_site if sa.autocast else None,
                                 sb.autocast[0].call_site if sb.autocast else None))
    gs_a = "used" if sa.grad_scalers else "absent"
    gs_b = "used" if sb.grad_scalers else "absent"
    if gs_a != gs_b:
        out.append(SettingChange("AMP", "GradScaler", gs_a, gs_b,
                                 sa.grad_scalers[0] if sa.grad_scalers else None,
                                 sb.grad_scalers[0] if sb.grad_scalers else None))
    # torch.compile, DataParallel, DDP
    for kind in sorted({w.kind for w in (*sa.wrappers, *sb.wrappers)}):
        wa = [w for w in sa.wrappers if w.kind == kind]
        wb = [w for w in sb.wrappers if w.kind == kind]
        ta = "; ".join(_wrap_text(w) for w in wa) or "absent"
        tb = "; ".join(_wrap_text(w) for w in wb) or "absent"
        if ta != tb:
            category = "torch.compile" if kind == "torch.compile" else "wrapping"
            out.append(SettingChange(category, kind, ta, tb, wa[0].call_site if wa else None,
                                     wb[0].call_site if wb else None))
    # memory, device, threads, environment
    if len(sa.empty_cache_calls) != len(sb.empty_cache_calls):
        out.append(SettingChange("memory", "torch.cuda.empty_cache() call sites", str(len(sa.empty_cache_calls)),
                                 str(len(sb.empty_cache_calls)),
                                 sa.empty_cache_calls[0] if sa.empty_cache_calls else None,
                                 sb.empty_cache_calls[0] if sb.empty_cache_calls else None))
    if sa.device_type != sb.device_type:
        out.append(SettingChange("device", "device type", sa.device_type, sb.device_type))
    for k, name in (("num_threads", "torch.get_num_threads()"), ("interop_threads", "torch.get_num_interop_threads()"),
                    ("cpu_count", "cores available")):
        va, vb = getattr(sa, k), getattr(sb, k)
        if va != vb:
            out.append(SettingChange("threads", name, _val(va) if va is not None else "unknown",
                                     _val(vb) if vb is not None else "unknown"))
    for key in sorted(set(sa.env) | set(sb.env)):
        va, vb = sa.env.get(key), sb.env.get(key)
        if va != vb:
            out.append(SettingChange("environment", key, va if va is not None else "unset",
                                     vb if vb is not None else "unset"))
    return out


def _short(cls: str) -> str:
    return cls.rsplit(".", 1)[-1]


def _opt_text(o: OptimizerSetting) -> str:
    return f"{o.cls}, " + _fields_text(o, _OPTIMIZER_FIELDS)


def _autocast_text(s: Settings) -> str:
    uses = sorted({f"{u.device_type} {u.dtype}" for u in s.autocast if u.enabled})
    return ", ".join(uses) if uses else "absent"


def _wrap_text(w: Any) -> str:
    opts = ", ".join(f"{k}={_val(v)}" for k, v in sorted(w.options.items()))
    return f"{w.module}({opts})" if w.module else (opts or "on")


# --------------------------------------------------------------------------- identity


def _warnings(run_a: RunData, run_b: RunData, side_a: RunSide, side_b: RunSide, step: StepTimeChange) -> tuple[list[str], list[str]]:
    warnings: list[str] = []
    notes: list[str] = []
    if run_a.source == run_b.source:
        warnings.append("A and B are the same path: the comparison shows only the measurement noise")
    ma, mb = run_a.manifest, run_b.manifest
    if ma is not None and mb is not None:
        prog_a = ma.script or (f"-m {ma.module}" if ma.module else "?")
        prog_b = mb.script or (f"-m {mb.module}" if mb.module else "?")
        if prog_a != prog_b:
            warnings.append(f"different scripts: A ran {prog_a}, B ran {prog_b}")
        if tuple(ma.argv[1:]) != tuple(mb.argv[1:]):
            warnings.append(
                f"different script arguments: A: {shlex.join(ma.argv[1:]) or '(none)'}; "
                f"B: {shlex.join(mb.argv[1:]) or '(none)'}; expected when the fix was a command-line option, "
                "any other difference (model or data size, precision) changes what a step does"
            )
        if ma.hostname and mb.hostname and ma.hostname != mb.hostname:
            warnings.append(f"different machines: A ran on {ma.hostname}, B on {mb.hostname}")
        va, vb = ma.versions.get("torch", ""), mb.versions.get("torch", "")
        if va and vb and va != vb:
            warnings.append(f"different PyTorch versions: A {va}, B {vb}")
        if (ma.world_size or 1) != (mb.world_size or 1):
            warnings.append(f"different world sizes: A {ma.world_size or 1}, B {mb.world_size or 1}")
        if ma.schedule is not None and mb.schedule is not None and ma.schedule != mb.schedule:
            notes.append("the runs were profiled with different schedules (--skip-first/--warmup/--active/--wait/"
                         "--repeat or shapes/stacks/memory): the profiled steps and their overhead differ")
        if ma.max_steps != mb.max_steps:
            notes.append(f"different --steps: A {ma.max_steps or 'all'}, B {mb.max_steps or 'all'}")
        for side, mf in (("A", ma), ("B", mb)):
            if mf.status.value in ("failed", "interrupted", "killed", "running"):
                warnings.append(
                    f"run {side} did not finish ({mf.status.value}"
                    + (f": {mf.status_detail}" if mf.status_detail else "")
                    + "): its figures cover the steps before it ended"
                )
    else:
        if side_a.kind != side_b.kind:
            notes.append(f"A is a {side_a.kind}, B a {side_b.kind}: only what both have is compared")
        if side_a.world_size and side_b.world_size and side_a.world_size != side_b.world_size:
            warnings.append(f"different world sizes: A {side_a.world_size}, B {side_b.world_size}")
    if side_a.devices and side_b.devices and side_a.devices != side_b.devices:
        warnings.append(
            f"different devices: A on {', '.join(side_a.devices)}, B on {', '.join(side_b.devices)}: "
            "the step times include the hardware difference"
        )
    elif bool(side_a.devices) != bool(side_b.devices) and (ma is not None and mb is not None):
        with_gpu = "A" if side_a.devices else "B"
        warnings.append(f"only {with_gpu} ran with a GPU: the step times include the hardware difference")
    if side_a.device_type and side_b.device_type and side_a.device_type != side_b.device_type:
        warnings.append(f"the script trained on {side_a.device_type} in A and on {side_b.device_type} in B")
    if step.per_sample:
        warnings.append(
            f"the main DataLoader's batch size changed ({step.batch_size_a} → {step.batch_size_b}): a step does "
            "different work, so the speed-up is of time per sample (throughput), not of step time"
        )
    return warnings, notes


# --------------------------------------------------------------------------- entry point


def compare_runs(
    run_a: RunData,
    run_b: RunData,
    report_a: Report | None = None,
    report_b: Report | None = None,
    *,
    min_steps: int = MIN_STEPS,
    min_change_pct: float = MIN_CHANGE_PCT,
    confidence_pct: float = CONFIDENCE_PCT,
    resamples: int = RESAMPLES,
    created_at: str | None = None,
) -> Comparison:
    """Compare run ``a`` (before) with run ``b`` (after).

    ``run_a``/``run_b`` carry their ``metrics`` (``analyze_trace``); ``report_a``/``report_b``
    are the engine's diagnoses of them with the same configuration (without both, findings
    are not compared).
    """
    if min_steps < 2:
        raise ValueError("min_steps must be at least 2")
    if not 0 < confidence_pct < 100:
        raise ValueError("confidence_pct must be between 0 and 100")
    side_a, side_b = _side("A", run_a, report_a), _side("B", run_b, report_b)
    loader_a, loader_b = _main_loader(run_a.settings), _main_loader(run_b.settings)
    basis = _basis(run_a, run_b, min_steps)
    step = _step_change(
        basis,
        loader_a.batch_size if loader_a is not None else None,
        loader_b.batch_size if loader_b is not None else None,
        min_steps=min_steps,
        min_change_pct=min_change_pct,
        confidence_pct=confidence_pct,
        resamples=resamples,
    )
    metrics = [
        m
        for m in (
            _data_wait(basis, run_a, run_b),
            _gpu_idle(run_a, run_b),
            _host_sync(run_a, run_b),
            _throughput(step),
            _nvml(run_a, run_b),
        )
        if m is not None
    ]
    breakdown, breakdown_note = _breakdown(run_a, run_b)
    extra_notes: list[str] = []
    if report_a is not None and report_b is not None:
        ranks_a, ranks_b = _run_ranks(run_a), _run_ranks(run_b)
        per_rank = len(ranks_a) > 1 and ranks_a == ranks_b
        findings, summary = _findings(report_a, report_b, per_rank)
        compared = True
        if not per_rank and (ranks_a or ranks_b) and ranks_a != ranks_b:
            extra_notes.append(
                f"findings are matched by rule code across ranks: A has rank(s) {_rank_list(ranks_a)}, "
                f"B rank(s) {_rank_list(ranks_b)}"
            )
    else:
        findings, summary, compared = (), "not compared: a side was not diagnosed", False
    if run_a.settings is not None and run_b.settings is not None:
        settings = tuple(_settings(run_a.settings, run_b.settings))
        settings_note = "" if settings else "no setting gpudoctor records differs between the runs"
    else:
        missing = " and ".join(s for s, r in (("A", run_a), ("B", run_b)) if r.settings is None)
        settings = ()
        settings_note = f"no settings.json on side {missing} (a bare trace): settings not compared"
    warnings, notes = _warnings(run_a, run_b, side_a, side_b, step)
    notes = [*basis.notes, *notes, *extra_notes]
    if not any(m.key == "gpu_idle" for m in metrics):
        notes.append("GPU idle not compared: no GPU activity in either run's traces")
    for label, rep in (("A", report_a), ("B", report_b)):
        if rep is not None:
            notes += [f"{label}: {e}" for e in rep.errors]
    headline = step.verdict_text
    if compared:
        headline += f" Findings: {summary}."
    return Comparison(
        schema_version=COMPARISON_SCHEMA_VERSION,
        gpudoctor_version=__version__,
        created_at=created_at or datetime.now().astimezone().isoformat(timespec="seconds"),
        a=side_a,
        b=side_b,
        headline=headline,
        step_time=step,
        metrics=tuple(metrics),
        breakdown=breakdown,
        breakdown_note=breakdown_note,
        findings=findings,
        findings_summary=summary,
        findings_compared=compared,
        settings=settings,
        settings_note=settings_note,
        warnings=tuple(warnings),
        notes=tuple(notes),
    )
