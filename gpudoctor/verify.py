"""``--verify``: apply each finding's fix in trial runs of the script and measure the speed-up.

``gpudoctor profile --verify`` and ``gpudoctor verify RUN`` call :func:`verify_report`
(scripts such as ``benchmarks/accuracy.py`` can call :func:`verify_run` with a run
directory, ``benchmarks/verify_aa.py`` calls :func:`measure` with arms of its own). For
each finding whose rule can apply its fix without editing the script (``Rule.inject``),
the script is run again, as the run's manifest recorded it (same folder, arguments,
interpreter), in *trial runs* under ``RUN/verify/``:

- every run is stopped after ``steps`` steps (``--verify-steps``) and records step
  timing only: ``steps.jsonl``, ``settings.json``, ``manifest.json``,
  ``samples.jsonl`` (psutil / NVML, and the whole machine's load), the script's output
  in ``output.log``; no torch.profiler window and no cProfile;
- baseline runs (the script untouched, ``RUN/verify/baseline/N``) and fix runs (the
  fix injected, ``RUN/verify/GD201/N``) alternate, round after round, in an order that
  rotates every round, so that a machine that slows down or warms up over the trials
  weighs on both sides; findings whose fixes are the same change share their runs, and
  each fix is compared with the baseline runs of its own rounds;
- each run's first ``warmup_steps`` steps (and the first step of each epoch) are left
  out: start-up, worker spawning, autotuning and allocator warm-up are one-off costs.

**The run is the unit** (docs/verify.md). Each run gives one figure, its *time per
step*: the total wall time of its judged steps ÷ their count (throughput: what an epoch
costs; per sample when the fix changes the batch size); the median step is shown
beside it. The two sides' figures are compared by Welch's t-test on their logarithms
(``analysis.stats.run_speedup_stats``): the speed-up is the ratio of the geometric
means, with its interval. A rule may ask for another statistic with a reason
(``Rule.verify_statistic``): "epoch" keeps the first step of each epoch (GD202: its gain
is there).

A fix is ``confirmed`` when its interval lies above 1 and the speed-up is at least
``Thresholds.verify_min_speedup_ratio``; ``refuted`` when the whole interval lies under
that minimum (slower, or no gain worth claiming); ``inconclusive`` otherwise, or when a
fix run crashed (its error is kept), a change never took effect in the trial, too few
runs or steps were measured, the machine's load differed between the two sides
(``verify_load_gap_pct``), or the untouched script ran far slower in the trials than in
the profiled run (``verify_max_slowdown_ratio``). A finding whose fix needs a source edit
or changes numerics is ``not_tried`` with the rule's reason.

**Sequential rounds.** After ``trials`` rounds the interval is looked at; a fix still
undecided (its interval straddles the thresholds, or the load differed) gets more rounds,
up to ``max_trials``, while the budget allows, and is looked at once more. The error rate
is shared over the two looks (Bonferroni: each look's interval at 1 − α/2), so the
interval reported covers the true ratio with at least ``confidence_pct`` whichever look
stopped.

**The ladder.** A fix that sets a sized knob (``num_workers``, ``batch_size`` at a
DataLoader) and is refuted or inconclusive is tried again at the next rungs (workers ×2 up
to ``verify_workers_per_core_ratio`` × cores; batch ×2 while no run fails, out of memory or
otherwise), ``trials`` rounds each, while each rung does better than the last and the
budget allows. The rungs share one error rate (Bonferroni over the rungs planned). The best
confirmed setting becomes the finding's verification, and its fix names that value.

Bounded and safe: no run starts once the time budget (``--verify-budget``) cannot hold
it (its length estimated from the runs so far), and a run still going when the budget
ends is stopped; Ctrl-C stops the trials and what was measured so far is judged. The
script's side effects (files it writes, network, checkpoints) are the user's: each
trial is a real run of it. With nothing to try, one line on stderr and the report's
"verified" summary say so.
"""

from __future__ import annotations

import dataclasses
import fcntl
import math
import os
import re
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.analysis.ranks import steady_of
from gpudoctor.config import Config, Thresholds
from gpudoctor.errors import GpudoctorError, UsageError
from gpudoctor.model import (
    Finding,
    HostLoad,
    Injection,
    LadderRung,
    Manifest,
    Report,
    RunData,
    RunFigure,
    RunStatus,
    Settings,
    StepRecord,
    SummaryStat,
    Verification,
    VerifyStatus,
    layout,
)
from gpudoctor.safe import terminal_line as safe_line
from gpudoctor.signals import signum_of

