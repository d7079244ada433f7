"""GD602 comm-exposed, GD603 straggler, GD604 non-nccl-backend, GD605 find-unused-parameters."""

from __future__ import annotations

import dataclasses

import pytest
from dist_builders import rank_trace, synchronized
from rule_builders import (
    SITE,
    WrapSetting,
    cpu_manifest,
    judge,
    manifest,
    run,
    settings,
    steps,
    trace,
)

from gpudoctor.model import Severity
from gpudoctor.rules.results import Verdict


def ddp(**options) -> WrapSetting:
    base = {"device_ids": [0], "bucket_cap_mb": 25, "find_unused_parameters": False, "gradient_as_bucket_view": False,
            "static_graph": False, "backend": "nccl", "world_size": 2}
    base.update(options)
    return WrapSetting("DistributedDataParallel", SITE, "ResNet", base)


# ---------------------------------------------------------------- GD602 comm-exposed


def test_gd602_fires_on_the_least_exposed_rank():
    ranks = (rank_trace(0, 2, [20.0] * 5, [6.0] * 5, gpu=True, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"),
             rank_trace(1, 2, [20.0] * 5, [3.0] * 5, gpu=True, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"))
    res = judge("GD602", run(metrics=ranks, settings=settings(wrappers=(ddp(),))))
    (f,) = res.findings
    assert res.verdict == Verdict.FIRED and f.rank == 1
    assert f.gain.share_pct == pytest.approx(15.0) and f.severity == Severity.WARNING
    assert "15.0% of step time" in f.message and "3.00 ms of 20.00 ms per step" in f.message
    assert "ncclDevKernel_AllReduce_Sum_f32_RING_LL on the GPU" in f.message and "rank 0: 30.0%" in f.message
    assert "no_sync" in f.fix.after and f.location is not None and str(f.location) == "train.py:31"
    assert any(s.name == "DistributedDataParallel.bucket_cap_mb" for s in f.evidence.settings)


def test_gd602_quiet_when_overlapped():
    ranks = tuple(rank_trace(r, 2, [20.0] * 5, [1.0] * 5) for r in range(2))
    res = judge("GD602", run(metrics=ranks))
    assert res.verdict == Verdict.FINE and "5.0%" in res.reason and "the least of 2 ranks" in res.reason
    # waiting for a straggler is GD603's, not exposed communication
    res = judge("GD602", run(metrics=synchronized(slow_rank=2)))
    assert res.verdict == Verdict.FINE


def test_gd602_threshold_and_single_process():
    one = (rank_trace(0, 2, [20.0] * 5, [3.0] * 5),)
    assert judge("GD602", run(metrics=one)).verdict == Verdict.FIRED
    assert judge("GD602", run(metrics=one), comm_exposed_share_pct=20.0).verdict == Verdict.FINE
    assert judge("GD602", run(metrics=(trace(),))).verdict == Verdict.NOT_APPLICABLE
    assert judge("GD602", run(steps=steps())).verdict == Verdict.NOT_APPLICABLE


def test_gd602_names_point_to_point_traffic():
    t = rank_trace(0, 8, [80.0] * 5, [15.0] * 5, gpu=True, name="ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(a, b)")
    (f,) = judge("GD602", run(metrics=(t,))).findings
    assert "point-to-point" in f.fix.instruction and "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t" in f.fix.instruction


# ---------------------------------------------------------------- GD603 straggler


def test_gd603_names_the_straggler():
    res = judge("GD603", run(metrics=synchronized(slow_rank=1)))
    (f,) = res.findings
    # the others' wait is time in their ledgers (exposed communication), not a part of this rank's step
    assert f.rank == 1 and f.severity == Severity.ERROR and f.gain.share_pct is None
    assert "the other ranks wait for it" in f.gain.note
    assert f.message.startswith("rank 1 is the straggler: its work per step")
    assert "behind by 5% of the step or more in 5 of 5 compared steps" in f.message and "median of the other 2 ranks" in f.message
    assert any(m.name == "straggler_rank" and m.value == 1 for m in f.evidence.metrics)
    assert any(n.startswith("rank 0: work") for n in f.evidence.notes)


def test_gd603_quiet_when_ranks_are_equal():
    res = judge("GD603", run(metrics=synchronized(slow_rank=None)))
    assert res.verdict == Verdict.FINE and "threshold 5%" in res.reason


def test_gd603_cannot_judge_a_straggler_from_equal_step_times_alone():
    recs = tuple(dataclasses.replace(s, rank=r) for r in range(2) for s in steps(n=10, wall_ms=100.0))
    res = judge("GD603", run(manifest=manifest(world_size=2), steps=recs))
    assert res.verdict == Verdict.CANNOT_JUDGE and "does not show in step times" in res.reason


def test_gd603_one_rank_or_one_process():
    assert judge("GD603", run(metrics=(rank_trace(0, 8, [10.0] * 5, [1.0] * 5),))).verdict == Verdict.CANNOT_JUDGE
    assert judge("GD603", run(steps=steps())).verdict == Verdict.NOT_APPLICABLE


# ---------------------------------------------------------------- GD604 non-nccl-backend


def test_gd604_fires_on_gloo_with_cuda_tensors_from_settings():
    data = run(manifest=manifest(world_size=2), settings=settings(device_type="cuda", wrappers=(ddp(backend="gloo"),)))
    (f,) = judge("GD604", data).findings
    assert "gloo backend" in f.message and "train.py:31" in f.message
    assert 'init_process_group("nccl")' in f.fix.instruction and "cuda:nccl" in f.fix.after
    assert f.gain.share_pct is None and f.severity == Severity.WARNING


def test_gd604_fires_on_a_gpu_trace_with_gloo_collectives_and_measures_them():
    ranks = tuple(rank_trace(r, 2, [20.0] * 5, [5.0] * 5, gpu=True, backend="", device=-1) for r in range(2))
    (f,) = judge("GD604", run(metrics=ranks)).findings
    assert "gloo:all_reduce ranges next to GPU work" in f.message and "exposed communication 25.0%" in f.message
    assert f.gain.share_pct is None and "25.0% of its step time (GD602 claims it)" in f.gain.note


def test_gd604_quiet_with_nccl_or_on_cpu():
    data = run(settings=settings(device_type="cuda", wrappers=(ddp(backend="cpu:gloo,cuda:nccl"),)))
    assert judge("GD604", data).verdict == Verdict.FINE
    ranks = tuple(rank_trace(r, 2, [20.0] * 5, [5.0] * 5, gpu=True, backend="nccl",
                             name="ncclDevKernel_AllReduce") for r in range(2))
    assert judge("GD604", run(metrics=ranks)).verdict == Verdict.FINE
    cpu = run(manifest=cpu_manifest(world_size=2), settings=settings(device_type="cpu", wrappers=(ddp(backend="gloo"),)),
              metrics=tuple(rank_trace(r, 2, [20.0] * 5, [5.0] * 5) for r in range(2)))
    assert judge("GD604", cpu).verdict == Verdict.NOT_APPLICABLE


# ---------------------------------------------------------------- GD605 find-unused-parameters


def test_gd605_fires_when_nothing_is_unused():
    w = ddp(find_unused_parameters=True, unused_parameter_size=0, unused_parameter_checks=11)
    (f,) = judge("GD605", run(settings=settings(wrappers=(w,)))).findings
    assert "find_unused_parameters=True at train.py:31 but DDP found no unused parameter on 11 iteration(s)" in f.message
    assert "find_unused_parameters=True" in f.fix.before and "find_unused_parameters" not in f.fix.after.splitlines()[0]
    assert f.gain.share_pct is None and str(f.location) == "train.py:31"


def test_gd605_quiet_when_needed_off_or_static():
    used = ddp(find_unused_parameters=True, unused_parameter_size=16640, unused_parameter_checks=11)
    res = judge("GD605", run(settings=settings(wrappers=(used,))))
    assert res.verdict == Verdict.FINE and "16.2 KiB" in res.reason
    assert judge("GD605", run(settings=settings(wrappers=(ddp(),)))).verdict == Verdict.FINE
    static = ddp(find_unused_parameters=True, static_graph=True, unused_parameter_size=0)
    assert judge("GD605", run(settings=settings(wrappers=(static,)))).verdict == Verdict.FINE
    unknown = ddp(find_unused_parameters=True)
    assert judge("GD605", run(settings=settings(wrappers=(unknown,)))).verdict == Verdict.CANNOT_JUDGE
    assert judge("GD605", run(settings=settings())).verdict == Verdict.NOT_APPLICABLE
    assert judge("GD605", run(metrics=(trace(),))).verdict == Verdict.NOT_APPLICABLE
