"""``--verify``: apply each finding's fix in trial runs of the script and measure the speed-up.

``gpudoctor profile --verify`` and ``gpudoctor verify RUN`` call :func:`verify_report`
(scripts such as ``benchmarks/accuracy.py`` can call :func:`verify_run` with a run
directory). For each finding whose rule can apply its fix without editing the script
(``Rule.inject``), the script is run again, as the run's manifest recorded it (same
folder, arguments, interpreter), in *trial runs* under ``RUN/verify/``:

- every run is stopped after ``steps`` steps (``--verify-steps``) and records step
  timing only: ``steps.jsonl``, ``settings.json``, ``manifest.json``,
  ``samples.jsonl`` (psutil / NVML), the script's output in ``output.log``; no
  torch.profiler window and no cProfile;
- baseline runs (the script untouched, ``RUN/verify/baseline/N``) and fix runs (the
  fix injected, ``RUN/verify/GD201/N``) alternate, round after round, in an order that
  rotates every round, so that a machine that slows down or warms up over the trials
  weighs on both sides; findings whose fixes are the same change share their runs;
- each run's first ``warmup_steps`` steps (and the first step of each epoch) are left
  out: start-up, worker spawning, autotuning and allocator warm-up are one-off costs;
- the steady steps of all runs of a side are pooled and compared with the statistics
  ``gpudoctor compare`` uses (``analysis.stats``: the bootstrap interval of the ratio of
  medians, Mann–Whitney U).

A fix is ``confirmed`` when its speed-up's interval lies above 1, the test rejects
"same distribution" and the speed-up is at least ``Thresholds.verify_min_speedup_ratio``;
``refuted`` when the whole interval lies under that minimum (slower, or no gain worth
claiming); ``inconclusive`` otherwise, or when a fix run crashed (its error is kept), a
change never took effect in the trial, or too few steps were measured. A finding whose
fix needs a source edit or changes numerics is ``not_tried`` with the rule's reason.

Bounded and safe: no run starts once the time budget (``--verify-budget``) cannot hold
it (its length estimated from the runs so far), and a run still going when the budget
ends is stopped; Ctrl-C stops the trials and what was measured so far is judged. The
script's side effects (files it writes, network, checkpoints) are the user's: each
trial is a real run of it.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.analysis.ranks import steady_of
from gpudoctor.config import Config, Thresholds
from gpudoctor.errors import GpudoctorError, UsageError
from gpudoctor.model import (
    Finding,
    Injection,
    Manifest,
    Report,
    RunData,
    RunStatus,
    Settings,
    StepRecord,
    SummaryStat,
    Verification,
    VerifyStatus,
)

DEFAULT_STEPS = 30  # steps per trial run (--verify-steps)
DEFAULT_TRIALS = 3  # runs with each fix, as many baseline runs interleaved (--verify-trials)
DEFAULT_BUDGET_S = 300.0  # all trial runs together (--verify-budget)
DEFAULT_WARMUP_STEPS = 5  # steps at the start of each run left out (start-up, workers, autotuning)
CONFIDENCE_PCT = 95.0  # analysis.stats.CONFIDENCE_PCT (not imported here: it loads scipy)
MIN_STEPS = 5  # steady steps each side needs before it is judged (compare's minimum)
MARKER = ".gpudoctor-verify"  # in RUN/verify: a folder gpudoctor made (and may replace)
INTERNAL_CODE = "GD000"


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    steps: int = DEFAULT_STEPS
    trials: int = DEFAULT_TRIALS
    budget_s: float = DEFAULT_BUDGET_S
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    confidence_pct: float = CONFIDENCE_PCT
    progress: Callable[[str], None] | None = None  # one line per event (the CLI: stderr)

    def check(self) -> None:
        if self.steps < 1:
            raise UsageError("--verify-steps must be at least 1")
        if self.trials < 1:
            raise UsageError("--verify-trials must be at least 1")
        if self.budget_s <= 0:
            raise UsageError("--verify-budget must be more than 0 seconds")
        if self.steps < self.warmup_steps + MIN_STEPS:
            raise UsageError(
                f"--verify-steps {self.steps} leaves fewer than {MIN_STEPS} steps to compare after the "
                f"{self.warmup_steps} warm-up steps of each run; give at least {self.warmup_steps + MIN_STEPS}"
            )


@dataclass(frozen=True, slots=True)
class VerifyResult:
    report: Report  # the findings with their ``verification``
    interrupted: bool  # Ctrl-C stopped the trials (what was measured is judged)
    elapsed_s: float
    runs: int  # trial runs started (baseline and fixes)


# --------------------------------------------------------------------------- the plan


@dataclass(slots=True)
class _Run:
    rel: str  # run directory relative to the run
    ok: bool
    steps: list[StepRecord]
    settings: Settings | None
    duration_s: float
    error: str = ""  # how it failed (crashed, killed, stopped by the budget)
    status: str = ""  # the run's RunStatus value


@dataclass(slots=True)
class _Arm:
    """One set of changes and the findings that share it; ``changes`` empty: the baseline."""

    label: str  # "baseline", "GD201", "GD301+GD302"
    changes: tuple[Injection, ...]
    findings: list[int] = field(default_factory=list)  # indices into report.findings
    runs: list[_Run] = field(default_factory=list)
    statistic: str = "median"  # the rule's Rule.verify_statistic


def _key(changes: Sequence[Injection]) -> tuple[str, ...]:
    import json  # noqa: PLC0415

    return tuple(sorted(json.dumps(c.to_dict(), sort_keys=True) for c in changes))


def plan(report: Report, config: Config | None = None) -> tuple[list[_Arm], dict[int, str]]:
    """The fix arms to try (findings grouped by identical changes) and, for the other findings,
    why they are not tried."""
    from gpudoctor.rules.context import RuleContext  # noqa: PLC0415
    from gpudoctor.rules.registry import get  # noqa: PLC0415

    run = report.run
    thresholds = (config or Config()).thresholds
    not_tried: dict[int, str] = {}
    if run is None or run.manifest is None:
        for i, _ in enumerate(report.findings):
            not_tried[i] = "no run directory from `gpudoctor profile` to run again"
        return [], not_tried
    mf = run.manifest
    whole = ""
    if mf.launcher or (mf.world_size or 0) > 1:
        whole = "trials of distributed (torchrun) jobs are not supported"
    elif not run.steps and not mf.steps_seen:
        whole = "the run recorded no training steps: trial runs could not be timed"
    ctx = RuleContext(run, thresholds)
    arms: dict[tuple[str, ...], _Arm] = {}
    for i, f in enumerate(report.findings):
        if whole:
            not_tried[i] = whole
            continue
        if f.code == INTERNAL_CODE:
            not_tried[i] = "a rule that crashed, not a finding about the script"
            continue
        try:
            rule = get(f.code)
        except KeyError:
            not_tried[i] = f"{f.code} is not a rule of this gpudoctor"
            continue
        if rule.inject is None:
            not_tried[i] = rule.not_injectable or "the fix needs a change to the source"
            continue
        try:
            changes = rule.inject(f, ctx.for_rule(rule.code, rule.name))
        except Exception as err:  # a bug in a rule's inject: the finding stays untried, the rest goes on
            not_tried[i] = f"gpudoctor could not derive the change ({type(err).__name__}: {err})"
            continue
        if isinstance(changes, str) or not changes:
            not_tried[i] = changes or "the fix needs a change to the source"
            continue
        arm = arms.setdefault((*_key(changes), rule.verify_statistic),
                              _Arm("", tuple(changes), statistic=rule.verify_statistic))
        arm.findings.append(i)
    out = list(arms.values())
    labels: dict[str, int] = {}
    for arm in out:
        codes = "+".join(dict.fromkeys(report.findings[i].code for i in arm.findings))
        labels[codes] = labels.get(codes, 0) + 1
        arm.label = codes if labels[codes] == 1 else f"{codes}-{labels[codes]}"
    return out, not_tried


# --------------------------------------------------------------------------- running


def _say(opts: VerifyOptions, line: str) -> None:
    if opts.progress is not None:
        opts.progress(line)


def _verify_dir(run_dir: Path) -> Path:
    """``RUN/verify``, emptied when an earlier ``--verify`` made it; refused when it is not ours."""
    from gpudoctor.collect.rundir import VERIFY_DIR  # noqa: PLC0415

    d = run_dir / VERIFY_DIR
    if d.exists():
        if not (d / MARKER).is_file():
            raise UsageError(f"{d} exists and was not made by gpudoctor: move it away to verify this run")
        shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / MARKER).write_text("trial runs of `gpudoctor verify`; replaced by the next one\n", encoding="utf-8")
    return d


def _estimate_s(run: RunData, steps: int) -> float:
    """How long one trial run should take, from the profiled run: start-up + steps × median step."""
    mf = run.manifest
    recs = sorted(run.steps, key=lambda s: s.index)
    if recs:
        walls = sorted(s.wall_ns for s in recs)
        return (recs[0].start_ns + steps * walls[len(walls) // 2]) / 1e9
    return float(mf.duration_s or 0.0) if mf is not None else 0.0


def _trial(manifest: Manifest, run_dir: Path, rel: str, changes: tuple[Injection, ...],
           opts: VerifyOptions, timeout_s: float) -> _Run:
    """One trial run of the script as ``manifest`` recorded it, into ``run_dir / rel``."""
    from gpudoctor.collect import ProfileOptions, profile_run  # noqa: PLC0415
    from gpudoctor.parse.rundir import read_settings, read_steps  # noqa: PLC0415

    if manifest.module:
        script, module, args = None, manifest.module, tuple(manifest.argv[1:])
    else:
        script, module, args = manifest.argv[0] if manifest.argv else manifest.script, None, tuple(manifest.argv[1:])
    target = run_dir / rel
    t0 = time.monotonic()
    result = profile_run(
        ProfileOptions(
            script=script,
            module=module,
            args=args,
            cwd=manifest.cwd,
            run_dir=target,
            max_steps=opts.steps,
            torch_profiler=False,
            cprofile=False,
            summary=False,
            output_log=True,
            injections=changes,
            command=manifest.command,
            timeout_s=max(1.0, timeout_s),
        )
    )
    duration = time.monotonic() - t0
    notes: list[str] = []
    steps = list(read_steps(target, notes))
    settings = read_settings(target, notes)
    m = result.manifest
    if m.status in (RunStatus.COMPLETED, RunStatus.STOPPED) and m.exit_code == 0:
        return _Run(rel, True, steps, settings, duration, status=m.status.value)
    what = m.status_detail or m.status.value
    if m.exception is not None:
        what = f"{m.exception.type}: {m.exception.message.splitlines()[0] if m.exception.message else ''}"
        if m.exception.call_site is not None:
            what += f" at {m.exception.call_site}"
    return _Run(rel, False, steps, settings, duration, error=f"{rel}: {m.status.value}: {what} (see {rel}/output.log)",
                status=m.status.value)


def _steady(run: _Run, warmup: int, statistic: str = "median") -> list[StepRecord]:
    """The steps a run is judged on: after its warm-up, and for medians without the first step of
    each epoch (one-off costs); by epoch, every step after the warm-up, epoch starts included."""
    if statistic == "epoch":
        return sorted((s for s in run.steps if s.index >= warmup), key=lambda s: s.index)
    return [s for s in steady_of(run.steps) if s.index >= warmup]


def _epoch_start_ids(steps: Sequence[StepRecord]) -> set[int]:
    """Indices of the steps that begin an epoch (the epoch number changes from the step before)."""
    ordered = sorted(steps, key=lambda s: s.index)
    return {b.index for a, b in zip(ordered, ordered[1:], strict=False) if b.epoch is not None and b.epoch != a.epoch}


# --------------------------------------------------------------------------- judging


def _ms(ns: float | None) -> str:
    if ns is None:
        return "?"
    return f"{ns / 1e6:.3g} ms" if ns >= 1e5 else f"{ns / 1e3:.3g} µs"


def _x(v: float | None) -> str:
    return "?" if v is None or not math.isfinite(v) else f"{v:.2f}×"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


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


def judge(
    arm: _Arm,
    baseline: _Arm,
    thresholds: Thresholds,
    opts: VerifyOptions,
    interrupted: bool = False,
) -> Verification:
    """The verdict on one arm's runs against the baseline runs (see the module docstring)."""
    from gpudoctor.analysis.stats import speedup_stats, stratified_speedup_stats  # noqa: PLC0415 - scipy

    minimum = thresholds.verify_min_speedup_ratio
    base_runs = [r for r in baseline.runs if r.ok]
    trial_runs = [r for r in arm.runs if r.ok]
    common = {
        "changes": arm.changes,
        "min_speedup": minimum,
        "confidence_pct": opts.confidence_pct,
        "trials": len(trial_runs),
        "baseline_runs": len(base_runs),
        "steps": opts.steps,
        "runs": tuple(r.rel for r in arm.runs),
        "errors": tuple(r.error for r in (*arm.runs, *baseline.runs) if r.error),
    }
    when = " (interrupted)" if interrupted else ""
    crashed = [r for r in arm.runs if not r.ok]
    if crashed:
        return Verification(VerifyStatus.INCONCLUSIVE, f"a run with the fix failed{when}: {crashed[0].error}", **common)
    if not trial_runs or not base_runs:
        side = "with the fix" if not trial_runs else "without it (baseline)"
        why = baseline.runs[0].error if baseline.runs and not base_runs and baseline.runs[0].error else ""
        return Verification(VerifyStatus.INCONCLUSIVE, f"no run {side} finished{when}" + (f": {why}" if why else ""), **common)
    missing = _not_applied(arm)
    if missing:
        return Verification(
            VerifyStatus.INCONCLUSIVE, "the change never took effect in the runs: " + "; ".join(missing), **common
        )
    by_epoch = arm.statistic == "epoch"
    base = [s for r in base_runs for s in _steady(r, opts.warmup_steps, arm.statistic)]
    trial = [s for r in trial_runs for s in _steady(r, opts.warmup_steps, arm.statistic)]
    counts = {"steps_baseline": len(base), "steps_trial": len(trial), "statistic": arm.statistic}
    if len(base) < MIN_STEPS or len(trial) < MIN_STEPS:
        return Verification(
            VerifyStatus.INCONCLUSIVE,
            f"too few steady steps to compare: {len(base)} without the fix, {len(trial)} with it "
            f"({MIN_STEPS} each needed after {opts.warmup_steps} warm-up steps per run){when}",
            **common, **counts,
        )
    starts = {r.rel: _epoch_start_ids(r.steps) for r in (*base_runs, *trial_runs)}
    if by_epoch and not any(s.index in starts[r.rel] for r in base_runs for s in _steady(r, opts.warmup_steps, "epoch")):
        return Verification(
            VerifyStatus.INCONCLUSIVE,
            f"the fix acts when an epoch starts, and no run started one after its {opts.warmup_steps} warm-up "
            f"steps: give --verify-steps more than an epoch's steps{when}",
            **common, **counts,
        )
    batch_a = _batch(base_runs[0].settings)
    batch_b = _batch(trial_runs[0].settings)
    per_sample = bool(batch_a and batch_b and batch_a != batch_b)

    def times(runs: list[_Run], batch: int | None, first: bool | None = None) -> list[float]:
        """Step times (per sample when the batch size differs); ``first``: only epoch starts / only the rest."""
        return [
            s.wall_ns / batch if per_sample and batch else float(s.wall_ns)
            for r in runs
            for s in _steady(r, opts.warmup_steps, arm.statistic)
            if first is None or (s.index in starts[r.rel]) == first
        ]

    if by_epoch:  # epoch starts and the other steps, each by its median, weighted by how often they occur
        st = stratified_speedup_stats(
            (times(base_runs, batch_a, True), times(base_runs, batch_a, False)),
            (times(trial_runs, batch_b, True), times(trial_runs, batch_b, False)),
            opts.confidence_pct,
        )
    else:
        st = speedup_stats(times(base_runs, batch_a), times(trial_runs, batch_b), opts.confidence_pct)
    figures = {
        **counts,
        "speedup": round(st.speedup, 4) if st.speedup is not None else None,
        "ci": (round(st.ci_low, 4), round(st.ci_high, 4)) if st.ci_low is not None and st.ci_high is not None else None,
        "p_value": st.p_value,
        "baseline_step_ns": int(st.median_a),
        "trial_step_ns": int(st.median_b),
        "per_sample": per_sample,
    }
    what = "median time per sample" if per_sample else "median step"
    if by_epoch:
        what = "time per step by epoch (epoch starts and other steps, each by its median)"
    moved = f"{what} {_ms(st.median_a)} → {_ms(st.median_b)}"
    over = (
        f"{_n(len(trial_runs), 'run')} with the fix, {len(base_runs)} without; "
        f"{len(trial)} and {len(base)} steady steps{when}"
    )
    if st.speedup is None or st.ci_low is None or st.ci_high is None:
        return Verification(VerifyStatus.INCONCLUSIVE, f"the speed-up cannot be formed: {moved} ({over})", **common, **figures)
    ci = f"{opts.confidence_pct:g}% CI {_x(st.ci_low)}–{_x(st.ci_high)}"
    if st.p_value is None:
        p = "no rank test"
    else:
        p = "p < 0.001" if st.p_value < 0.001 else f"p = {st.p_value:.3f}"
    if st.significant and st.ci_low > 1.0 and st.speedup >= minimum:
        status = VerifyStatus.CONFIRMED
        text = f"{_x(st.speedup)} faster with the fix: {moved} ({ci}, {p}; {over})"
    elif st.ci_high < 1.0:
        status = VerifyStatus.REFUTED
        text = f"{_x(1 / st.speedup)} slower with the fix: {moved} ({ci}, {p}; {over})"
    elif st.ci_high < minimum:
        status = VerifyStatus.REFUTED
        text = (
            f"no gain worth the fix: {moved}, {_x(st.speedup)} ({ci}, {p}), the whole interval under the "
            f"{_x(minimum)} a confirmed fix must reach ({over})"
        )
    else:
        status = VerifyStatus.INCONCLUSIVE
        text = (
            f"cannot tell: {moved}, {_x(st.speedup)} ({ci}, {p}) reaches both sides of the {_x(minimum)} a "
            f"confirmed fix must reach; more trials (--verify-trials, --verify-steps) narrow it ({over})"
        )
    return Verification(status, text, **common, **figures)