DEFAULT_STEPS = 30  # steps per trial run (--verify-steps)
DEFAULT_TRIALS = 3  # rounds before the first look: runs with each fix, as many baseline runs (--verify-trials)
DEFAULT_BUDGET_S = 300.0  # all trial runs together (--verify-budget)
DEFAULT_WARMUP_STEPS = 5  # steps at the start of each run left out (start-up, workers, autotuning)
CONFIDENCE_PCT = 95.0  # analysis.stats.CONFIDENCE_PCT (not imported here: it loads scipy)
MIN_STEPS = 5  # judged steps each side needs before it is judged (compare's minimum)
MIN_RUNS = 2  # runs a side before an interval can be formed (one run shows no run-to-run spread)
SAMPLE_INTERVAL_MS = 100  # trial runs sample the machine's load twice as often as a profile (they are short)
LADDER_MAX_BATCH_RUNGS = 3  # batch size ×2, ×4, ×8 at most (each until a run fails)
MARKER = layout.VERIFY_MARKER  # in RUN/verify: a folder gpudoctor made (and may replace)
INTERNAL_CODE = "GD000"
STATISTICS = ("throughput", "epoch")  # Rule.verify_statistic: steady steps, or epoch starts kept
SIZED_KNOBS = ("num_workers", "batch_size")  # DataLoader arguments the ladder climbs


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    steps: int = DEFAULT_STEPS
    trials: int = DEFAULT_TRIALS
    budget_s: float = DEFAULT_BUDGET_S
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    confidence_pct: float = CONFIDENCE_PCT
    progress: Callable[[str], None] | None = None  # one line per event (the CLI: stderr)
    max_trials: int | None = None  # rounds at most for a fix still undecided (--verify-max-trials); None: 2 × trials
    ladder: bool = True  # climb a sized knob's ladder when its first setting is not confirmed
    out_dir: Path | None = None  # where the trial runs go (--out); None: RUN/verify
    allow_changed: bool = False  # run the script although it changed since it was profiled (--allow-changed)
    allow_outside: bool = False  # run a script outside the run's recorded working directory (--yes)

    def check(self) -> None:
        if self.steps < 1:
            raise UsageError("--verify-steps must be at least 1")
        if self.trials < 1:
            raise UsageError("--verify-trials must be at least 1")
        if self.max_trials is not None and self.max_trials < self.trials:
            raise UsageError(f"--verify-max-trials ({self.max_trials}) must be at least --verify-trials ({self.trials})")
        if not math.isfinite(self.budget_s) or self.budget_s <= 0:
            raise UsageError(f"--verify-budget {self.budget_s!r}: give a finite number of seconds above 0")
        if self.steps < self.warmup_steps + MIN_STEPS:
            raise UsageError(
                f"--verify-steps {self.steps} leaves fewer than {MIN_STEPS} steps to compare after the "
                f"{self.warmup_steps} warm-up steps of each run; give at least {self.warmup_steps + MIN_STEPS}"
            )

    @property
    def rounds_max(self) -> int:
        """Rounds a fix still undecided after the first look may get in all."""
        return max(self.trials, self.max_trials if self.max_trials is not None else 2 * self.trials)

    @property
    def max_looks(self) -> int:
        """Looks at each fix's interval: after ``trials`` rounds, and after ``rounds_max`` when more."""
        return 2 if self.rounds_max > self.trials else 1


@dataclass(frozen=True, slots=True)
class VerifyResult:
    report: Report  # the findings with their ``verification``
    interrupted: bool  # Ctrl-C stopped the trials (what was measured is judged)
    elapsed_s: float
    runs: int  # trial runs started (baseline and fixes)
    signum: int | None = None  # the signal that stopped the trials (SIGINT, SIGTERM, SIGHUP); None: not stopped


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
    round: int = 0  # the round it ran in (1-based; 0: unknown, compared with every round)
    load: HostLoad | None = None  # how busy the machine was during its judged steps
    signals: tuple[int, ...] = ()  # signals gpudoctor got during the run (passed on to the script): stop verify


@dataclass(slots=True)
class _Arm:
    """One set of changes and the findings that share it; ``changes`` empty: the baseline."""

    label: str  # "baseline", "GD201", "GD301+GD302", "GD201@num_workers=4" (a rung of the ladder)
    changes: tuple[Injection, ...]
    findings: list[int] = field(default_factory=list)  # indices into report.findings
    runs: list[_Run] = field(default_factory=list)
    statistic: str = "throughput"  # the rule's Rule.verify_statistic

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
        statistic = rule.verify_statistic if rule.verify_statistic in STATISTICS else "throughput"
        arm = arms.setdefault((*_key(changes), statistic), _Arm("", tuple(changes), statistic=statistic))
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


