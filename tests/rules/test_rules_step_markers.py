"""Rules that follow the step marker and read the steps' phase times (issue 12): GD701 on a
root-module-marked run, GD201 with gradient accumulation, GD203 / GD103 splitting the loop's
own work from the model's calls, steady steps of the final marker, and the report summary."""

from __future__ import annotations

import dataclasses

from rule_builders import (
    MS,
    cpu_manifest,
    cpu_trace,
    judge,
    proc_samples,
    run,
    settings,
    steps,
    trace,
)

from gpudoctor.config import Thresholds
from gpudoctor.engine import build_summary
from gpudoctor.model import RootModuleUse, Samples, StepRecord
from gpudoctor.model.metrics import DispatchStats, WindowKind
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.results import Verdict


def _phased(n: int = 20, wall_ms: float = 100.0, *, wait_ms: float = 0.0, fwd_ms: float = 0.0, bwd_ms: float = 0.0,
            opt_ms: float = 0.0, marker: str = "optimizer", micro: int = 1, start_index: int = 0) -> tuple[StepRecord, ...]:
    base = steps(n, wall_ms, wait_ms)
    return tuple(
        dataclasses.replace(s, index=s.index + start_index, marker=marker, forward_ns=int(fwd_ms * MS),
                            backward_ns=int(bwd_ms * MS), optimizer_ns=int(opt_ms * MS), micro_batches=micro,
                            batches=micro)
        for s in base
    )


# ---------------------------------------------------------------- GD701


def _eval_run(calls: int, with_grad: int, **kw):
    mf = cpu_manifest(step_source="module", root_module=RootModuleUse("Classifier", calls, with_grad))
    return run(manifest=mf, settings=settings(device_type="cpu", optimizers=()),
               steps=_phased(marker="module", fwd_ms=80.0, micro=0), **kw)


def test_gd701_judges_a_root_module_marked_run_without_a_trace():
    (f,) = judge("GD701", _eval_run(240, 240)).findings
    assert "240 of 240 calls of Classifier" in f.message and "root module (Classifier)" in f.message
    assert f.confidence.value == "measured"


def test_gd701_root_outputs_without_graph_are_fine_whatever_the_trace_says():
    """Parameters frozen with requires_grad_(False): grad mode on (sequence numbers in the trace), no graph."""
    res = judge("GD701", _eval_run(240, 0, metrics=(cpu_trace(autograd_forward_ops=500, backward_ops=0, optimizer_steps=0),)))
    assert res.verdict == Verdict.FINE and "none of the 240 calls" in res.reason


def test_gd701_manual_updates_train():
    mf = cpu_manifest(step_source="backward", root_module=RootModuleUse("RNNModel", 80, 80))
    res = judge("GD701", run(manifest=mf, settings=settings(device_type="cpu", optimizers=())))
    assert res.verdict == Verdict.NOT_APPLICABLE and "loss.backward()" in res.reason


def test_gd701_a_run_without_step_structure_evaluates_no_model():
    m = cpu_trace(autograd_forward_ops=20_000, backward_ops=0, optimizer_steps=0)  # bare tensor ops in grad mode
    res = judge("GD701", run(manifest=cpu_manifest(step_source="time", steps_seen=0), metrics=(m,)))
    assert res.verdict == Verdict.NOT_APPLICABLE


# ---------------------------------------------------------------- GD201 with gradient accumulation


def test_gd201_judges_an_optimizer_step_of_micro_batches():
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu", cpu_count=2),
               steps=_phased(wall_ms=100.0, wait_ms=48.0, fwd_ms=10.0, bwd_ms=30.0, opt_ms=4.0, micro=4))
    (f,) = judge("GD201", data).findings
    assert round(f.gain.share_pct) == 48  # the wait of all four micro-batches, against the whole step
    assert "optimizer step over its 4 micro-batches, 12.00 ms per batch" in f.message
    metrics = {m.name: m.value for m in f.evidence.metrics}
    assert metrics["micro_batches_per_step"] == 4 and metrics["data_wait_per_batch_ns"] == 12 * MS
    # per batch: 12 ms load against 13 ms compute (+1 ms hand-over): one worker keeps up (and a load whose CPU
    # was not measured is capped at the 2 cores less one anyway)
    assert "12.00 ms per batch ÷ (13.00 ms warm compute + 1.00 ms hand-over) → 1" in f.fix.instruction
    assert metrics["suggested_num_workers"] == 1


# ---------------------------------------------------------------- GD203 and GD103 read the phases


def _cpu_busy_run(fwd_ms: float, bwd_ms: float, opt_ms: float, **kw):
    return run(manifest=cpu_manifest(), settings=settings(device_type="cpu", num_threads=2, cpu_count=2),
               steps=_phased(fwd_ms=fwd_ms, bwd_ms=bwd_ms, opt_ms=opt_ms),
               samples=Samples(process=proc_samples(100.0, runq_wait_pct=0.0)), **kw)


def test_gd203_measures_the_loop_own_work_from_the_phases():
    (f,) = judge("GD203", _cpu_busy_run(10.0, 15.0, 5.0)).findings  # 70 ms of 100 outside the model's calls
    assert round(f.gain.share_pct) == 70 and f.confidence.value == "measured"
    assert "70.0% of step time is the loop's own work" in f.message