# --------------------------------------------------------------------------- entry points


def verify_report(report: Report, config: Config | None = None, opts: VerifyOptions | None = None) -> VerifyResult:
    """Run the trials for ``report``'s findings (its ``run`` must be a run directory of
    ``gpudoctor profile``) and return the report with every finding's ``verification``."""
    opts = opts or VerifyOptions()
    opts.check()
    config = config or Config()
    arms, not_tried = plan(report, config)
    run = report.run
    t0 = time.monotonic()
    verifications: dict[int, Verification] = {
        i: Verification(VerifyStatus.NOT_TRIED, why) for i, why in not_tried.items()
    }
    if not arms:
        return VerifyResult(_attach(report, verifications), False, 0.0, 0)
    assert run is not None and run.manifest is not None
    manifest = run.manifest
    _check_target(manifest)
    run_dir = Path(run.source)
    rdir = _verify_dir(run_dir)
    baseline = _Arm("baseline", ())
    units = [baseline, *arms]
    estimate = max(_estimate_s(run, opts.steps), 0.1)
    interrupted = False
    out_of_budget = False
    started = 0
    _say(opts, f"gpudoctor: verify: {len(arms)} fix(es) to try ({', '.join(a.label for a in arms)}), "
               f"{opts.trials} round(s) of {len(units)} runs of {opts.steps} steps, budget {opts.budget_s:g} s; "
               f"trial runs in {rdir}")
    try:
        for rnd in range(opts.trials):
            order = units[rnd % len(units):] + units[: rnd % len(units)]
            for arm in order:
                left = opts.budget_s - (time.monotonic() - t0)
                if left < estimate:
                    out_of_budget = True
                    break
                rel = f"{rdir.name}/{arm.label}/{rnd + 1}"
                what = "baseline (no change)" if not arm.changes else f"{arm.label} fix ({_changes_text(arm.changes)})"
                _say(opts, f"gpudoctor: verify [{time.monotonic() - t0:.0f}/{opts.budget_s:g} s] "
                           f"round {rnd + 1}/{opts.trials}: {what}")
                started += 1
                try:
                    r = _trial(manifest, run_dir, rel, arm.changes, opts, left)
                except GpudoctorError as err:
                    r = _Run(rel, False, [], None, 0.0, error=f"{rel}: could not start: {err}")
                arm.runs.append(r)
                estimate = max(estimate, r.duration_s)
                steady = _steady(r, opts.warmup_steps)
                med = statistics.median(s.wall_ns for s in steady) if steady else None
                _say(opts, "gpudoctor: verify   " + (
                    f"{len(r.steps)} steps in {r.duration_s:.1f} s, median steady step {_ms(med)}" if r.ok else r.error
                ))
                if r.status == RunStatus.INTERRUPTED.value:
                    interrupted = True
                    arm.runs.pop()  # an interrupted run is neither side's evidence
                    break
            if interrupted or out_of_budget:
                break
    except KeyboardInterrupt:
        interrupted = True
    if interrupted:
        _say(opts, "gpudoctor: verify: interrupted; judging what was measured")
    elif out_of_budget:
        _say(opts, f"gpudoctor: verify: the budget of {opts.budget_s:g} s is spent; judging what was measured")
    for arm in arms:
        if not arm.runs:
            why = (
                "interrupted (Ctrl-C) before its trial runs" if interrupted
                else f"the --verify-budget of {opts.budget_s:g} s ran out before its trial runs"
            )
            v = Verification(VerifyStatus.NOT_TRIED, why, changes=arm.changes, steps=opts.steps)
        else:
            v = judge(arm, baseline, config.thresholds, opts, interrupted)
        for i in arm.findings:
            verifications[i] = v
    return VerifyResult(_attach(report, verifications), interrupted, time.monotonic() - t0, started)