def trials_dir(run_dir: Path, opts: VerifyOptions) -> Path:
    """Where the trial runs go: ``--out DIR``, else ``RUN/verify``."""
    return Path(opts.out_dir) if opts.out_dir is not None else run_dir / layout.VERIFY_DIR


def _verify_dir(d: Path) -> Path:
    """The trial runs' folder, emptied when an earlier ``verify`` made it; refused when it is not ours
    (an existing folder with files gpudoctor did not write), and a one-line error with what to do when
    it cannot be written (a read-only run directory: ``--out DIR``)."""
    try:
        if d.exists():
            if not d.is_dir():
                raise UsageError(f"{d} is not a folder: pass --out with a folder for the trial runs")
            if not (d / MARKER).is_file() and any(d.iterdir()):
                raise UsageError(f"{d} exists and was not made by gpudoctor: move it away, or pass --out with "
                                 "another folder for the trial runs")
            shutil.rmtree(d)
        d.mkdir(parents=True)
        (d / MARKER).write_text("trial runs of `gpudoctor verify`; replaced by the next one\n", encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write the trial runs into {d}: {err.strerror or err}; pass --out DIR "
                         "(a writable folder) to verify a read-only run") from None
    return d


@contextmanager
def _verify_lock(d: Path):
    """One ``verify`` at a time per trial folder: a second one fails at once with what to do, instead
    of emptying the first one's runs. The lock (``.NAME.lock`` beside the folder) is released when the
    process ends, however it ends."""
    lock = d.parent / layout.lock_name(d.name)
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as err:
        raise UsageError(f"cannot write the trial runs beside {d}: {err.strerror or err}; pass --out DIR "
                         "(a writable folder) to verify a read-only run") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise UsageError(f"another `gpudoctor verify` is running trials in {d}; wait for it to finish, or "
                             "pass --out with another folder") from None
        yield
    finally:
        os.close(fd)


def _estimate_s(run: RunData, steps: int) -> float:
    """How long one trial run should take, from the profiled run: start-up + steps × median step."""
    mf = run.manifest
    recs = sorted(run.steps, key=lambda s: s.index)
    if recs:
        walls = sorted(s.wall_ns for s in recs)
        return (recs[0].start_ns + steps * walls[len(walls) // 2]) / 1e9
    return float(mf.duration_s or 0.0) if mf is not None else 0.0


def _trial(manifest: Manifest, run_dir: Path, rel: str, changes: tuple[Injection, ...],
           opts: VerifyOptions, timeout_s: float, rnd: int = 0) -> _Run:
    """One trial run of the script as ``manifest`` recorded it, into ``run_dir / rel``."""
    from gpudoctor.analysis.load import host_load  # noqa: PLC0415
    from gpudoctor.collect import ProfileOptions, profile_run  # noqa: PLC0415
    from gpudoctor.parse.rundir import read_samples, read_settings, read_steps  # noqa: PLC0415

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
            sample_interval_ms=SAMPLE_INTERVAL_MS,
        )
    )
    duration = time.monotonic() - t0
    notes: list[str] = []
    steps = list(read_steps(target, notes))
    settings = read_settings(target, notes)
    judged = [s for s in steps if s.index >= opts.warmup_steps] or steps
    load = None
    if judged:
        span = (min(s.start_ns for s in judged), max(s.start_ns + s.wall_ns for s in judged))
        load = host_load(read_samples(target, notes), *span)
    m = result.manifest
    got = tuple(getattr(result, "signals", ()) or ())
    if m.status in (RunStatus.COMPLETED, RunStatus.STOPPED) and m.exit_code == 0 and not got:
        return _Run(rel, True, steps, settings, duration, status=m.status.value, round=rnd, load=load)
    what = m.status_detail or m.status.value
    if m.exception is not None:
        what = f"{m.exception.type}: {m.exception.message.splitlines()[0] if m.exception.message else ''}"
        if m.exception.call_site is not None:
            what += f" at {m.exception.call_site}"
    return _Run(rel, False, steps, settings, duration, error=f"{rel}: {m.status.value}: {what} (see {rel}/{layout.OUTPUT_LOG})",
                status=m.status.value, round=rnd, load=load, signals=got)


def _steady(run: _Run, warmup: int, statistic: str = "throughput") -> list[StepRecord]:
    """The steps a run is judged on: after its warm-up, and without the first step of each epoch
    (a one-off cost); for "epoch", every step after the warm-up, epoch starts included."""
    if statistic == "epoch":
        return sorted((s for s in run.steps if s.index >= warmup), key=lambda s: s.index)
    return [s for s in steady_of(run.steps) if s.index >= warmup]


