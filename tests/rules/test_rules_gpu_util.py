"""GD101–GD104: each must fire on a hand-built trace that shows the problem and stay quiet on one that does not."""

from __future__ import annotations

import dataclasses

from rule_builders import (
    GB,
    MS,
    GapCause,
    HostSync,
    NameStat,
    SyncSummary,
    cpu_manifest,
    cpu_trace,
    dataloader,
    gpu_samples,
    judge,
    kernels,
    manifest,
    run,
    settings,
    trace,
    utilization,
)

from gpudoctor.model import MemoryStats, Samples, Severity
from gpudoctor.rules.results import Verdict

# ---------------------------------------------------------------- GD101 gpu-idle


def test_gd101_fires_on_idle_gpu_and_names_the_causes():
    m = trace(utilization=(utilization(60.0, causes={GapCause.SYNC: 0.7, GapCause.DATALOADER: 0.3}),))
    res = judge("GD101", run(metrics=(m,)))
    assert res.verdict == Verdict.FIRED
    (f,) = res.findings
    assert f.severity == Severity.ERROR  # from the idle share, on the one scale
    # the headline gains nothing itself: its causes' findings do (the engine names them, see tests/engine)
    assert f.gain.share_pct is None and not f.gain.claims and "sum of its causes" in f.gain.note
    # the causes as parts of step time, the same figures the ledger gives the cause findings
    assert "60.0%" in f.message and "host synchronizations 42.0%" in f.message
    assert "waiting for the DataLoader 18.0%" in f.message
    assert "see GD" not in " ".join((f.message, f.fix.instruction, *f.evidence.notes))
    assert any(m.name == "gpu_idle_pct" and m.window == "steps" for m in f.evidence.metrics)
    assert f.evidence.time_ranges


def test_gd101_quiet_on_busy_gpu():
    res = judge("GD101", run(metrics=(trace(utilization=(utilization(8.0),)),)))
    assert res.verdict == Verdict.FINE
    assert "8.0%" in res.reason and not res.findings


def test_gd101_cannot_judge_without_gpu():
    res = judge("GD101", run(manifest=cpu_manifest(), metrics=(cpu_trace(),)))
    assert res.verdict == Verdict.CANNOT_JUDGE
    assert "no GPU" in res.reason


def test_gd101_uses_span_without_step_markers():
    m = trace(steps=(), utilization=(utilization(30.0, with_steps=False),))
    (f,) = judge("GD101", run(metrics=(m,))).findings
    assert "span" in f.message
    assert any(x.name == "gpu_idle_pct" and x.window == "span" for x in f.evidence.metrics)


def test_gd101_keeps_worst_rank_and_names_the_others():
    ranks = tuple(trace(rank=r, utilization=(utilization(25.0 + r),)) for r in range(3))
    res = judge("GD101", run(metrics=ranks))
    (f,) = res.findings
    assert f.rank == 2
    assert any("rank 0" in n and "rank 1" in n for n in f.evidence.notes)


# ---------------------------------------------------------------- GD102 host-sync


