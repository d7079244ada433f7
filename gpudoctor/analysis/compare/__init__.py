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

Noise. Steps vary; a single median hides how much. The judgement is one decision on one
statistic, the speed-up (the ratio of the medians A / B): its bootstrap confidence interval
(``resamples`` resamples with a fixed seed, so the output is deterministic; a run of more
than ``BOOTSTRAP_MAX_STEPS`` steps is resampled from that many spread over it) decides, and
the p-value printed beside it is the bootstrap test of "no change" from the same resamples
(``analysis.stats.interval_and_p``, on ``scipy.stats.bootstrap``), so the two cannot
disagree: the interval excludes 1× exactly when p < 1 − confidence. (A Mann–Whitney test of
the steps, which this verdict once also required, tests another thing and disagreed with the
interval on bimodal steps: "Within noise: 0.46×, 95% CI 0.42×–2.17×, p = 0.020".) B is
faster (or slower) only when the interval excludes 1 and the change is at least
``min_change_pct``: two runs of one unchanged script on one machine commonly differ by a
percent or two in median step time (clock boost, placement, page cache), which nothing on
the steps of a single pair of runs can see. Fewer than ``min_steps`` steps on a side: too
few to tell. Steps of one run are not independent draws (a slow phase lasts several steps),
so the interval is optimistic; the margin is the guard.

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

import shlex
from datetime import datetime

from gpudoctor import __version__
from gpudoctor.analysis.compare.figures import breakdown_change, headline_metrics
from gpudoctor.analysis.compare.findings import finding_changes, rank_list, run_ranks
from gpudoctor.analysis.compare.settings import setting_changes
from gpudoctor.analysis.compare.steps import MIN_STEPS, step_basis, step_change
from gpudoctor.analysis.stats import CONFIDENCE_PCT, RESAMPLES, bootstrap_speedup_ci, mann_whitney_p
from gpudoctor.model.compare import COMPARISON_SCHEMA_VERSION, Comparison, RunSide, StepTimeChange
from gpudoctor.model.findings import Report, RunData
from gpudoctor.model.run import status_text
from gpudoctor.model.selectors import main_dataloader

__all__ = [
    "compare_runs",
    "mann_whitney_p",
    "bootstrap_speedup_ci",
]


MIN_CHANGE_PCT = 2.0  # margin for the run-to-run variation of two runs of one unchanged script (gpudoctor's choice)


# --------------------------------------------------------------------------- the runs


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
    status = mf.status_text
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
                    f"run {side} did not finish ({status_text(mf.status.value, mf.status_detail, ': {}')}): its "
                    "figures cover the steps before it ended"
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
    loader_a, loader_b = main_dataloader(run_a.settings), main_dataloader(run_b.settings)
    basis = step_basis(run_a, run_b, min_steps)
    step = step_change(
        basis,
        loader_a.batch_size if loader_a is not None else None,
        loader_b.batch_size if loader_b is not None else None,
        min_steps=min_steps,
        min_change_pct=min_change_pct,
        confidence_pct=confidence_pct,
        resamples=resamples,
    )
    metrics = headline_metrics(basis, step, run_a, run_b)
    breakdown, breakdown_note = breakdown_change(run_a, run_b)
    extra_notes: list[str] = []
    if report_a is not None and report_b is not None:
        ranks_a, ranks_b = run_ranks(run_a), run_ranks(run_b)
        per_rank = len(ranks_a) > 1 and ranks_a == ranks_b
        findings, summary = finding_changes(report_a, report_b, per_rank)
        compared = True
        if not per_rank and (ranks_a or ranks_b) and ranks_a != ranks_b:
            extra_notes.append(
                f"findings are matched by rule code across ranks: A has rank(s) {rank_list(ranks_a)}, "
                f"B rank(s) {rank_list(ranks_b)}"
            )
    else:
        findings, summary, compared = (), "not compared: a side was not diagnosed", False
    if run_a.settings is not None and run_b.settings is not None:
        settings = tuple(setting_changes(run_a.settings, run_b.settings))
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