def _epoch_start_ids(steps: Sequence[StepRecord]) -> set[int]:
    """Indices of the steps that begin an epoch (the epoch number changes from the step before)."""
    ordered = sorted(steps, key=lambda s: s.index)
    return {b.index for a, b in zip(ordered, ordered[1:], strict=False) if b.epoch is not None and b.epoch != a.epoch}


def profiled_step_ns(run: RunData | None, warmup: int = DEFAULT_WARMUP_STEPS) -> int | None:
    """The profiled run's median steady step outside its instrumented windows (torch.profiler,
    cProfile): what the trial runs of the untouched script should take on the same machine."""
    if run is None or not run.steps:
        return None
    steady = [s for s in steady_of(run.steps) if s.index >= warmup and not s.window] or steady_of(run.steps)
    return int(statistics.median(s.wall_ns for s in steady)) if steady else None


# --------------------------------------------------------------------------- judging


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


def _figures(runs: Sequence[_Run], opts: VerifyOptions, statistic: str,
             per_sample: bool) -> list[tuple[_Run, list[StepRecord], float | None]]:
    """Each run with its judged steps and its time per step (per sample when ``per_sample``)."""
    out = []
    for r in runs:
        steps = _steady(r, opts.warmup_steps, statistic)
        batch = _batch(r.settings) if per_sample else None
        per = None
        if steps:
            per = sum(s.wall_ns for s in steps) / len(steps)
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
        med = statistics.median(s.wall_ns for s in steps) if steps else None
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
) -> Verification:
    """The verdict on one arm's runs against the baseline runs of the same rounds (see the module
    docstring). ``looks``: this is the how-manyth look of ``max_looks`` at the interval; the error
    rate of ``confidence_pct`` (default ``opts.confidence_pct``) is shared over them (Bonferroni)."""
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
    base_median_step = statistics.median(s.wall_ns for _, steps, _ in fa for s in steps)
    unfair = load_unfair(base_load, trial_load, base_median_step, profiled_ns, thresholds)
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
        why = (f"one run a side cannot show how much runs differ: {_x(st.speedup)}, {moved}; give --verify-trials "
               f"{MIN_RUNS} or more" if few else f"no interval can be formed: {_x(st.speedup)}, {moved}")
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


# --------------------------------------------------------------------------- running the rounds


@dataclass(slots=True)
class _Session:
    """The trial runs of one verify: where they go, the budget, what stopped them."""

    manifest: Manifest
    run_dir: Path
    rdir: Path
    opts: VerifyOptions
    estimate_s: float
    t0: float = field(default_factory=time.monotonic)
    rounds: int = 0  # rounds started
    started: int = 0  # runs started
    interrupted: bool = False
    signum: int | None = None  # the signal that interrupted it (SIGINT, SIGTERM, SIGHUP)
    out_of_budget: bool = False
    baseline: _Arm | None = None  # the untouched script's runs, every round

    def left_s(self) -> float:
        return self.opts.budget_s - (time.monotonic() - self.t0)

    def round(self, baseline: _Arm, arms: Sequence[_Arm], what: str = "") -> bool:
        """One round: a baseline run and a run of each arm, in an order that rotates every round.
        False when the budget or Ctrl-C stopped it (the runs made are kept)."""
        opts = self.opts
        self.rounds += 1
        rnd = self.rounds
        units = [baseline, *arms]
        k = (rnd - 1) % len(units)
        order = units[k:] + units[:k]
        for arm in order:
            left = self.left_s()
            if left < self.estimate_s:
                self.out_of_budget = True
                return False
            rel = _rel(self.run_dir, self.rdir / arm.label / str(rnd))
            desc = "baseline (no change)" if not arm.changes else f"{arm.label} fix ({_changes_text(arm.changes)})"
            _say(opts, f"gpudoctor: verify [{time.monotonic() - self.t0:.0f}/{opts.budget_s:g} s] "
                       f"round {rnd}{what}: {desc}")
            self.started += 1
            try:
                r = _trial(self.manifest, self.run_dir, rel, arm.changes, opts, left, rnd)
            except GpudoctorError as err:
                r = _Run(rel, False, [], None, 0.0, error=f"{rel}: could not start: {err}", round=rnd)
            except KeyboardInterrupt as exc:
                self.interrupted = True
                self.signum = signum_of(exc)
                return False
            arm.runs.append(r)
            self.estimate_s = max(self.estimate_s, r.duration_s)
            steady = _steady(r, opts.warmup_steps)
            per = sum(s.wall_ns for s in steady) / len(steady) if steady else None
            med = statistics.median(s.wall_ns for s in steady) if steady else None
            busy = ""
            if r.load is not None and r.load.others_cpu_pct is not None:
                busy = f", other processes {_cores(r.load.others_cpu_pct)} cores"
            _say(opts, "gpudoctor: verify   " + (
                f"{len(r.steps)} steps in {r.duration_s:.1f} s, {_ms(per)} per steady step (median {_ms(med)}){busy}"
                if r.ok else r.error
            ))
            if r.status == RunStatus.INTERRUPTED.value or r.signals:
                # Ctrl-C, or SIGTERM/SIGHUP passed on to the trial (a CI cancel, `timeout`): stop at the first
                self.interrupted = True
                self.signum = r.signals[0] if r.signals else int(signal.SIGINT)
                arm.runs.pop()  # an interrupted run is neither side's evidence
                return False
        return True

    def fits_round(self, arms: int) -> bool:
        """A whole round of ``arms`` fix runs and a baseline run fits in what is left of the budget."""
        return self.left_s() >= self.estimate_s * (arms + 1)