def test_gd203_leaves_a_process_busy_inside_the_model_to_gd103():
    res = judge("GD203", _cpu_busy_run(40.0, 45.0, 5.0))  # 10% of the step outside the model's calls
    assert res.verdict == Verdict.FINE and "inside the model's calls" in res.reason and "GD103" in res.reason


def test_gd203_a_few_steps_stalled_for_a_core_do_not_hide_the_loop_own_work():
    """Beside another busy process, a few steps of a loop that tokenizes on one thread stretched 40×
    in the model's two-threaded ops (each op's barrier waited for a core): 8% of all steps' time is
    the loop's own work, 70% of the median step. The typical step says where the work is."""
    quick = _phased(16, wall_ms=24.0, fwd_ms=4.0, bwd_ms=3.0)
    stalled = _phased(4, wall_ms=1000.0, fwd_ms=300.0, bwd_ms=680.0, start_index=16)
    stalled = tuple(dataclasses.replace(s, start_ns=s.start_ns + 16 * 24 * MS) for s in stalled)
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu", num_threads=2, cpu_count=2),
               steps=quick + stalled, samples=Samples(process=proc_samples(100.0, runq_wait_pct=0.0)))
    assert RuleContext(data, Thresholds()).phase_shares_pct()["other"] < 10.0
    (f,) = judge("GD203", data).findings
    metrics = {m.name: m.value for m in f.evidence.metrics}
    assert metrics["loop_other_typical_pct"] == 70.8
    assert any("70.8% of the median step" in n for n in f.evidence.notes)


def _dispatch_trace() -> object:
    d = DispatchStats(window=WindowKind.STEPS, steps=5, ops_per_step=900.0, op_ns=40 * MS, short_op_ns=30 * MS,
                      short_op_time_pct=75.0, glue_ns=60 * MS, typical_step_ns=100 * MS, dispatch_ns=90 * MS,
                      dispatch_pct=90.0, step_median_ns=100 * MS)
    return cpu_trace(dispatch=d)


def test_gd103_stays_quiet_when_the_model_calls_are_a_small_share():
    res = judge("GD103", _cpu_busy_run(5.0, 8.0, 2.0, metrics=(_dispatch_trace(),)))
    assert res.verdict == Verdict.FINE and "the model's calls take 15.0% of step time" in res.reason


def test_gd103_adds_the_phase_split_to_its_evidence():
    """A loop without a DataLoader (batches sliced from tensors): the dispatch figures fire, the
    phases (90% of the step inside the model's calls) let them and annotate the finding."""
    data = _cpu_busy_run(40.0, 45.0, 5.0, metrics=(_dispatch_trace(),))
    data = dataclasses.replace(data, settings=settings(device_type="cpu", num_threads=2, cpu_count=2, dataloaders=()))
    (f,) = judge("GD103", data).findings
    assert any(m.name == "model_calls_share_pct" and m.value == 90.0 for m in f.evidence.metrics)
    assert any("the model's calls take 90.0% of step time" in n for n in f.evidence.notes)


def test_phase_shares_without_a_watched_forward():
    s = tuple(dataclasses.replace(r, forward_ns=None) for r in _phased(fwd_ms=30.0, bwd_ms=20.0))
    ctx = RuleContext(run(steps=s), Thresholds())
    shares = ctx.phase_shares_pct()
    assert shares is not None and shares["forward"] is None and round(shares["other"]) == 80


# ---------------------------------------------------------------- the final marker's steps, the summary


def test_steady_steps_are_those_of_the_final_marker():
    evaluation = _phased(10, 5.0, marker="module", fwd_ms=4.0, micro=0)
    training = _phased(10, 100.0, fwd_ms=20.0, bwd_ms=40.0, opt_ms=5.0, start_index=10)
    ctx = RuleContext(run(manifest=cpu_manifest(step_source="optimizer"), steps=evaluation + training), Thresholds())
    assert {s.marker for s in ctx.steady_steps()} == {"optimizer"} and len(ctx.steady_steps()) == 9
    assert ctx.figures.job.step_ns == 100 * MS and len(ctx.figures.job.account) == 9  # the evaluation pass left out


def test_every_report_says_what_marked_the_steps():
    mf = cpu_manifest(step_source="backward",
                      step_source_reason="loss.backward() ends each step (parameters updated without an optimizer "
                                         "step); no optimizer object")
    data = run(manifest=mf, steps=_phased(marker="backward", fwd_ms=20.0, bwd_ms=30.0))
    summary = {s.key: s for s in build_summary(RuleContext(data, Thresholds()), [])}
    assert summary["step_marker"].label == "steps marked by"
    assert summary["step_marker"].value.startswith("loss.backward() ends each step")
    # no trace: the hooks' phase times stand in for the step breakdown
    assert round(summary["phase_backward"].value) == 30 and round(summary["phase_other"].value) == 50
    timed = run(manifest=cpu_manifest(step_source="time", steps_seen=0,
                                      step_source_reason="no optimizer step, backward(), root-module call or "
                                                         "DataLoader batch was seen: the script was recorded from "
                                                         "second 5 to 10 instead"),
                metrics=(trace(),))
    summary = {s.key: s for s in build_summary(RuleContext(timed, Thresholds()), [])}
    assert "recorded from second 5 to 10" in summary["step_marker"].value
