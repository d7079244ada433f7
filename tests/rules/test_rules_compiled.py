"""Compiled and graphed execution in the rules: GD103's advice fits the code (eager → torch.compile,
compiled → CUDA graphs or a larger batch, never torch.compile again), GD105 judges the run's
recompilations, the summary names what runs compiled, and the steady steps leave compilation out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rule_builders import (
    MS,
    SITE,
    GapCause,
    WrapSetting,
    cpu_manifest,
    cpu_trace,
    dataloader,
    judge,
    kernels,
    manifest,
    run,
    settings,
    steps,
    trace,
    utilization,
)

from gpudoctor.config import Config
from gpudoctor.engine import diagnose
from gpudoctor.model import (
    CompiledStats,
    CompileEvent,
    CompileState,
    DispatchStats,
    RunData,
    Severity,
    WindowKind,
)
from gpudoctor.model.steady import compile_steps
from gpudoctor.rules.compilation import code_kind, compilations, compiled_summary
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.results import Verdict

COMPILE = WrapSetting("torch.compile", SITE, "Net", {"mode": None, "backend": "inductor", "dynamic": None})


def _stats(**kw) -> CompiledStats:
    base = dict(window=WindowKind.STEPS, windows=5, kernels=1000, kernel_ns=40 * MS, triton_kernels=600,
                triton_ns=25 * MS, triton_pct=62.5, launches=1000, region_calls=5, regions=("0/0",),
                compiled_function_calls=5, compiled_backward_calls=5, graph_calls=10, region_launches=900)
    base.update(kw)
    return CompiledStats(**base)


def _launch_bound(**kw):
    """A GPU trace 40% idle in launch gaps, most kernels under 10 µs: GD103 fires."""
    return trace(utilization=(utilization(40.0, causes={GapCause.LAUNCH_BOUND: 1.0}),),
                 kernels=kernels(under_10us_pct=80.0, p50_ns=4_000, launch_total_ns=5 * MS), **kw)


def _fix_text(f) -> str:
    return f"{f.fix.instruction}\n{f.fix.before}\n{f.fix.after}"


def _prescribes_compile(f) -> bool:
    """The fix tells the user to start using torch.compile (not to change how they use it)."""
    text = _fix_text(f)
    return "compile the model with `torch.compile`" in text or "model = torch.compile(Net" in text


# --------------------------------------------------------------------------- GD103: advice that fits the code


def test_gd103_eager_code_is_told_to_compile():
    res = judge("GD103", run(metrics=(_launch_bound(),)))
    assert res.verdict == Verdict.FIRED
    (f,) = res.findings
    assert _prescribes_compile(f)


def test_gd103_compiled_code_is_told_cuda_graphs_never_torch_compile():
    res = judge("GD103", run(metrics=(_launch_bound(compiled=_stats()),)))
    (f,) = res.findings
    assert not _prescribes_compile(f)
    assert "already compiled" in f.fix.instruction and 'mode="reduce-overhead"' in f.fix.instruction
    assert "90.0% of kernels are launched inside compiled code" in f.fix.instruction
    assert 'mode="reduce-overhead"' in f.fix.after
    # CUDA graphs: the 900 launches inside compiled code become 5 + 5 + … one per graph call
    graphs = 5  # region calls
    assert f.gain.expected_fraction == pytest.approx(1 - (1000 - 900 + graphs) / 1000, abs=1e-4)
    assert "CUDA graphs replay each compiled graph" in f.gain.expected_note
    metrics = {m.name: m.value for m in f.evidence.metrics}
    assert metrics["compiled_launch_pct"] == 90.0 and metrics["triton_kernel_time_pct"] == 62.5


def test_gd103_compiled_by_the_settings_names_graph_breaks_and_recompilations():
    state = CompileState(
        events=tuple(CompileEvent(f"0/{i}", i, i * 100 * MS, 50 * MS, reason=f"0/{i - 1}: tensor 'x' size mismatch")
                     for i in range(4)),
        graph_breaks={"call_function print": 3},
    )
    data = run(metrics=(_launch_bound(),), settings=settings(wrappers=(COMPILE,), compile=state), manifest=manifest())
    (f,) = judge("GD103", data).findings
    assert not _prescribes_compile(f)
    assert "3 graph breaks (most often: call_function print, ×3)" in f.fix.instruction
    assert "3 recompilations in steps 1-3 (GD105)" in f.fix.instruction


def test_gd103_graphed_code_is_told_to_capture_more_or_raise_the_batch():
    st = _stats(graph_launches=5, graph_kernels=800, graph_kernel_pct=80.0, region_launches=150)
    (f,) = judge("GD103", run(metrics=(_launch_bound(compiled=st),))).findings
    assert not _prescribes_compile(f)
    assert "already replays CUDA graphs (5 launches issuing 800 kernels)" in f.fix.instruction
    assert "845 launch calls" in f.fix.instruction  # 1000 - 5 graph launches - 150 inside compiled code
    assert f.gain.expected_fraction is None  # no model: the bound stands
    assert any("issued by 5 CUDA graph launch(es)" in n for n in f.evidence.notes)


def test_gd103_partly_compiled_code_is_told_to_compile_the_eager_rest():
    st = _stats(region_launches=10, triton_kernels=5, triton_ns=MS, triton_pct=2.5)
    (f,) = judge("GD103", run(metrics=(_launch_bound(compiled=st),))).findings
    assert "Most launches come from eager code: 99.0% of kernels" in f.fix.instruction
    assert any("partly compiled: 1.0%" in n for n in f.evidence.notes)


def test_gd103_compiled_cpu_code_is_told_a_larger_batch():
    d = DispatchStats(window=WindowKind.STEPS, steps=5, ops_per_step=3000, top_level_ops_per_step=600,
                      op_self_median_ns=3_000, op_ns=6 * MS, short_op_ns=5 * MS, short_op_time_pct=83.0,
                      glue_ns=3 * MS, typical_step_ns=10 * MS, dispatch_ns=8 * MS, dispatch_pct=80.0,
                      step_median_ns=10 * MS)
    m = cpu_trace(dispatch=d, compiled=_stats(kernels=0, kernel_ns=0, triton_kernels=0, triton_ns=0,
                                              triton_pct=None, launches=0, region_launches=0))
    data = run(metrics=(m,), manifest=cpu_manifest(),
               settings=settings(device_type="cpu", dataloaders=(dataloader(batch_size=4),), wrappers=(COMPILE,)))
    res = judge("GD103", data)
    assert res.verdict == Verdict.FIRED
    (f,) = res.findings
    assert not _prescribes_compile(f) and "torch.compile(model)" not in f.fix.after
    assert "already compiled (torch.compile at train.py:31)" in f.fix.instruction
    # batch_size=4 -> the batch the fix sizes (a power of two); a k× batch pays the overhead once for k× samples
    new_bs = int(f.fix.after.split("batch_size=")[1].split(")")[0].split(",")[0])
    assert new_bs > 4 and f.gain.expected_fraction == pytest.approx(1 - 4 / new_bs, abs=1e-4)


def test_code_kind_reads_the_settings_when_the_trace_has_no_regions():
    ctx = RuleContext(run(settings=settings(wrappers=(COMPILE,))), Config().thresholds)
    kind = code_kind(ctx, _launch_bound())
    assert kind.compiled and kind.mostly_compiled and kind.compiled_launch_pct is None
    eager = code_kind(RuleContext(run(settings=settings()), Config().thresholds), _launch_bound())
    assert not eager.compiled and not eager.mostly_compiled


# --------------------------------------------------------------------------- GD105 recompiles


def _recompiling_run(recompiles: int = 7, limit_hit: bool = True, compile_ms: float = 300.0) -> RunData:
    """Step 0 compiles (the warm-up), steps 1..recompiles recompile the frame on a new shape (each step
    that long longer), then the recompile limit refuses the next one."""
    walls = [100.0 + (compile_ms if i <= recompiles else 0.0) for i in range(30)]
    recs, t = [], 0
    for i, w in enumerate(walls):
        recs.append(dataclasses.replace(steps(1)[0], index=i, start_ns=t, wall_ns=int(w * MS)))
        t += int(w * MS)
    events = []
    for i in range(recompiles + 1):
        reason = f"0/{i - 1}: tensor 'tokens' size mismatch at index 1. expected {16 + i}, actual {17 + i}" if i else ""
        events.append(CompileEvent(f"0/{i}", i, recs[i].start_ns, int(compile_ms * 0.8 * MS), "dynamo", "forward",
                                   SITE, reason))
        events.append(CompileEvent(f"0/{i}", i, recs[i].start_ns, int(compile_ms * 0.2 * MS), "lazy_backward"))
    if limit_hit:
        k = recompiles + 1
        events.append(CompileEvent(f"0/{k}", None, recs[k].start_ns + 5 * MS, 2 * MS, failed="Dynamo recompile limit exceeded"))
    state = CompileState(events=tuple(events), recompile_limit=8, limit_hits=1 if limit_hit else 0)
    off = dataclasses.replace(COMPILE, options={**COMPILE.options, "dynamic": False})
    return run(manifest=cpu_manifest(steps_seen=len(recs)), steps=tuple(recs),
               settings=settings(device_type="cpu", wrappers=(off,), compile=state))


def test_gd105_fires_on_recompilations_step_after_step():
    res = judge("GD105", _recompiling_run())
    assert res.verdict == Verdict.FIRED
    (f,) = res.findings
    assert f.message.startswith("torch.compile recompiled frame 0 (forward at train.py:31) 7 times in steps 1-7")
    assert "most often: tensor 'tokens' size mismatch at index 1. expected 17, actual 18 (×7)" in f.message
    assert "the recompile limit (8) was reached at step 8: the frame runs eagerly from then on" in f.message
    # 7 × 300 ms of 30 steps (3,000 ms, and 8 × 300 ms compiling: 5,400 ms): 38.9%
    metrics = {m.name: m.value for m in f.evidence.metrics}
    assert metrics["recompile_ns"] == 7 * 300 * MS and metrics["recompile_share_pct"] == pytest.approx(38.89, abs=0.01)
    assert f.severity == Severity.ERROR and f.gain.share_pct is None and not f.gain.claims
    assert "`dynamic=False` at train.py:31" in f.fix.instruction and "mark_dynamic" in f.fix.instruction
    assert f.location is not None and f.location.line == 31
    # every recompilation with its step and what triggered it
    assert "step 3: compile 0/3 (240.00 ms): tensor 'tokens' size mismatch at index 1. expected 19, actual 20" \
        in f.evidence.notes


def test_gd105_is_quiet_on_the_warm_up_and_one_automatic_dynamic_recompilation():
    res = judge("GD105", _recompiling_run(recompiles=1, limit_hit=False))
    assert res.verdict == Verdict.FINE and res.applied
    assert "1 recompilation in step 1" in res.reason and "warm-up: 300.00 ms compiling in step 0" in res.reason
    assert judge("GD105", _recompiling_run(recompiles=2, limit_hit=False)).verdict == Verdict.FINE
    assert judge("GD105", _recompiling_run(recompiles=3, limit_hit=False)).verdict == Verdict.FIRED
    assert judge("GD105", _recompiling_run(recompiles=3, limit_hit=False), recompile_min_count=4).verdict == Verdict.FINE


def test_gd105_fires_on_the_recompile_limit_alone():
    res = judge("GD105", _recompiling_run(recompiles=1, limit_hit=True))
    assert res.verdict == Verdict.FIRED and "recompile limit (8) was reached at step 2" in res.findings[0].message


def test_gd105_needs_a_run_that_compiled():
    assert judge("GD105", run(metrics=(trace(),))).verdict == Verdict.CANNOT_JUDGE  # a bare trace
    assert judge("GD105", run(settings=settings())).verdict == Verdict.NOT_APPLICABLE
    assert judge("GD105", run(settings=settings(wrappers=(COMPILE,)))).verdict == Verdict.CANNOT_JUDGE


def test_compilation_steps_are_left_out_of_the_steady_steps():
    data = _recompiling_run()
    assert compile_steps(data.settings, data.steps) == frozenset(range(9))  # the refusal placed at step 8 by its time
    steady = RuleContext(data, Config().thresholds).steady_steps()
    assert [s.index for s in steady] == list(range(9, 30))
    comp = compilations(data.settings.compile)
    assert comp is not None and comp.warmup_steps == (0,) and len(comp.recompiles) == 7 and len(comp.limit_hits) == 1


# --------------------------------------------------------------------------- the summary


def test_summary_names_compiled_kernels_graph_launches_and_recompilations():
    m = _launch_bound(compiled=_stats(graph_launches=25, graph_kernels=1900, graph_kernel_pct=70.0))
    ctx = RuleContext(_recompiling_run(), Config().thresholds)
    ctx = dataclasses.replace(ctx, run=dataclasses.replace(ctx.run, metrics=(m,)))
    text = compiled_summary(ctx, m)
    assert text is not None
    assert "torch.compile(backend=inductor, dynamic=False) at train.py:31" in text
    assert "62.5% of kernel time in Triton kernels (600 of 1,000 kernels)" in text
    assert "25 CUDA graph launches issuing 1,900 kernels (70.0% of kernel time)" in text
    assert "warm-up: 300.00 ms compiling in step 0" in text and "7 recompilations in steps 1-7" in text
    assert "recompile limit (8) reached: 1 frame run eagerly from then on" in text
    report = diagnose(ctx.run, Config(), "profile")
    (stat,) = [s for s in report.summary if s.key == "compiled"]
    assert stat.value == text
    assert compiled_summary(RuleContext(run(metrics=(trace(),)), Config().thresholds), trace()) is None


# --------------------------------------------------------------------------- the shared traces


@pytest.mark.shared_traces
@pytest.mark.parametrize("name, words", [
    ("tracelens/mi300x_torch_compile_triton", ("6.7% of kernel time in Triton kernels (4 of 12 kernels)",
                                               "1 compiled region call")),
    ("tracelens/vllm_decode_cuda_graph", ("4.0% of kernel time in Triton kernels (48 of 425 kernels)",
                                          "1 HIP graph launch issuing 421 kernels (97.3% of kernel time)")),
    ("hta/a100_rank0_of16_negative_queue", ("70 CUDA graph launches issuing 120 kernels", "compiled functions per step")),
])
def test_shared_traces_summary_names_compiled_kernels_and_graph_launches(shared_traces: Path, name, words):
    from gpudoctor.analysis import analyze_trace
    from gpudoctor.parse import load_trace

    m = analyze_trace(load_trace(shared_traces / f"{name}.json.gz"))
    report = diagnose(RunData(source=m.path, metrics=(m,)), Config(), "analyze")
    (stat,) = [s for s in report.summary if s.key == "compiled"]
    for w in words:
        assert w in str(stat.value), (w, stat.value)
    for f in report.findings:  # compiled code is never told to compile
        if f.code == "GD103" and code_kind(RuleContext(report.run, Config().thresholds), m).mostly_compiled:
            assert not _prescribes_compile(f), f.fix.instruction