def measure(
    run: RunData,
    arms: Sequence[_Arm],
    config: Config | None = None,
    opts: VerifyOptions | None = None,
) -> tuple[dict[str, Verification], _Session | None]:
    """Interleaved rounds of ``arms`` against the untouched script, looked at after ``trials`` rounds
    and, for the arms still undecided, after up to ``rounds_max`` rounds; then the ladder of the sized
    knobs not confirmed. Returns each arm's verdict by label (a ladder's best rung replaces its first
    setting's), and the session (None when nothing ran)."""
    opts = opts or VerifyOptions()
    config = config or Config()
    if not arms:
        return {}, None
    assert run.manifest is not None
    _check_target(run.manifest, opts)
    run_dir = Path(run.source)
    d = trials_dir(run_dir, opts)
    with _verify_lock(d):
        return _measure(run, arms, config, opts, run_dir, _verify_dir(d))


def _measure(run: RunData, arms: Sequence[_Arm], config: Config, opts: VerifyOptions, run_dir: Path,
             rdir: Path) -> tuple[dict[str, Verification], _Session | None]:
    t = config.thresholds
    assert run.manifest is not None
    _say(opts, f"gpudoctor: verify: each trial runs, in {run.manifest.cwd}: {trial_command(run.manifest)}")
    session = _Session(run.manifest, run_dir, rdir, opts, max(_estimate_s(run, opts.steps), 0.1))
    baseline = session.baseline = _Arm("baseline", ())
    profiled = profiled_step_ns(run, opts.warmup_steps)
    looks = opts.max_looks
    more = f" (up to {opts.rounds_max} for a fix still undecided)" if looks > 1 else ""
    _say(opts, f"gpudoctor: verify: {len(arms)} fix(es) to try ({', '.join(a.label for a in arms)}), "
               f"{opts.trials} round(s){more} of {len(arms) + 1} runs of {opts.steps} steps, budget "
               f"{opts.budget_s:g} s; trial runs in {rdir}")
    out: dict[str, Verification] = {}
    try:
        for _ in range(opts.trials):
            if not session.round(baseline, arms, f"/{opts.trials}"):
                break
        open_arms = []
        for arm in arms:
            if not arm.runs:
                continue
            v = judge(arm, baseline, t, opts, session.interrupted, looks=1, max_looks=looks, profiled_ns=profiled)
            out[arm.label] = v
            if undecided(v) and looks > 1:
                open_arms.append(arm)
        if open_arms and not (session.interrupted or session.out_of_budget):
            _say(opts, f"gpudoctor: verify: {', '.join(a.label for a in open_arms)} undecided after "
                       f"{opts.trials} round(s): more rounds, up to {opts.rounds_max}")
            extra = 0
            while extra < opts.rounds_max - opts.trials:
                if not session.fits_round(len(open_arms)):
                    session.out_of_budget = True  # the verdict stays the first look's
                    break
                if not session.round(baseline, open_arms, " (more rounds)"):
                    break
                extra += 1
            if extra:
                for arm in open_arms:
                    out[arm.label] = judge(arm, baseline, t, opts, session.interrupted, looks=2, max_looks=looks,
                                           profiled_ns=profiled)
        if opts.ladder:
            for arm in arms:
                v = out.get(arm.label)
                if v is not None and v.status in (VerifyStatus.REFUTED, VerifyStatus.INCONCLUSIVE) and not v.errors:
                    out[arm.label] = _climb(session, arm, v, baseline, t, profiled, run.settings)
    except KeyboardInterrupt as exc:
        session.interrupted = True
        session.signum = signum_of(exc)
    for arm in arms:  # what an interruption left unjudged
        if arm.label not in out and arm.runs:
            out[arm.label] = judge(arm, baseline, t, opts, session.interrupted, looks=1, max_looks=looks,
                                   profiled_ns=profiled)
    if session.interrupted:
        _say(opts, "gpudoctor: verify: interrupted; judging what was measured")
    elif session.out_of_budget:
        _say(opts, f"gpudoctor: verify: the budget of {opts.budget_s:g} s is spent; judging what was measured")
    return out, session


