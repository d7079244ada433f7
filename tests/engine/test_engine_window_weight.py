"""The accounting window (docs/account.md, "The accounting window"), on hand-built runs: the account is
charged on the window recorded without stacks or shapes, states how much slower its steps ran than the
unprofiled ones, and, above ``profiler_weight_max_ratio``, scales its host-side work to the unprofiled
step; the detailed window still gives the shapes; a bare trace's account is as recorded."""

from __future__ import annotations

import dataclasses

from rule_builders import MS, manifest, run, settings, trace, utilization

from gpudoctor import engine
from gpudoctor.config import Config
from gpudoctor.model import StepRecord, StepWindow
from gpudoctor.rules.context import RuleContext

DETAIL = range(10, 15)  # steps the detailed window (shapes and stacks) recorded
PLAIN = range(25, 30)  # steps the timings-only window recorded


def _steps(bare_ms: float, plain_ms: float, detail_ms: float = 40.0) -> tuple[StepRecord, ...]:
    """30 steps timed by CUDA events: the profiler's windows at 9 (warm-up), 10-14, 24 (warm-up), 25-29;
    every other step ``bare_ms`` (the host enqueues each in half of it)."""
    out = []
    t = 0
    for i in range(30):
        window = "active" if i in DETAIL or i in PLAIN else "warmup" if i in (9, 24) else ""
        gpu = detail_ms if i in DETAIL else plain_ms if i in PLAIN else bare_ms
        out.append(StepRecord(index=i, start_ns=t, wall_ns=int(gpu * MS / 2), gpu_ns=int(gpu * MS), window=window,
                              marker="optimizer"))
        t += int(gpu * MS)
    return tuple(out)


def _windows(steps: range, step_ms: float, start_ms: float) -> tuple[StepWindow, ...]:
    d = int(step_ms * MS)
    return tuple(StepWindow(n, int(start_ms * MS) + k * d, int(start_ms * MS) + (k + 1) * d) for k, n in enumerate(steps))


def _run(bare_ms: float, plain_ms: float):
    """Each window step: 40% of it on the device, 40% launching, 10% Python, 10% waiting for a batch; the
    detailed window's kernels filed by dtype (its shapes), the plain window's not."""
    detail = trace(path="p.00000011.pt.trace.json.gz", steps=_windows(DETAIL, 40.0, 0.0),
                   utilization=(utilization(60.0, window_ns=200 * MS),),
                   breakdown_mean_pct={"gpu_fp32_matmul": 30.0, "gpu_compute": 10.0, "launch_overhead": 40.0,
                                       "other_cpu": 10.0, "data_loading": 10.0},
                   has_stacks=True, has_shapes=True)
    plain = trace(path="p.00000025.pt.trace.json.gz", steps=_windows(PLAIN, plain_ms, 1000.0),
                  utilization=(utilization(60.0, window_ns=int(5 * plain_ms * MS)),),
                  breakdown_mean_pct={"gpu_compute": 40.0, "launch_overhead": 40.0, "other_cpu": 10.0,
                                      "data_loading": 10.0},
                  has_stacks=False, has_shapes=False)
    return run(manifest=manifest(), settings=settings(dataloaders=()), metrics=(detail, plain),
               steps=_steps(bare_ms, plain_ms))


