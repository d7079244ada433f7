"""One quantity, one value: a name a reader sees in several places (the Summary, a finding's
message, the checklist, the stderr line of ``gpudoctor profile``) carries one value in every
format (terminal, Markdown, HTML, JSON, SARIF).

The runs are recorded-run shaped (steps.jsonl rows with epochs, markers and phase times, psutil
samples before and during the loop, settings with a 4-worker DataLoader, a trace's step
windows): the shapes that gave one name two values before (a step median with and without the
workers' first batches, a CPU median over the run and over the steps, the DataLoader's part of
the trace's typical step printed next to the data wait of every step).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from one_value import conflicts, texts, values_by_quantity

for _dir in ("rules", "collect"):
    _path = str(Path(__file__).resolve().parents[1] / _dir)
    if _path not in sys.path:
        sys.path.insert(0, _path)

from collect_testlib import FAST_SCHEDULE, copy_script, only_run_dir, run_profile  # noqa: E402
from rule_builders import (  # noqa: E402
    MS,
    Samples,
    cpu_manifest,
    cpu_trace,
    dataloader,
    manifest,
    run,
    settings,
    trace,
    utilization,
)

from gpudoctor.collect.summary import StepSummary, summarize_steps, summary_lines  # noqa: E402
from gpudoctor.config import Config  # noqa: E402
from gpudoctor.engine import diagnose  # noqa: E402
from gpudoctor.model import DispatchStats, GapCause, ProcessSample, StepRecord, WindowKind  # noqa: E402

START_NS = 20_000 * MS  # the loop starts 20 s into the run (imports, a dataset scan at one full core)


def _steps(epochs: int = 2, per_epoch: int = 30, workers: int = 4) -> tuple[StepRecord, ...]:
    """Optimizer steps of a loop over a DataLoader with ``workers`` workers (not persistent): the
    steps that receive each epoch's first ``workers`` batches wait for their worker to start."""
    out = []
    t = START_NS
    for e in range(epochs):
        for k in range(per_epoch):
            i = e * per_epoch + k
            wait = (900 + 150 * k) * MS if k < workers else (20 + (i * 7) % 11) * MS
            wall = wait + (80 + (i * 13) % 17) * MS
            out.append(StepRecord(
                index=i, start_ns=t, wall_ns=wall, data_wait_ns=wait, epoch=e, marker="optimizer",
                forward_ns=30 * MS, backward_ns=40 * MS, optimizer_ns=5 * MS, micro_batches=1, batches=1,
            ))
            t += wall
    return tuple(out)


def _cpu_samples(steps: tuple[StepRecord, ...]) -> tuple[ProcessSample, ...]:
    """100% of one core while the script starts (before the first step), 35% while the loop waits on its workers."""
    end = steps[-1].start_ns + steps[-1].wall_ns
    return tuple(
        ProcessSample(t, 100, "main", 100.0 if t < START_NS else 35.0, 10**9, 8)
        for t in range(0, end, 100 * MS)
    )


def _cpu_run():
    steps = _steps()
    w = cpu_trace().windows[0]
    dispatch = DispatchStats(
        window=WindowKind.STEPS, steps=5, ops_per_step=400, top_level_ops_per_step=200, op_self_median_ns=50_000,
        op_ns=70 * MS, short_op_ns=2 * MS, short_op_time_pct=2.9, glue_ns=1 * MS, long_gap_ns=4 * MS,
        dataloader_ns=12 * MS, typical_step_ns=87 * MS, dispatch_ns=3 * MS, dispatch_pct=3.4, step_median_ns=101 * MS,
    )
    return run(
        manifest=cpu_manifest(step_source="optimizer", steps_seen=len(steps), cpu_count=2),
        settings=settings(device_type="cpu", num_threads=2, cpu_count=2,
                          dataloaders=(dataloader(num_workers=4, prefetch_factor=2, iterations_started=2),)),
        steps=steps,
        metrics=(cpu_trace(windows=(w,), dispatch=dispatch),),
        samples=Samples(process=_cpu_samples(steps), interval_ms=100.0),
    )


def _gpu_run():
    steps = _steps()
    m = trace(utilization=(utilization(40.0, causes={GapCause.DATALOADER: 0.7, GapCause.OTHER: 0.3}),))
    return run(
        manifest=manifest(step_source="optimizer", steps_seen=len(steps)),
        settings=settings(dataloaders=(dataloader(num_workers=4, prefetch_factor=2, iterations_started=2),)),
        steps=steps,
        metrics=(m,),
        samples=Samples(process=_cpu_samples(steps), interval_ms=100.0),
    )


def _stderr_line(data) -> str:
    """What `gpudoctor profile` prints on stderr at the end of this run."""
    rows = [s.to_dict() for s in data.steps]
    s = summarize_steps(rows, data.manifest.step_source, data.settings.dataloaders[0])
    return "\n".join(summary_lines(s, data.manifest.step_source, "completed", "", 0, "gpudoctor-runs/x", []))


@pytest.mark.parametrize("build", [_cpu_run, _gpu_run], ids=["cpu", "gpu"])
def test_every_format_prints_one_value_per_quantity(build):
    data = build()
    report = diagnose(data, Config(), kind="profile")
    named = texts(report)
    named["stderr"] = _stderr_line(data)
    found = values_by_quantity(named)
    # the test looks where it should: each of these is printed in every format and on stderr
    for quantity in ("step time (now)", "step time, median", "step time, p90", "waiting for data (every steady step)"):
        where = {w for w, _, _ in found.get(quantity, [])}
        assert where >= {"terminal", "md", "html", "json", "stderr"}, (quantity, where)
    assert {w for w, _, _ in found["training process CPU"]} >= {"terminal", "md", "html", "json"}
    assert conflicts(named) == []