# --------------------------------------------------------------------------- the ladder


def sized_knob(changes: Sequence[Injection], settings: Settings | None) -> tuple[int, Injection] | None:
    """The change the ladder climbs: a DataLoader's num_workers (first) or batch_size that the fix
    *raises* above what the profiled run's DataLoader at that call site used (a fix that lowers one,
    GD204's fewer workers, is not climbed); None when there is none or the current value is unknown."""
    loaders = settings.dataloaders if settings is not None else ()
    for key in SIZED_KNOBS:
        for i, c in enumerate(changes):
            if c.kind != "dataloader" or c.key != key or not isinstance(c.value, int) or isinstance(c.value, bool):
                continue
            now = next((getattr(d, key) for d in loaders if d.call_site == c.call_site), None)
            if isinstance(now, int) and c.value > now:
                return i, c
    return None


def ladder_values(knob: Injection, cores: int | None, thresholds: Thresholds) -> list[int]:
    """The rungs above the knob's first setting: num_workers ×2 up to ``verify_workers_per_core_ratio`` ×
    cores; batch_size ×2, ``LADDER_MAX_BATCH_RUNGS`` times at most (a run that fails stops the climb)."""
    v = int(knob.value)
    out: list[int] = []
    if knob.key == "num_workers":
        cap = max(1, int(thresholds.verify_workers_per_core_ratio * (cores or 1)))
        nxt = max(1, 2 * v)
        while nxt <= cap:
            out.append(nxt)
            nxt *= 2
    elif knob.key == "batch_size" and v > 0:
        out = [v * 2 ** k for k in range(1, LADDER_MAX_BATCH_RUNGS + 1)]
    return out


def _rung_changes(changes: Sequence[Injection], i: int, value: int) -> tuple[Injection, ...]:
    knob = changes[i]
    text = re.sub(rf"\b{re.escape(knob.key)}={knob.value!r}", f"{knob.key}={value!r}", knob.text) if knob.text else ""
    return (*changes[:i], dataclasses.replace(knob, value=value, text=text), *changes[i + 1:])


def _rung(knob: Injection, value: int, v: Verification) -> LadderRung:
    return LadderRung(knob.key, value, v.status, v.speedup, v.ci, v.confidence_pct, v.trials, v.reason)


