"""The plan of a verify: its options, its result, and the fix arms a report's findings give."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.config import Config
from gpudoctor.errors import UsageError
from gpudoctor.model import (
    HostLoad,
    Injection,
    Report,
    Settings,
    StepRecord,
    layout,
)

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
    yes: bool = False  # run the trials of a run that is not trusted (gpudoctor.trust), without asking (--yes)
    # asked, with what the trials would run, when the run is not trusted and not ``yes`` (the CLI, at a
    # terminal: a typed yes); True runs them. None: refused with a UsageError that says to pass --yes
    confirm: Callable[[str], bool] | None = None

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
    from gpudoctor.engine import loader_source_of  # noqa: PLC0415 - the script's source, as the report read it

    ctx = RuleContext(run, thresholds, loader_source=loader_source_of(run))
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




def _say(opts: VerifyOptions, line: str) -> None:
    if opts.progress is not None:
        opts.progress(line)



def _changes_text(changes: Sequence[Injection]) -> str:
    return "; ".join(c.text or f"{c.key}={c.value!r}" for c in changes)