def test_a_slow_window_is_weighed_and_its_host_work_scaled_to_the_unprofiled_step():
    data = _run(bare_ms=15.0, plain_ms=20.0)  # the plain window's steps ran 1.33x the unprofiled ones
    rep = engine.diagnose(data, Config(), "analyze")
    led = rep.account.ledger
    # the account reads the timings-only window, and names the detailed one
    assert led.label == "p.00000025.pt.trace.json.gz" and "timings only" in led.window
    assert "p.00000011.pt.trace.json.gz" in led.window
    w = led.weight
    assert w is not None and w.scaled and w.ratio == 20.0 / 15.0 and w.source == "CUDA events"
    assert w.window_step_ns == 20 * MS and w.bare_step_ns == 15 * MS and w.window_steps == 5
    assert w.bare_steps == 16  # 30 steps less the first, the 12 in windows and the one after the first window
    # 100 ms recorded; 75 ms at the unprofiled rate: the 25 ms from launching and Python, in proportion
    ns = {s.component: s.ns for s in led.slices}
    assert led.total_ns == 75 * MS == sum(ns.values())
    assert ns["data_loading"] == 10 * MS
    assert ns["launch_overhead"] == 20 * MS and ns["other_cpu"] == 5 * MS
    # the device's 40 ms stay, filed by dtype as the detailed window's shapes file them (3 : 1)
    assert ns["gpu_fp32_matmul"] == 30 * MS and ns["gpu_compute"] == 10 * MS
    # the report says so
    note = next(n for n in rep.account.notes if n.startswith("profiled steps ran"))
    assert "1.33× the unprofiled ones" in note and "scaled to the unprofiled step" in note and "25.00 ms" in note
    # the projection starts from the unprofiled steps
    assert rep.account.step_ns == 15 * MS and "unprofiled steady steps" in rep.account.step_source
    # a finding's share is of the scaled step: GD101's idle, and the launch overhead GD103 claims
    f101 = next(f for f in rep.findings if f.code == "GD101")
    assert abs(next(m.value for m in f101.evidence.metrics if m.name == "gpu_idle_pct") - 100 * 35 / 75) < 0.01
    f103 = next(f for f in rep.findings if f.code == "GD103")
    assert abs(f103.gain.share_pct - 100 * 20 / 75) < 1e-3 and "26.7% of step time" in f103.message


def test_a_light_window_is_stated_and_left_as_recorded():
    data = _run(bare_ms=19.0, plain_ms=20.0)  # 1.05x: within the threshold
    led = engine.diagnose(data, Config(), "analyze").account.ledger
    assert led.weight is not None and not led.weight.scaled and led.weight.ratio == 20 / 19
    assert led.total_ns == 100 * MS and {s.component: s.ns for s in led.slices}["launch_overhead"] == 40 * MS
    rep = engine.diagnose(data, Config(), "analyze")
    assert any(n.startswith("profiled steps ran 1.05× the unprofiled ones") and "as recorded" in n
               for n in rep.account.notes)
    # the threshold is a setting: lowered under the weight, the same run is scaled
    th = dataclasses.replace(Config().thresholds, profiler_weight_max_ratio=1.02)
    assert RuleContext(data, th).ledger().weight.scaled


def test_a_bare_trace_keeps_its_account():
    """A Kineto trace on its own (the public traces): no unprofiled steps to weigh it against, so the
    account is the trace's ledger as recorded (what torch-tb-profiler and HTA are compared with)."""
    data = _run(bare_ms=15.0, plain_ms=20.0)
    (plain,) = [m for m in data.metrics if not m.has_stacks]
    bare = dataclasses.replace(data, steps=(), manifest=None, settings=None, metrics=(plain,))
    assert RuleContext(bare).ledger() == plain.ledger
    # so too a run with too few unprofiled steps
    few = dataclasses.replace(data, steps=tuple(s for s in data.steps if s.window or s.index >= 26))
    led = RuleContext(few).ledger(plain)
    assert led.weight is None and led.total_ns == 100 * MS


def test_the_detailed_window_gives_the_findings_that_need_shapes():
    data = _run(bare_ms=15.0, plain_ms=20.0)
    ctx = RuleContext(data)
    assert [m.path for m in ctx.accounting_traces()] == ["p.00000025.pt.trace.json.gz"]
    assert [m.path for m in ctx.detail_traces("shapes")] == ["p.00000011.pt.trace.json.gz"]
    assert ctx.primary_trace().path == "p.00000025.pt.trace.json.gz"
    # whichever trace a rule judges, its claims go to the one account of the process
    assert ctx.ledger(data.metrics[0]) is ctx.ledger(data.metrics[1])
    # a figure measured over the detailed window's five 40 ms steps is a share of the account's step
    assert abs(ctx.trace_share(data.metrics[0], 30 * MS) - 100 * 30 / 75) < 1e-9