def _climb(session: _Session, arm: _Arm, first: Verification, baseline: _Arm, t: Thresholds,
           profiled: int | None, settings: Settings | None) -> Verification:
    """Try the rungs above a sized knob's first setting (refuted or inconclusive there): ``trials``
    rounds each against baseline runs of the same rounds, while each rung is faster than the best so
    far by at least the minimum effect (``verify_min_speedup_ratio``: a setting that buys less is not
    worth its processes or memory), no run fails and the budget holds. The rungs share the error rate (Bonferroni over the rungs
    planned). Returns the best confirmed rung's verdict, with the whole ladder; else ``first``, with it."""
    opts = session.opts
    found = sized_knob(arm.changes, settings)
    if found is None:
        return first
    i, knob = found
    values = ladder_values(knob, session.manifest.cpu_count, t)
    if not values:
        return first
    from gpudoctor.analysis.stats import bonferroni_confidence_pct  # noqa: PLC0415 - scipy

    level = bonferroni_confidence_pct(opts.confidence_pct, len(values))
    rungs = [_rung(knob, int(knob.value), first)]
    best: Verification | None = None
    best_speedup = first.speedup or 0.0
    _say(opts, f"gpudoctor: verify: {arm.label} {knob.key}={knob.value} {first.status.value}; trying "
               f"{', '.join(f'{knob.key}={x}' for x in values)} while each does better ({level:g}% intervals: the "
               f"error rate shared over {_n(len(values), 'rung')})")
    for value in values:
        if session.interrupted or not session.fits_round(1):
            if not session.interrupted:
                session.out_of_budget = True
            break
        rung = _Arm(f"{arm.label}@{knob.key}={value}", _rung_changes(arm.changes, i, value), statistic=arm.statistic)
        for _ in range(opts.trials):
            if not session.round(baseline, [rung], f" ({knob.key}={value})"):
                break
        if not rung.runs:
            break
        one = dataclasses.replace(opts, confidence_pct=level)
        v = judge(rung, baseline, t, one, session.interrupted, profiled_ns=profiled)
        rungs.append(_rung(knob, value, v))
        if v.errors or any(not r.ok for r in rung.runs):
            break  # out of memory, or the script refuses it: the rungs above would fail too
        better = v.speedup is not None and v.speedup >= best_speedup * t.verify_min_speedup_ratio
        if v.status == VerifyStatus.CONFIRMED and (best is None or better):
            best = v
        if not better:
            break  # not better than the best below it by the minimum effect: more of the knob buys nothing
        best_speedup = v.speedup
    ladder = tuple(rungs)
    table = "; ".join(
        f"{r.knob}={r.value} {r.status.value} {_x(r.speedup)}"
        + (f" [{_x(r.ci[0])}–{_x(r.ci[1])}]" if r.ci else "") for r in ladder
    )
    if best is None:
        return dataclasses.replace(first, ladder=ladder,
                                   reason=f"{first.reason}; the ladder confirmed no setting ({table})")
    value = next(c.value for c in best.changes if c.kind == "dataloader" and c.key == knob.key)
    name = f"{knob.key}={value}"
    ci = f"{best.confidence_pct:g}% CI {_x(best.ci[0])}–{_x(best.ci[1])}" if best.ci else "no interval"
    return dataclasses.replace(
        best, ladder=ladder, measured_best=name,
        reason=(f"measured best: {name}, {_x(best.speedup)} faster ({ci}); {knob.key}={knob.value} first was "
                f"{first.status.value} ({_x(first.speedup)}); ladder: {table}. {name}: {best.reason}"),
    )


# --------------------------------------------------------------------------- entry points


def verify_report(report: Report, config: Config | None = None, opts: VerifyOptions | None = None) -> VerifyResult:
    """Run the trials for ``report``'s findings (its ``run`` must be a run directory of
    ``gpudoctor profile``) and return the report with every finding's ``verification``."""
    opts = opts or VerifyOptions()
    opts.check()
    config = config or Config()
    arms, not_tried = plan(report, config)
    verifications: dict[int, Verification] = {
        i: Verification(VerifyStatus.NOT_TRIED, why) for i, why in not_tried.items()
    }
    if not arms:
        nothing = nothing_to_try(report, not_tried)
        _say(opts, f"gpudoctor: verify: {nothing}")
        return VerifyResult(_attach(report, verifications, nothing), False, 0.0, 0)
    assert report.run is not None
    t0 = time.monotonic()
    judged, session = measure(report.run, arms, config, opts)
    interrupted = session is not None and session.interrupted
    for arm in arms:
        v = judged.get(arm.label)
        if v is None:
            why = (
                "interrupted (Ctrl-C) before its trial runs" if interrupted
                else f"the --verify-budget of {opts.budget_s:g} s ran out before its trial runs"
            )
            v = Verification(VerifyStatus.NOT_TRIED, why, changes=arm.changes, steps=opts.steps)
        for i in arm.findings:
            verifications[i] = v
    started = session.started if session is not None else 0
    signum = (session.signum or int(signal.SIGINT)) if interrupted and session is not None else None
    return VerifyResult(_attach(report, verifications), interrupted, time.monotonic() - t0, started, signum)


def nothing_to_try(report: Report, not_tried: dict[int, str]) -> str:
    """One line: verify had nothing to try, and why (each finding's code with its reason)."""
    if not report.findings:
        return "nothing to try: no findings"
    reasons: dict[str, list[str]] = {}
    for i, why in sorted(not_tried.items()):
        reasons.setdefault(why, []).append(report.findings[i].code)
    parts = [f"{', '.join(dict.fromkeys(codes))}: {why}" for why, codes in reasons.items()]
    return "nothing to try: no finding has a fix gpudoctor can apply without editing the script (" + "; ".join(parts) + ")"


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
        if not (path / layout.MANIFEST).is_file():
            raise UsageError(f"{path}: not a run directory of `gpudoctor profile` (no manifest.json); verify needs one")
        loaded = load_inputs([path])
        metrics = tuple(analyze_trace(t, loaded.run) for t in loaded.timelines)
        report = diagnose(dataclasses.replace(loaded.run, metrics=metrics), config, kind="analyze")
    return verify_report(report, config, opts)