def verify_run(
    run_dir: Path | str, config: Config | None = None, opts: VerifyOptions | None = None, report: Report | None = None
) -> VerifyResult:
    """Diagnose ``run_dir`` (a run directory of ``gpudoctor profile``; ``report`` when already
    diagnosed) and verify its findings: the entry point for scripts such as the accuracy benchmark."""
    from gpudoctor.analysis import analyze_trace  # noqa: PLC0415
    from gpudoctor.engine import diagnose  # noqa: PLC0415
    from gpudoctor.parse import load_inputs  # noqa: PLC0415

    config = config or Config()
    if report is None:
        path = Path(run_dir)
        if not (path / "manifest.json").is_file():
            raise UsageError(f"{path}: not a run directory of `gpudoctor profile` (no manifest.json); verify needs one")
        loaded = load_inputs([path])
        metrics = tuple(analyze_trace(t, loaded.run) for t in loaded.timelines)
        report = diagnose(dataclasses.replace(loaded.run, metrics=metrics), config, kind="analyze")
    return verify_report(report, config, opts)


def _check_target(m: Manifest) -> None:
    """The script (or module) and its folder must still be there to run again."""
    if not Path(m.cwd).is_dir():
        raise UsageError(f"the run's working directory {m.cwd} no longer exists: trials run the script from there")
    if m.module is None:
        script = m.script or ""
        if not Path(script).is_file():
            raise UsageError(f"{script or 'the script'}: no such file any more; trials run the script the run recorded")