def test_the_figures_are_those_of_the_steady_steps_and_the_loop():
    data = _cpu_run()
    report = diagnose(data, Config(), kind="profile")
    s = {x.key: x for x in report.summary}
    # each epoch's first 4 steps wait for a worker to start: neither the summary nor stderr counts them
    assert s["step_time_median"].window == "52 steady steps"
    assert s["step_time"].window == "52 steady steps"
    # the step time is the mean (total ÷ count) of those steps, to the whole µs
    kept = [x for x in data.steps if x.index % 30 >= 4]
    assert len(kept) == 52
    assert s["step_time"].value == round(sum(x.wall_ns for x in kept) / len(kept) / 1000) / 1000
    line = _stderr_line(data)
    assert f"step time {s['step_time'].value:.1f} ms (mean), median {s['step_time_median'].value:.1f} ms" in line
    # the process's CPU while the loop ran (35%), not the start-up's 100% over the run
    assert s["main_cpu"].value == 35.0 and "while the steps ran" in s["main_cpu"].window
    gd203 = next(i for i in report.checklist if "GD203" in i.codes)
    assert "35.0% of one core" in gd203.reason


def test_the_trace_s_typical_step_is_not_named_as_the_data_wait():
    report = diagnose(_cpu_run(), Config(), kind="profile")
    gd103 = next(i for i in report.checklist if "GD103" in i.codes and "GD103:" in i.reason)
    assert "DataLoader ranges 13.8%" in gd103.reason and "typical profiled step" in gd103.reason
    assert "the DataLoader 13.8%" not in gd103.reason


def test_a_conflict_is_found():
    """The checker itself: two values of one name are reported, a rounding of one value is not."""
    assert conflicts({"a": "step time: 3.30 s", "b": "now 3.37 s per step (mean of 62 unprofiled steady steps)"})
    assert conflicts({"a": "step time  3.30 s", "b": "65.5 ms of a 3.37 s step, means over 62 steps"})
    assert conflicts({"a": "training process CPU (median) 99.8%", "b": "training process at 35% of one core"})
    assert not conflicts({"a": "step time: 111.3 ms", "b": "of a 111.30 ms step, means over 5 steps"})
    # the median is the spread, under its own name: not a second value of the step
    assert not conflicts({"a": "step time: 111.3 ms", "b": "step time, median (spread): 105.0 ms"})
    assert not conflicts({"a": "training process CPU (median) 117.5%", "b": "training process at 118% of one core"})


def test_before_the_fix_the_stderr_line_disagreed():
    """The workers' first batches: the stderr line left them in before (3 values of one name)."""
    data = _cpu_run()
    rows = [s.to_dict() for s in data.steps]
    with_workers = summarize_steps(rows, "optimizer", data.settings.dataloaders[0])
    without = summarize_steps(rows, "optimizer", None)
    assert with_workers.p90_ms != without.p90_ms  # the loader's workers change the steady steps
    report = diagnose(dataclasses.replace(data), Config(), kind="profile")
    p90 = next(x for x in report.summary if x.key == "step_time_p90").value
    assert with_workers.p90_ms == p90


@pytest.mark.slow
def test_a_profiled_run_prints_one_value_per_quantity(tmp_path):
    """A real run under `gpudoctor profile` (2 DataLoader workers, 3 epochs): its stderr line and its
    report in every format."""
    from gpudoctor.cli import load_and_analyze

    copy_script("train_small.py", tmp_path)
    proc = run_profile("--out", "runs", *FAST_SCHEDULE, "train_small.py", "--", "--workers", "2", "--epochs", "3",
                       "--sleep", "0.002", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = diagnose(load_and_analyze([str(only_run_dir(tmp_path / "runs"))]), Config(), kind="profile")
    named = texts(report)
    named["stderr"] = proc.stderr
    found = values_by_quantity(named)
    for quantity in ("step time (now)", "step time, p90", "waiting for data (every steady step)", "steps recorded"):
        assert {w for w, _, _ in found.get(quantity, [])} >= {"terminal", "md", "html", "json", "stderr"}, quantity
    assert "training process CPU" in found
    assert conflicts(named) == []


def test_a_share_is_rounded_once_so_every_place_shows_the_same_digit():
    # 37.748%: a metric keeps 37.75 (rules round shares to 2 decimals) and prints 37.8; the summary
    # and the stderr line must print the same, not 37.7 from the unrounded value (a flake CI saw)
    from gpudoctor.engine import _stat
    from gpudoctor.model.findings import Metric
    from gpudoctor.report._fmt import metric_text

    stat = _stat("data_wait_share", "waiting for data", 37.748, "%")
    assert stat.value == 37.75
    shown = metric_text(Metric("data_wait_share_pct", round(37.748, 2), "%"))
    assert "37.8" in shown
    line = summary_lines(StepSummary(10, 21.0, 20.0, 25.0, 37.748), "optimizer", "ok", "", 0, "runs/x", [])[0]
    assert "waiting for data 37.8% of step time" in line