def _rel(run_dir: Path, path: Path) -> str:
    """A trial run's folder as ``Verification.runs`` names it: relative to the run directory when inside
    it (``verify/GD201/1``), else absolute (``--out`` elsewhere)."""
    try:
        return str(path.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return str(path.resolve())


def trial_command(m: Manifest) -> str:
    """The command each trial runs, as a shell would show it (the script and its arguments as recorded)."""
    import shlex  # noqa: PLC0415

    head = ["python", "-m", m.module] if m.module else ["python"]
    return " ".join(shlex.quote(a) for a in (*head, *(m.argv[1:] if m.module else m.argv)))


def _check_target(m: Manifest, opts: VerifyOptions | None = None) -> None:
    """What a run directory's manifest names is untrusted: the script (or module) and its folder must
    still be there, the script inside the recorded working directory (``--yes`` overrides), and the
    same bytes as when it was profiled (``--allow-changed`` overrides)."""
    opts = opts or VerifyOptions()
    if not Path(m.cwd).is_dir():
        raise UsageError(f"the run's working directory {m.cwd} no longer exists: trials run the script from there")
    if m.module is None:
        script = m.script or ""
        if not Path(script).is_file():
            raise UsageError(f"{script or 'the script'}: no such file any more; trials run the script the run recorded")
        cwd = Path(m.cwd).resolve()
        where = Path(script).resolve()
        if not opts.allow_outside and cwd not in where.parents:
            raise UsageError(f"the run names a script outside its working directory ({safe_line(script)}, not under "
                             f"{safe_line(m.cwd)}): verify would run it; check the run directory and pass --yes to "
                             "run it anyway")
        if m.script_sha256 and not opts.allow_changed:
            from gpudoctor.collect.runner import file_sha256  # noqa: PLC0415

            if file_sha256(script) != m.script_sha256:
                raise UsageError(f"{safe_line(script)} changed since it was profiled: the trials would not measure "
                                 "the profiled script; profile it again, or pass --allow-changed to verify it as "
                                 "it is now")


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
        data = json.loads((Path(run_dir) / layout.REPORT).read_text(encoding="utf-8"))
        previous = Report.from_dict(data)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return previous if any(f.verification is not None for f in previous.findings) else None


def _attach(report: Report, verifications: dict[int, Verification], nothing: str = "") -> Report:
    """The findings with their verification (a fix the ladder measured names the best setting), and
    a headline of the outcomes; ``nothing``: why verify had nothing to try, said instead."""
    findings = tuple(
        with_verification(f, verifications.get(i, f.verification)) for i, f in enumerate(report.findings)
    )
    counts = {s: sum(1 for f in findings if f.verification is not None and f.verification.status == s) for s in VerifyStatus}
    text = nothing or ", ".join(f"{n} {s.value.replace('_', ' ')}" for s, n in counts.items())
    summary = tuple(s for s in report.summary if s.key != "verified") + (
        SummaryStat("verified", "verified fixes", text),
    )
    from gpudoctor.engine import sort_key  # noqa: PLC0415 - the engine's imports, only once something was verified
    from gpudoctor.rules.account import with_verifications  # noqa: PLC0415

    # the verdicts change the advice: a confirmed fix ranks by what it measured, a refuted one drops
    # out of the top actions into "tried, did not help"
    findings = tuple(sorted(findings, key=sort_key))
    return dataclasses.replace(report, findings=findings, summary=summary,
                               account=with_verifications(report.account, findings))


MEASURED = "Measured by --verify:"  # the sentence a ladder's best setting adds to a fix's instruction


def with_verification(f: Finding, v: Verification | None) -> Finding:
    """``f`` with ``v``; when the ladder confirmed a setting other than the fix's first one, the fix's
    instruction and its after-snippet name the measured value, and say how it was measured."""
    f = dataclasses.replace(f, verification=v)
    if v is None or v.status != VerifyStatus.CONFIRMED or not v.measured_best or not v.ladder:
        return f
    first, best = v.ladder[0], v.measured_best
    if MEASURED in f.fix.instruction:
        return f
    old = re.compile(rf"\b{re.escape(first.knob)}=\s*{first.value}\b")
    ci = f" ({v.confidence_pct:g}% CI {_x(v.ci[0])}–{_x(v.ci[1])})" if v.ci else ""
    instruction = old.sub(best, f.fix.instruction).rstrip()
    instruction += (f" {MEASURED} {best} is the best setting tried, {_x(v.speedup)} faster{ci}; "
                    f"{first.knob}={first.value} gave {_x(first.speedup)} ({first.status.value}).")
    fix = dataclasses.replace(f.fix, instruction=instruction, after=old.sub(best, f.fix.after))
    return dataclasses.replace(f, fix=fix)


def progress_to_stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
