"""``gpudoctor compare``: the step times of the two runs, and whether B is faster (``analysis.compare``).

Which steps are compared (``step_basis``: the unprofiled steady steps of each run's figures, else
every steady step, else the ProfilerStep windows of the traces) and the verdict on them
(``step_change``: a bootstrap interval of the speed-up, its test from the same resamples, and a margin;
per sample when the batch size changed). The package's docstring says why.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpudoctor.analysis.figures import run_figures
from gpudoctor.analysis.stats import (
    SpeedupStats,
    speedup_stats,
)
from gpudoctor.model.compare import (
    StepTimeChange,
    StepTimes,
    StepTimeVerdict,
)
from gpudoctor.model.findings import RunData
from gpudoctor.model.run import StepRecord
from gpudoctor.model.selectors import primary_trace
from gpudoctor.model.steady import percentile_int
from gpudoctor.model.units import duration_text

MIN_STEPS = 5  # fewer steps on a side: the test and the interval mean little (gpudoctor's choice)


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
        p90_ns=percentile_int(values, 90) or 0,
        mean_ns=int(sum(values) / len(values)),
        min_ns=min(values),
        max_ns=max(values),
        window=window,
    )


# --------------------------------------------------------------------------- text


def _ms(ns: float | int | None) -> str:
    return duration_text(ns, "?")  # as the reports print durations


def _x(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "?"
    return f"{v:.2f}×"


def _p(p: float | None) -> str:
    if p is None:
        return "p = ?"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


# --------------------------------------------------------------------------- the basis


@dataclass(frozen=True, slots=True)
class StepBasis:
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


def _profiler_windows(run: RunData) -> tuple[list[int], str]:
    """ProfilerStep durations of the primary trace's rank (each step number once)."""
    m = primary_trace(run.metrics)
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


def step_basis(run_a: RunData, run_b: RunData, min_steps: int) -> StepBasis:
    rank_a, rank_b, notes = _rank_choice(run_a, run_b)
    # each run's step populations (analysis.figures: its marker, its DataLoader's workers, its compilations;
    # the steady steps are the settled ones)
    figs_a, figs_b = run_figures(run_a), run_figures(run_b)
    fig_a, fig_b = figs_a.of(rank_a), figs_b.of(rank_b)
    steady_a, steady_b = list(fig_a.steady), list(fig_b.steady)
    for side, figs in (("A", figs_a), ("B", figs_b)):
        if figs.settling is not None:
            notes.append(f"{side}'s step time changed: {figs.settling.text()}")
    if steady_a and steady_b:
        plain_a, plain_b = list(fig_a.unprofiled), list(fig_b.unprofiled)
        if len(plain_a) >= min_steps and len(plain_b) >= min_steps:
            return StepBasis(
                "plain_steps",
                "wall time of the unprofiled steady steps: no instrument in them or in the step before (steps.jsonl)",
                [s.wall_ns for s in plain_a],
                [s.wall_ns for s in plain_b],
                f"{len(plain_a)} unprofiled steady steps",
                f"{len(plain_b)} unprofiled steady steps",
                plain_a,
                plain_b,
                tuple(notes),
            )
        notes.append(
            f"too few steps outside the profiler windows to compare those alone (A {len(plain_a)}, "
            f"B {len(plain_b)}; {min_steps} needed): step times include steps under torch.profiler or "
            "cProfile, whose overhead may differ between the runs; profile more steps (--steps) for a cleaner comparison"
        )
        return StepBasis(
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
        return StepBasis(
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
    return StepBasis("", "", [], [], "", "", [], [], tuple(notes), why)


def _of_what(basis: StepBasis) -> str:
    """Which steps the headline's figures are of, beside them: a run's own summary gives the median of
    all its steady steps, the comparison that of the steps outside the profiler windows (1.20× there,
    1.14× here, and the headline did not say which)."""
    na, nb = len(basis.a), len(basis.b)
    if basis.kind == "plain_steps":
        return f"of the {na} and {nb} unprofiled steady steps"
    if basis.kind == "steady_steps":
        return f"of the {na} and {nb} steady steps, profiled ones included"
    return f"of the {na} and {nb} ProfilerStep windows of the traces"


def step_change(
    basis: StepBasis,
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
    moved = f"{what} {_ms(med_a)} → {_ms(med_b)} ({_of_what(basis)})"
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
            # one decision: the interval includes 1×, and so the test from its resamples is at or above α
            verdict = StepTimeVerdict.WITHIN_NOISE
            text = (
                f"Within noise: {moved} ({_x(speedup)}, {stats}) is not distinguishable from step-to-step "
                f"variation (the speed-up's interval includes 1×: p ≥ {alpha:g})."
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
