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
it (its length estimated from the runs so far: each arm's own longest run, the profiled
run's estimate before any), nor a round once the budget cannot hold the whole of it (a
baseline run alone judges nothing); a run still going when the budget ends is stopped;
Ctrl-C stops the trials and what was measured so far is judged. When the budget held fewer
rounds than ``--verify-trials`` asked, the verdict and the line on stderr say how many, and
the budget that would hold them (never "give --verify-trials N" to one who gave N). The
script's side effects (files it writes, network, checkpoints) are the user's: each
trial is a real run of it. With nothing to try, one line on stderr and the report's
"verified" summary say so.

The package, by concern: ``plan`` (options, result, the fix arms), ``trials`` (the trial runs and
the rounds), ``judging`` (each run's figure, the load, the verdict), ``ladder`` (a sized knob's
next rungs), ``results`` (the entry points, and the verifications on the report); what is imported
from ``gpudoctor.verify`` is re-exported here.
"""

from __future__ import annotations

from gpudoctor.verify.judging import (  # noqa: F401
    FASTER,
    NO_GAIN,
    SLOWER,
    STRADDLE,
    _batch,
    _cores,
    _epoch_start_ids,
    _figures,
    _ms,
    _ms_list,
    _n,
    _not_applied,
    _pct,
    _per_run,
    _steady,
    _x,
    decide,
    judge,
    load_text,
    load_unfair,
    mean_load,
    profiled_step_ns,
    undecided,
)
from gpudoctor.verify.ladder import (  # noqa: F401
    _climb,
    _rung,
    _rung_changes,
    ladder_values,
    sized_knob,
)
from gpudoctor.verify.plan import (  # noqa: F401
    CONFIDENCE_PCT,
    DEFAULT_BUDGET_S,
    DEFAULT_STEPS,
    DEFAULT_TRIALS,
    DEFAULT_WARMUP_STEPS,
    INTERNAL_CODE,
    LADDER_MAX_BATCH_RUNGS,
    MARKER,
    MIN_RUNS,
    MIN_STEPS,
    SAMPLE_INTERVAL_MS,
    SIZED_KNOBS,
    STATISTICS,
    VerifyOptions,
    VerifyResult,
    _Arm,
    _changes_text,
    _key,
    _Run,
    _say,
    plan,
)
from gpudoctor.verify.results import (  # noqa: F401
    MEASURED,
    _attach,
    carry_over,
    nothing_to_try,
    progress_to_stderr,
    read_previous,
    verify_report,
    verify_run,
    with_verification,
)
from gpudoctor.verify.trials import (  # noqa: F401
    _check_target,
    _estimate_s,
    _measure,
    _rel,
    _Session,
    _trial,
    _verify_dir,
    _verify_lock,
    measure,
    trial_command,
    trials_dir,
    trust_decision,
)
