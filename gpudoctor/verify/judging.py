"""Judging the runs: each run's figure (its time per step), the machine's load on each side, and
the verdict an interval gives."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from gpudoctor.analysis.figures import run_figures
from gpudoctor.config import Thresholds
from gpudoctor.model import (
    HostLoad,
    RunData,
    RunFigure,
    Settings,
    StepRecord,
    Verification,
    VerifyStatus,
)
from gpudoctor.model.steady import StepFigures, StepSource, times_figures
from gpudoctor.verify.plan import (
    MIN_RUNS,
    MIN_STEPS,
    VerifyOptions,
    _Arm,
    _Run,
)


def _steady(run: _Run, warmup: int, statistic: str = "throughput") -> list[StepRecord]:
    """The steps a run is judged on: its steady steps (the run's figures, ``analysis.figures``: without the
    first step of each epoch, a one-off cost, and from where the loop settled) after its warm-up; for "epoch",
    every step after the warm-up, epoch starts included. The steady steps are chosen by the records alone, as
    in a run with no marker, DataLoader or compilation recorded: the arms differ in those settings (workers,
    torch.compile), and leaving out each arm's own one-off steps would hide a cost its fix adds (workers that
    start again each epoch) from the comparison."""
    ordered = sorted(run.steps, key=lambda s: s.index)
    if statistic == "epoch":
        return [s for s in ordered if s.index >= warmup]
    return [s for s in run_figures(RunData(run.rel, steps=tuple(ordered))).job.steady if s.index >= warmup]


def _epoch_start_ids(steps: Sequence[StepRecord]) -> set[int]:
    """Indices of the steps that begin an epoch (the epoch number changes from the step before)."""
    ordered = sorted(steps, key=lambda s: s.index)
    return {b.index for a, b in zip(ordered, ordered[1:], strict=False) if b.epoch is not None and b.epoch != a.epoch}


def profiled_step_ns(run: RunData | None) -> int | None:
    """The profiled run's step time (the run's figures, ``analysis.figures``: the mean over its unprofiled
    steady steps, the figure its report prints as the step now): what the trial runs of the untouched script
    should take on the same machine."""
    if run is None or not run.steps:
        return None
    return run_figures(run).job.step_ns



def _ms(ns: float | None) -> str:
    if ns is None:
        return "?"
    if ns >= 999.5e6:
        return f"{ns / 1e9:.3g} s"
    return f"{ns / 1e6:.3g} ms" if ns >= 1e5 else f"{ns / 1e3:.3g} µs"


def _x(v: float | None) -> str:
    return "?" if v is None or not math.isfinite(v) else f"{v:.2f}×"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _ms_list(values: Sequence[float | None]) -> str:
    """"23.1, 55.9, 22.3 ms": figures in one unit (µs when they are all under 0.1 ms)."""
    got = [v for v in values if v is not None]
    if got and max(got) < 1e5:
        return ", ".join(f"{v / 1e3:.3g}" for v in got) + " µs"
    if got and max(got) >= 999.5e6:
        return ", ".join(f"{v / 1e9:.3g}" for v in got) + " s"
    return ", ".join(f"{v / 1e6:.3g}" for v in got) + " ms"


def _pct(v: float) -> str:
    return f"{v:.0f}%" if v >= 10 else f"{v:.1f}%"


def _cores(pct: float | None) -> str:
    return "?" if pct is None else f"{pct / 100:.2f}"


def _batch(settings: Settings | None) -> int | None:
    if settings is None or not settings.dataloaders:
        return None
    return max(settings.dataloaders, key=lambda d: d.iterations_started).batch_size


def _not_applied(arm: _Arm) -> list[str]:
    """Changes that never took effect in any fix run (read back from the runs' settings.json)."""
    seen: dict[str, int] = {}
    notes: dict[str, str] = {}
    for r in arm.runs:
        if r.settings is None:
            continue
        for a in r.settings.injected:
            k = a.injection.text or f"{a.injection.key}={a.injection.value!r}"
            seen[k] = seen.get(k, 0) + a.applied
            if a.note:
                notes[k] = a.note
    return [f"{k} ({notes.get(k) or 'never applied'})" for k, n in seen.items() if n == 0]


def mean_load(loads: Sequence[HostLoad | None]) -> HostLoad | None:
    """The mean of runs' loads, field by field (a field missing in a run is averaged over the others)."""
    got = [x for x in loads if x is not None]
    if not got:
        return None

    def avg(name: str) -> float | None:
        vals = [getattr(x, name) for x in got if getattr(x, name) is not None]
        return round(statistics.fmean(vals), 2) if vals else None

    return HostLoad(
        samples=sum(x.samples for x in got),
        cores=got[0].cores,
        training_cpu_pct=avg("training_cpu_pct") or 0.0,
        runq_wait_pct=avg("runq_wait_pct"),
        system_cpu_pct=avg("system_cpu_pct"),
        others_cpu_pct=avg("others_cpu_pct"),
        steal_pct=avg("steal_pct"),
        procs_running=avg("procs_running"),
    )


def load_text(base: HostLoad | None, trial: HostLoad | None) -> str:
    """How busy the machine was: "machine: other processes used 0.91 of 2 cores (baseline runs 0.85, fix
    runs 0.97), steal 0.00; the training process waited for a core 12% of the time"."""
    both = mean_load([base, trial])
    if both is None:
        return "machine load not recorded"
    of = f" of {both.cores} cores" if both.cores else " cores"
    if both.others_cpu_pct is None:
        text = f"machine: the training used {_cores(both.training_cpu_pct)}{of} (other processes not recorded)"
    else:
        text = f"machine: other processes used {_cores(both.others_cpu_pct)}{of}"
        if base is not None and trial is not None and base.others_cpu_pct is not None and trial.others_cpu_pct is not None:
            text += f" (baseline runs {_cores(base.others_cpu_pct)}, fix runs {_cores(trial.others_cpu_pct)})"
        text += f", the training {_cores(both.training_cpu_pct)}"
    if both.steal_pct is not None:
        text += f", steal {_cores(both.steal_pct)}"
    if both.runq_wait_pct is not None:  # summed over its threads: 100 = one thread waiting all the time
        w = both.runq_wait_pct
        text += (f"; the training process waited for a core {_pct(w)} of the time" if w <= 100.0
                 else f"; the training process kept {w / 100:.1f} threads waiting for a core")
    return text


def load_unfair(base: HostLoad | None, trial: HostLoad | None, base_step_ns: float | None,
                profiled_ns: int | None, thresholds: Thresholds) -> str:
    """Why the machine makes the comparison unfair ("" when it does not): other processes took far
    more CPU during one side's runs than the other's, or the untouched script ran far slower in the
    trials than in the profiled run."""
    why = []
    if base is not None and trial is not None and base.others_cpu_pct is not None and trial.others_cpu_pct is not None:
        gap = trial.others_cpu_pct - base.others_cpu_pct
        if abs(gap) > thresholds.verify_load_gap_pct:
            busier = "fix" if gap > 0 else "baseline"
            why.append(
                f"the machine was busier during the {busier} runs: other processes used {_cores(abs(gap))} cores more "
                f"(baseline runs {_cores(base.others_cpu_pct)}, fix runs {_cores(trial.others_cpu_pct)}; more than "
                f"the {_cores(thresholds.verify_load_gap_pct)} of verify_load_gap_pct)"
            )
    if profiled_ns and base_step_ns and base_step_ns > thresholds.verify_max_slowdown_ratio * profiled_ns:
        why.append(
            f"the untouched script's steps were {base_step_ns / profiled_ns:.1f}× slower in the trials than in the "
            f"profiled run ({_ms(base_step_ns)} against {_ms(profiled_ns)}; more than the "
            f"{thresholds.verify_max_slowdown_ratio:g}× of verify_max_slowdown_ratio): the machine is not the one "
            "the findings describe"
        )
    return "; ".join(why)


def _trial_figures(steps: Sequence[StepRecord]) -> StepFigures:
    """A trial run's time per step (the mean over its judged steps, total ÷ count: the throughput) and its
    median, by the function that computes the profiled run's step time (``model.steady.times_figures``), of
    the host's wall time (a trial run records no instrument to leave out)."""
    return times_figures([s.wall_ns for s in steps], StepSource.WALL, steps)


def _figures(runs: Sequence[_Run], opts: VerifyOptions, statistic: str,
             per_sample: bool) -> list[tuple[_Run, list[StepRecord], float | None]]:
    """Each run with its judged steps and its time per step (per sample when ``per_sample``)."""
    out = []
    for r in runs:
        steps = _steady(r, opts.warmup_steps, statistic)
        batch = _batch(r.settings) if per_sample else None
        per = None
        if steps:
            per = float(_trial_figures(steps).step_ns or 0)
            if per_sample and batch:
                per /= batch
        out.append((r, steps, per))
    return out


def _per_run(arm: _Arm, baseline_runs: Sequence[_Run], opts: VerifyOptions, statistic: str,
             per_sample: bool) -> tuple[RunFigure, ...]:
    rows = []
    runs = sorted([("baseline", r) for r in baseline_runs] + [("trial", r) for r in arm.runs],
                  key=lambda t: (t[1].round, t[0] != "baseline"))
    for side, r in runs:
        _, steps, per = _figures([r], opts, statistic, per_sample)[0] if r.ok else (r, [], None)
        med = float(_trial_figures(steps).median_ns or 0) if steps else None
        batch = _batch(r.settings) if per_sample else None
        if med is not None and batch:
            med = med / batch
        rows.append(RunFigure(run=r.rel, arm=side, round=r.round, ok=r.ok, steps=len(steps),
                              step_ns=int(per) if per is not None else None,
                              median_step_ns=int(med) if med is not None else None, load=r.load))
    return tuple(rows)


def judge(
    arm: _Arm,
    baseline: _Arm,
    thresholds: Thresholds,
    opts: VerifyOptions,
    interrupted: bool = False,
    *,
    looks: int = 1,
    max_looks: int = 1,
    profiled_ns: int | None = None,
    confidence_pct: float | None = None,
    short: str = "",
) -> Verification:
    """The verdict on one arm's runs against the baseline runs of the same rounds (see the module
    docstring). ``looks``: this is the how-manyth look of ``max_looks`` at the interval; the error
    rate of ``confidence_pct`` (default ``opts.confidence_pct``) is shared over them (Bonferroni).
    ``short``: why fewer rounds ran than ``opts.trials`` asked (the budget), said instead of advice to
    ask for what was asked."""
    from gpudoctor.analysis.stats import bonferroni_confidence_pct, run_speedup_stats  # noqa: PLC0415 - scipy

    family = opts.confidence_pct if confidence_pct is None else confidence_pct
    level = bonferroni_confidence_pct(family, max_looks)
    minimum = thresholds.verify_min_speedup_ratio
    rounds = {r.round for r in arm.runs}
    base_all = [r for r in baseline.runs if not r.round or not rounds or r.round in rounds]
    base_runs = [r for r in base_all if r.ok]
    trial_runs = [r for r in arm.runs if r.ok]
    common = {
        "changes": arm.changes,
        "min_speedup": minimum,
        "confidence_pct": family,
        "statistic": arm.statistic,
        "trials": len(trial_runs),
        "baseline_runs": len(base_runs),
        "steps": opts.steps,
        "runs": tuple(r.rel for r in arm.runs),
        "errors": tuple(r.error for r in (*arm.runs, *base_all) if r.error),
        "looks": looks,
        "max_looks": max_looks,
        "look_confidence_pct": level,
        "profiled_step_ns": profiled_ns,
    }
    when = " (interrupted)" if interrupted else ""
    crashed = [r for r in arm.runs if not r.ok]
    if crashed:
        return Verification(VerifyStatus.INCONCLUSIVE, f"a run with the fix failed{when}: {crashed[0].error}", **common)
    if not trial_runs or not base_runs:
        side = "with the fix" if not trial_runs else "without it (baseline)"
        why = next((r.error for r in base_all if r.error), "") if not base_runs else ""
        return Verification(VerifyStatus.INCONCLUSIVE, f"no run {side} finished{when}" + (f": {why}" if why else ""), **common)
    missing = _not_applied(arm)
    if missing:
        return Verification(
            VerifyStatus.INCONCLUSIVE, "the change never took effect in the runs: " + "; ".join(missing), **common
        )
    by_epoch = arm.statistic == "epoch"
    batch_a = _batch(base_runs[0].settings)
    batch_b = _batch(trial_runs[0].settings)
    per_sample = bool(batch_a and batch_b and batch_a != batch_b)
    fa = _figures(base_runs, opts, arm.statistic, per_sample)
    fb = _figures(trial_runs, opts, arm.statistic, per_sample)
    n_a, n_b = sum(len(st) for _, st, _ in fa), sum(len(st) for _, st, _ in fb)
    base_load = mean_load([r.load for r in base_runs])
    trial_load = mean_load([r.load for r in trial_runs])
    counts = {"steps_baseline": n_a, "steps_trial": n_b, "per_sample": per_sample,
              "per_run": _per_run(arm, base_all, opts, arm.statistic, per_sample),
              "load_baseline": base_load, "load_trial": trial_load}
    if n_a < MIN_STEPS or n_b < MIN_STEPS:
        return Verification(
            VerifyStatus.INCONCLUSIVE,
            f"too few steady steps to compare: {n_a} without the fix, {n_b} with it "
            f"({MIN_STEPS} each needed after {opts.warmup_steps} warm-up steps per run){when}",
            **common, **counts,
        )
    if by_epoch:
        starts = {r.rel: _epoch_start_ids(r.steps) for r in base_runs}
        if not any(s.index in starts[r.rel] for r, st, _ in fa for s in st):
            return Verification(
                VerifyStatus.INCONCLUSIVE,
                f"the fix acts when an epoch starts, and no run started one after its {opts.warmup_steps} warm-up "
                f"steps: give --verify-steps more than an epoch's steps{when}",
                **common, **counts,
            )
    st = run_speedup_stats([p for _, _, p in fa if p], [p for _, _, p in fb if p], level)
    med_a = statistics.median(s.wall_ns / (batch_a if per_sample else 1) for _, steps, _ in fa for s in steps)
    med_b = statistics.median(s.wall_ns / (batch_b if per_sample else 1) for _, steps, _ in fb for s in steps)
    # the untouched script's time per step in the trials against the profiled run's step time: means both
    base_steps = [_trial_figures(steps).step_ns or 0 for _, steps, _ in fa if steps]
    base_step = statistics.fmean(base_steps) if base_steps else None
    unfair = load_unfair(base_load, trial_load, base_step, profiled_ns, thresholds)
    figures = {
        **counts,
        "speedup": round(st.speedup, 4) if st.speedup is not None else None,
        "ci": (round(st.ci_low, 4), round(st.ci_high, 4)) if st.ci_low is not None and st.ci_high is not None else None,
        "p_value": st.p_value,
        "test": st.test,
        "baseline_step_ns": int(st.mean_a) if st.mean_a is not None else None,
        "trial_step_ns": int(st.mean_b) if st.mean_b is not None else None,
        "median_baseline_step_ns": int(med_a),
        "median_trial_step_ns": int(med_b),
        "median_speedup": round(med_a / med_b, 4) if med_b > 0 else None,
        "load_reason": unfair,
    }
    what = "time per sample" if per_sample else "time per step"
    if by_epoch:
        what += " (epoch starts included: the fix acts there)"
    moved = (f"{what} {_ms(st.mean_a)} → {_ms(st.mean_b)} (median {'sample' if per_sample else 'step'} "
             f"{_ms(med_a)} → {_ms(med_b)})")

    over = (
        f"per run: baseline {_ms_list([p for _, _, p in fa])}, fix {_ms_list([p for _, _, p in fb])}; "
        f"{_n(len(trial_runs), 'run')} with the fix, {len(base_runs)} without; {n_b} and {n_a} steps{when}; "
        + load_text(base_load, trial_load)
    )
    if st.speedup is None:
        return Verification(VerifyStatus.INCONCLUSIVE, f"the speed-up cannot be formed: {moved} ({over})", **common, **figures)
    if st.ci_low is None or st.ci_high is None:
        few = min(len(fa), len(fb)) < MIN_RUNS
        if opts.trials < MIN_RUNS:
            more = f"give --verify-trials {MIN_RUNS} or more"
        elif short:
            more = short
        else:  # rounds asked, not run: interrupted, or runs without figures
            more = f"{min(len(fa), len(fb))} run a side of the {opts.trials} rounds asked{when}"
        why = (f"one run a side cannot show how much runs differ: {_x(st.speedup)}, {moved}; {more}" if few
               else f"no interval can be formed: {_x(st.speedup)}, {moved}")
        return Verification(VerifyStatus.INCONCLUSIVE, f"{why} ({over})", **common, **figures)
    ci = f"{family:g}% CI {_x(st.ci_low)}–{_x(st.ci_high)}"
    if max_looks > 1:
        ci += f", look {looks} of {max_looks} at {level:g}%"
    p = "p < 0.001" if st.p_value is not None and st.p_value < 0.001 else f"p = {st.p_value:.3f}"
    status, kind = decide(st.speedup, st.ci_low, st.ci_high, minimum)
    if kind == FASTER:
        text = f"{_x(st.speedup)} faster with the fix: {moved} ({ci}, {p}; {over})"
    elif kind == SLOWER:
        text = f"{_x(1 / st.speedup)} slower with the fix: {moved} ({ci}, {p}; {over})"
    elif kind == NO_GAIN:
        text = (
            f"no gain worth the fix: {moved}, {_x(st.speedup)} ({ci}, {p}), the whole interval under the "
            f"{_x(minimum)} a confirmed fix must reach ({over})"
        )
    else:
        text = (
            f"cannot tell: {moved}, {_x(st.speedup)} ({ci}, {p}) reaches both sides of the {_x(minimum)} a "
            f"confirmed fix must reach; more trials (--verify-trials, --verify-steps) narrow it ({over})"
        )
    if unfair:
        verdict = {VerifyStatus.CONFIRMED: "would be confirmed", VerifyStatus.REFUTED: "would be refuted"}.get(status, "")
        status = VerifyStatus.INCONCLUSIVE
        text = f"not a fair comparison: {unfair}; {verdict + ': ' if verdict else ''}{text}"
    return Verification(status, text, **common, **figures)


FASTER, SLOWER, NO_GAIN, STRADDLE = "faster", "slower", "no_gain", "straddle"  # what an interval says


def decide(speedup: float, ci_low: float, ci_high: float, minimum: float) -> tuple[VerifyStatus, str]:
    """The verdict an interval gives, and which kind: confirmed "faster" (the interval above 1 and
    the speed-up at least ``minimum``); refuted "slower" (the whole interval under 1 / ``minimum``:
    slower by at least what a fix must win, beyond noise) or "no_gain" (the whole interval under
    ``minimum``: whatever the change does, faster or slower, is less than a fix must win); else
    inconclusive "straddle". The minimum effect stands on both sides: a claim that a fix *hurts*
    needs as much as a claim that it helps."""
    if ci_low > 1.0 and speedup >= minimum:
        return VerifyStatus.CONFIRMED, FASTER
    if ci_high < 1.0 / minimum:
        return VerifyStatus.REFUTED, SLOWER
    if ci_high < minimum:
        return VerifyStatus.REFUTED, NO_GAIN
    return VerifyStatus.INCONCLUSIVE, STRADDLE


def undecided(v: Verification) -> bool:
    """More rounds could decide it: inconclusive on the figures (the interval straddles a
    threshold, one run a side, or the load differed), not on a crash or a change that never took
    effect."""
    return v.status == VerifyStatus.INCONCLUSIVE and v.speedup is not None and not v.errors