def _syncs(share: float) -> SyncSummary:
    return SyncSummary(
        count=50,
        total_ns=int(50 * MS * share / 100),
        share_of_steps_pct=share,
        by_name=(NameStat("aten::item", 50, int(50 * MS * share / 100)),),
        by_frame=(NameStat("train.py(42): train_step", 50, int(50 * MS * share / 100)),),
        top=(HostSync("cudaStreamSynchronize", 1 * MS, MS // 2, "train.py(42): train_step"),),
    )


def test_gd102_fires_and_points_at_the_line():
    m = trace(syncs=_syncs(12.0), utilization=(utilization(30.0, causes={GapCause.SYNC: 1.0}),))
    (f,) = judge("GD102", run(metrics=(m,))).findings
    assert f.location is not None and (f.location.file, f.location.line) == ("train.py", 42)
    assert "12.0%" in f.message and "aten::item" in f.message
    assert f.gain.share_pct == 30.0  # the GPU idle time after syncs
    assert f.severity == Severity.ERROR


def test_gd102_judges_the_timings_only_window_and_names_the_line_from_the_detailed_one():
    """The account's window records no stacks (docs/account.md, "The accounting window"): the share is
    its own, the line the one the detailed window's stacks give."""
    detail = trace(path="p.00000011.pt.trace.json.gz", syncs=_syncs(30.0),
                   utilization=(utilization(60.0, causes={GapCause.SYNC: 1.0}),))
    plain_syncs = dataclasses.replace(_syncs(12.0), by_frame=(), top=())
    plain = trace(path="p.00000025.pt.trace.json.gz", syncs=plain_syncs, has_stacks=False, has_shapes=False,
                  utilization=(utilization(30.0, causes={GapCause.SYNC: 1.0}),))
    (f,) = judge("GD102", run(metrics=(detail, plain))).findings
    assert "12.0% of step time" in f.message and f.gain.share_pct == 30.0  # the plain window's figures
    assert f.location is not None and (f.location.file, f.location.line) == ("train.py", 42)
    assert any("p.00000011.pt.trace.json.gz, the window that recorded stacks" in n for n in f.evidence.notes)
    assert "also on" not in " ".join(f.evidence.notes)  # the detailed window is not judged for the share


def test_gd102_sync_on_saturated_gpu_is_only_info():
    m = trace(syncs=_syncs(12.0), utilization=(utilization(1.0, causes={GapCause.SHORT: 1.0}),))
    (f,) = judge("GD102", run(metrics=(m,))).findings
    assert f.severity == Severity.INFO


def test_gd102_quiet_below_threshold():
    res = judge("GD102", run(metrics=(trace(syncs=_syncs(2.0)),)))
    assert res.verdict == Verdict.FINE


def test_gd102_cannot_judge_without_sync_data():
    assert judge("GD102", run(metrics=(trace(syncs=None),))).verdict == Verdict.CANNOT_JUDGE


# ---------------------------------------------------------------- GD103 launch-bound


def test_gd103_fires_when_kernels_are_tiny_and_launches_as_long():
    m = trace(
        kernels=kernels(under_10us_pct=76.0, launch_total_ns=5_600_000, launch_count=1000, p50_ns=4000),
        utilization=(utilization(80.0, causes={GapCause.LAUNCH_BOUND: 0.6, GapCause.SHORT: 0.2, GapCause.OTHER: 0.2}),),
    )
    (f,) = judge("GD103", run(metrics=(m,))).findings
    assert "76.0%" in f.message and "5.6 µs (1.40× the median kernel)" in f.message
    assert f.message.startswith("launch-bound: the GPU waits 64.0% of step time")
    assert round(f.gain.share_pct, 1) == 64.0  # launch-bound and short gaps: the ledger's launch_overhead
    assert [c.component for c in f.gain.claims] == ["launch_overhead"]
    assert "torch.compile" in f.fix.instruction


def test_gd103_quiet_when_kernels_are_long():
    assert judge("GD103", run(metrics=(trace(),))).verdict == Verdict.FINE


def test_gd103_quiet_when_host_keeps_up():
    # tiny kernels, but the GPU never waits on launches (its idle time is other host work)
    m = trace(kernels=kernels(under_10us_pct=80.0, launch_total_ns=1_000_000, launch_count=1000, p50_ns=5000))
    res = judge("GD103", run(metrics=(m,)))
    assert res.verdict == Verdict.FINE and "idles the GPU 0.0% of step time (threshold 5%)" in res.reason


def test_gd103_dispatch_bound_when_the_gpu_waits_on_the_host_but_kernels_are_long():
    # the ledger decides (GD101's figure); the kernels only choose the wording
    m = trace(utilization=(utilization(50.0, causes={GapCause.LAUNCH_BOUND: 0.8, GapCause.OTHER: 0.2}),))
    (f,) = judge("GD103", run(metrics=(m,))).findings
    assert f.message.startswith("dispatch-bound: the GPU waits 40.0% of step time between kernels")
    assert f.gain.share_pct == 40.0


# ---------------------------------------------------------------- GD104 batch-too-small


def test_gd104_fires_with_free_memory_and_idle_gpu():
    m = trace(
        utilization=(utilization(40.0),),
        memory=(MemoryStats(0, peak_allocated_bytes=8 * GB, peak_reserved_bytes=10 * GB, total_bytes=80 * GB),),
    )
    data = run(metrics=(m,), settings=settings(dataloaders=(dataloader(batch_size=16),)), manifest=manifest())
    (f,) = judge("GD104", data).findings
    assert "12.5%" in f.message and "batch_size=16" in f.message
    assert "batch_size=64" in f.fix.after  # 4× (50%) stays under 90% of the device, 8× would not
    assert f.location is not None and f.location.line == 31


def test_gd104_falls_back_to_nvml():
    m = trace(utilization=(utilization(40.0),))
    data = run(metrics=(m,), samples=Samples(gpu=gpu_samples(55.0, 20 * GB)))
    (f,) = judge("GD104", data).findings
    assert any(x.name == "peak_memory_source" and x.value == "NVML used" for x in f.evidence.metrics)


def test_gd104_quiet_when_memory_is_used():
    m = trace(utilization=(utilization(40.0),), memory=(MemoryStats(0, peak_reserved_bytes=60 * GB, total_bytes=80 * GB),))
    assert judge("GD104", run(metrics=(m,))).verdict == Verdict.FINE


def test_gd104_cannot_judge_without_memory_figures():
    res = judge("GD104", run(metrics=(trace(utilization=(utilization(40.0),)),)))
    assert res.verdict == Verdict.CANNOT_JUDGE and "memory" in res.reason


def test_gd103_quiet_when_launch_gaps_cost_nothing():
    m = trace(
        kernels=kernels(count=4, under_10us_pct=75.0, launch_total_ns=1_448_000, launch_count=4, p50_ns=6000),
        utilization=(utilization(98.0, causes={GapCause.OTHER: 1.0}),),
    )
    res = judge("GD103", run(metrics=(m,)))
    assert res.verdict == Verdict.FINE and "idles the GPU 0.0% of step time" in res.reason
    res = judge("GD103", run(metrics=(m,)), launch_gap_min_share_pct=0.0)  # the threshold is read
    assert res.verdict == Verdict.FIRED


# ---------------------------------------------------------------- where the device limits the steps


def _timelines(device_bound: int, steps: int = 5):
    """Five 10 ms device steps enqueued by 2 ms host steps; the first ``device_bound`` waited for nothing."""
    from gpudoctor.model import StepSpan, Timelines

    spans = tuple(
        StepSpan(step=i, host_start_ns=2 * MS * i, host_end_ns=2 * MS * (i + 1), device_start_ns=30 * MS + 10 * MS * i,
                 device_end_ns=40 * MS + 10 * MS * i, window_start_ns=30 * MS + 10 * MS * i,
                 window_end_ns=40 * MS + 10 * MS * i, activities=10, busy_ns=10 * MS if i < device_bound else 4 * MS,
                 host_wait_ns=0 if i < device_bound else 6 * MS, limit="device" if i < device_bound else "host")
        for i in range(steps)
    )
    return Timelines(device=0, steps=spans, device_bound_steps=device_bound, host_bound_steps=steps - device_bound,
                     tied_by="launch calls (correlation ids)", tied=10 * steps, untied=0, host_step_ns=2 * MS,
                     device_step_ns=10 * MS, device_busy_pct=99.0, device_wait_pct=0.0, lead_ns=30 * MS,
                     device_bound_wait_pct=5.0)


def test_gd103_and_gd104_are_quiet_where_the_device_limits_every_step():
    """Tiny kernels and free memory, but the device ran behind the host through every profiled step:
    neither launches nor the batch size set the step time there."""
    m = trace(
        kernels=kernels(under_10us_pct=76.0, launch_total_ns=5_600_000, launch_count=1000, p50_ns=4000),
        utilization=(utilization(80.0, causes={GapCause.LAUNCH_BOUND: 0.6, GapCause.SHORT: 0.2, GapCause.OTHER: 0.2}),),
        memory=(MemoryStats(0, peak_allocated_bytes=8 * GB, peak_reserved_bytes=10 * GB, total_bytes=80 * GB),),
    )
    assert judge("GD103", run(metrics=(m,))).verdict == Verdict.FIRED  # the same trace, no timelines
    limited = dataclasses.replace(m, timelines=_timelines(5))
    for code in ("GD103", "GD104"):
        res = judge(code, run(metrics=(limited,)))
        assert res.verdict == Verdict.FINE and "the GPU limits all 5 profiled steps" in res.reason, (code, res)


def test_gd104_needs_the_device_to_wait_when_some_steps_are_device_bound():
    """With steps the device limits, tiny kernels alone do not fire GD104: the GPU-idle share must."""
    m = trace(
        kernels=kernels(under_10us_pct=80.0),
        utilization=(utilization(10.0),),
        memory=(MemoryStats(0, peak_allocated_bytes=8 * GB, peak_reserved_bytes=10 * GB, total_bytes=80 * GB),),
    )
    assert judge("GD104", run(metrics=(m,))).verdict == Verdict.FIRED  # tiny kernels, no timelines
    mixed = dataclasses.replace(m, timelines=_timelines(3))
    assert judge("GD104", run(metrics=(mixed,))).verdict == Verdict.FINE