def _changes_text(changes: Sequence[Injection]) -> str:
    return "; ".join(c.text or f"{c.key}={c.value!r}" for c in changes)


def carry_over(report: Report, previous: Report | None) -> Report:
    """``report`` with the verifications of an earlier report of the same run (``report.json``) on the
    findings they still fit (same code, rank and location): ``analyze`` and ``report`` diagnose a run
    again without losing what ``verify`` measured."""
    if previous is None:
        return report

    def key(f: Finding) -> tuple[str, int | None, str]:
        return f.code, f.rank, str(f.location) if f.location is not None else ""

    earlier = {key(f): f.verification for f in previous.findings if f.verification is not None}
    found = {i: earlier[key(f)] for i, f in enumerate(report.findings) if key(f) in earlier}
    return _attach(report, found) if found else report


def read_previous(run_dir: Path) -> Report | None:
    """The run's ``report.json`` when it holds verifications (None when absent or unreadable)."""
    import json  # noqa: PLC0415

    try:
        data = json.loads((Path(run_dir) / "report.json").read_text(encoding="utf-8"))
        previous = Report.from_dict(data)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return previous if any(f.verification is not None for f in previous.findings) else None


def _attach(report: Report, verifications: dict[int, Verification]) -> Report:
    """The findings with their verification, and a headline count of the outcomes."""
    findings = tuple(
        dataclasses.replace(f, verification=verifications.get(i, f.verification)) for i, f in enumerate(report.findings)
    )
    counts = {s: sum(1 for f in findings if f.verification is not None and f.verification.status == s) for s in VerifyStatus}
    text = ", ".join(f"{n} {s.value.replace('_', ' ')}" for s, n in counts.items())
    summary = tuple(s for s in report.summary if s.key != "verified") + (
        SummaryStat("verified", "verified fixes", text),
    )
    return dataclasses.replace(report, findings=findings, summary=summary)


def progress_to_stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
