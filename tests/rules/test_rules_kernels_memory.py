"""GD401–GD404 (kernels and precision) and GD501–GD502 (GPU memory)."""

from __future__ import annotations

import pytest
from rule_builders import (
    GB,
    MS,
    SITE,
    AutocastUse,
    FlagSetting,
    MemoryStats,
    OptimizerSetting,
    Samples,
    gpu_samples,
    judge,
    kernels,
    manifest,
    run,
    settings,
    trace,
)

from gpudoctor.model import Device, DeviceInfo, Severity
from gpudoctor.rules.results import Verdict

V100 = (DeviceInfo(0, "Tesla V100-SXM2-16GB", "7.0", 16 * GB),)
P100 = (DeviceInfo(0, "Tesla P100", "6.0", 16 * GB),)

# ---------------------------------------------------------------- GD401 no-amp


def _fp32(**kw):
    return kernels(eligible_dtypes_known=True, fp32_eligible_pct_of_gpu=70.0, tensor_core_pct=0.0, **kw)


def test_gd401_fires_with_bf16_on_ampere():
    (f,) = judge("GD401", run(metrics=(trace(kernels=_fp32()),))).findings
    assert "70.0%" in f.message and "compute capability 8" in f.message
    assert "torch.bfloat16" in f.fix.after and "GradScaler" not in f.fix.after
    assert "torch.cuda.amp" not in f.fix.after
    assert round(f.gain.share_pct) == 56  # 70% of 40 ms kernel time in a 50 ms window


def test_gd401_fp16_with_grad_scaler_on_volta():
    (f,) = judge("GD401", run(metrics=(trace(kernels=_fp32(), devices=V100),))).findings
    assert "torch.float16" in f.fix.after and 'torch.amp.GradScaler("cuda")' in f.fix.after


def test_gd401_quiet_when_tensor_cores_run():
    m = trace(kernels=kernels(eligible_dtypes_known=True, fp32_eligible_pct_of_gpu=5.0, tensor_core_pct=60.0))
    assert judge("GD401", run(metrics=(m,))).verdict == Verdict.FINE


def test_gd401_applied_when_autocast_in_settings():
    s = settings(autocast=(AutocastUse(SITE, "cuda", "torch.bfloat16"),))
    res = judge("GD401", run(metrics=(trace(kernels=_fp32()),), settings=s))
    assert res.verdict == Verdict.FINE and "autocast" in res.reason


def test_gd401_not_applicable_before_volta():
    assert judge("GD401", run(metrics=(trace(kernels=_fp32(), devices=P100),))).verdict == Verdict.NOT_APPLICABLE


def test_gd401_cannot_judge_without_dtypes():
    m = trace(kernels=kernels(eligible_dtypes_known=False))
    res = judge("GD401", run(metrics=(m,)))
    assert res.verdict == Verdict.CANNOT_JUDGE and "shapes" in res.reason


TURING = (DeviceInfo(0, "NVIDIA GeForce RTX 2080 Ti", "7.5", 11 * GB),)


def _named(*pairs):
    from gpudoctor.model.metrics import NameStat

    return tuple(NameStat(n, 10, int(ms * MS)) for n, ms in pairs)


def test_gd401_reads_fp32_gemm_and_conv_from_kernel_names_without_dtypes():
    """A bare trace without shapes (the kineto samples'): sgemm and scudnn kernels lead, no Tensor
    Core kernel runs on a Turing GPU, which has FP16 Tensor Cores: inferred, not 'cannot judge'."""
    top = _named(("volta_sgemm_64x64_nt", 10.0), ("cudnn_volta_scudnn_winograd_128x128_ldg1_ldg4_relu", 6.0),
                 ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(...)", 4.0),
                 ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", 8.0))
    m = trace(kernels=kernels(eligible_dtypes_known=False, tensor_core_pct=0.0, top=top), devices=TURING)
    (f,) = judge("GD401", run(metrics=(m,))).findings
    assert f.confidence.value == "inferred" and "50.0% of GPU kernel time is FP32 conv/matmul" in f.message
    assert "torch.float16" in f.fix.after and any("kernels' names" in n for n in f.evidence.notes)
    # half-precision kernels by name are not FP32; below the threshold it still cannot judge
    half = _named(("volta_h884gemm_64x64_ldg8_nn", 20.0), ("volta_sgemm_64x64_nt", 2.0))
    m2 = trace(kernels=kernels(eligible_dtypes_known=False, tensor_core_pct=0.0, top=half), devices=TURING)
    res = judge("GD401", run(metrics=(m2,)))
    assert res.verdict == Verdict.CANNOT_JUDGE and "5.0% of kernel time in FP32 GEMM/conv kernels by name" in res.reason


@pytest.mark.shared_traces
def test_gd401_on_the_rtx2080ti_kineto_trace(shared_traces):
    """The kineto sample's ResNet-50 on an RTX 2080 Ti: torch-tb-profiler recommends the DataLoader,
    then AMP; so does gpudoctor, AMP inferred from the sgemm/scudnn kernels."""
    import dataclasses

    from gpudoctor.analysis import analyze_trace
    from gpudoctor.config import Config
    from gpudoctor.engine import diagnose
    from gpudoctor.parse import load_inputs

    loaded = load_inputs([shared_traces / "param" / "rtx2080ti_resnet.json.gz"])
    metrics = tuple(analyze_trace(t, loaded.run) for t in loaded.timelines)
    report = diagnose(dataclasses.replace(loaded.run, metrics=metrics), Config(), kind="analyze")
    codes = [f.code for f in report.findings]
    assert codes[:2] == ["GD201", "GD401"], codes
    amp = next(i for i in report.checklist if i.key == "amp")
    assert amp.status.value == "recommended"


# ---------------------------------------------------------------- GD402 tf32-off


def _tf32_settings(allow: bool, precision: str):
    return settings(flags=(
        FlagSetting("torch.backends.cuda.matmul.allow_tf32", allow, None),
        FlagSetting("torch.float32_matmul_precision", precision, None),
    ))


def test_gd402_fires_on_ampere_with_tf32_off():
    m = trace(kernels=_fp32(conv_kernel_ns=0))
    (f,) = judge("GD402", run(metrics=(m,), settings=_tf32_settings(False, "highest"))).findings
    assert "TF32 off" in f.message and "left at the default" in f.message
    assert 'set_float32_matmul_precision("high")' in f.fix.after


def test_gd402_quiet_with_high_precision_setting():
    res = judge("GD402", run(metrics=(trace(kernels=_fp32()),), settings=_tf32_settings(False, "high")))
    assert res.verdict == Verdict.FINE


def test_gd402_not_applicable_on_volta():
    m = trace(kernels=_fp32(), devices=V100)
    assert judge("GD402", run(metrics=(m,), settings=_tf32_settings(False, "highest"))).verdict == Verdict.NOT_APPLICABLE


def test_gd402_cannot_judge_from_a_bare_trace():
    assert judge("GD402", run(metrics=(trace(kernels=_fp32()),))).verdict == Verdict.CANNOT_JUDGE


# ---------------------------------------------------------------- GD403 cudnn-benchmark-off


def _bench(value: bool, call_site=None):
    return settings(flags=(FlagSetting("torch.backends.cudnn.benchmark", value, call_site),))


def test_gd403_fires_on_fixed_shape_convolutions():
    m = trace(kernels=kernels(conv_kernel_ns=20 * MS), conv_shapes_total=20, conv_shapes_max_per_step=20)
    (f,) = judge("GD403", run(metrics=(m,), settings=_bench(False, SITE))).findings
    assert "50.0% of kernel time" in f.message
    assert str(f.location) == "train.py:31"
    assert f.fix.after.startswith("torch.backends.cudnn.benchmark = True")


def test_gd403_not_applicable_when_shapes_vary():
    m = trace(kernels=kernels(conv_kernel_ns=20 * MS), conv_shapes_total=200, conv_shapes_max_per_step=20)
    assert judge("GD403", run(metrics=(m,), settings=_bench(False))).verdict == Verdict.NOT_APPLICABLE


def test_gd403_quiet_when_benchmark_is_on():
    m = trace(kernels=kernels(conv_kernel_ns=20 * MS))
    assert judge("GD403", run(metrics=(m,), settings=_bench(True))).verdict == Verdict.FINE


def test_gd403_not_applicable_without_convolutions():
    m = trace(kernels=kernels(conv_kernel_ns=0))
    assert judge("GD403", run(metrics=(m,), settings=_bench(False))).verdict == Verdict.NOT_APPLICABLE


# ---------------------------------------------------------------- GD404 unfused-optimizer


def _opt(**kw):
    base = dict(call_site=SITE, cls="torch.optim.AdamW", foreach=False, fused=None, supports_fused=True,
                num_params=10**6, num_param_tensors=160)
    base.update(kw)
    return OptimizerSetting(**base)


def test_gd404_fires_on_per_tensor_loop():
    m = trace(kernels=kernels(optimizer_kernels_per_step=1600.0), breakdown_mean_pct={"optimizer": 18.0})
    (f,) = judge("GD404", run(metrics=(m,), settings=settings(optimizers=(_opt(),)))).findings
    assert "1600 kernels per optimizer step for 160 parameter tensors" in f.message
    assert "fused=True" in f.fix.after and f.gain.share_pct == 18.0
    assert f.severity == Severity.WARNING


def test_gd404_quiet_with_foreach():
    m = trace(kernels=kernels(optimizer_kernels_per_step=40.0))
    res = judge("GD404", run(metrics=(m,), settings=settings(optimizers=(_opt(foreach=True),))))
    assert res.verdict == Verdict.FINE


def test_gd404_quiet_when_fused():
    res = judge("GD404", run(metrics=(trace(),), settings=settings(optimizers=(_opt(fused=True),))))
    assert res.verdict == Verdict.FINE


def test_gd404_cannot_judge_without_optimizer_annotations():
    assert judge("GD404", run(metrics=(trace(),))).verdict == Verdict.CANNOT_JUDGE


# ---------------------------------------------------------------- GD501 memory-near-limit


def test_gd501_fires_near_the_limit():
    m = trace(memory=(MemoryStats(0, peak_allocated_bytes=70 * GB, peak_reserved_bytes=76 * GB, total_bytes=80 * GB),))
    (f,) = judge("GD501", run(metrics=(m,))).findings
    assert "95.0%" in f.message and f.gain.share_pct is None
    assert f.severity == Severity.WARNING  # unquantified: memory headroom is not step time


def test_gd501_quiet_with_headroom():
    m = trace(memory=(MemoryStats(0, peak_reserved_bytes=40 * GB, total_bytes=80 * GB),))
    assert judge("GD501", run(metrics=(m,))).verdict == Verdict.FINE


def test_gd501_from_nvml_samples():
    data = run(manifest=manifest(), metrics=(trace(),), samples=Samples(gpu=gpu_samples(90.0, 79 * GB)))
    (f,) = judge("GD501", data).findings
    assert any("NVML" in n for n in f.evidence.notes)


def test_gd501_cannot_judge_without_memory_figures():
    assert judge("GD501", run(metrics=(trace(),))).verdict == Verdict.CANNOT_JUDGE


# ---------------------------------------------------------------- GD502 allocator-churn


def test_gd502_fires_on_malloc_in_steady_steps():
    mem = MemoryStats(0, cuda_malloc_count=40, cuda_free_count=40, empty_cache_count=4,
                      alloc_api_ns=5 * MS, alloc_calls_after_first_step=40)
    s = settings(empty_cache_calls=(SITE,), empty_cache_count=4)
    (f,) = judge("GD502", run(metrics=(trace(memory=(mem,)),), settings=s)).findings
    assert "10.0 cudaMalloc/cudaFree calls per step" in f.message
    assert f.gain.share_pct == 10.0 and str(f.location) == "train.py:31"


def test_gd502_fires_from_settings_alone():
    s = settings(empty_cache_calls=(SITE,), empty_cache_count=20)
    data = run(manifest=manifest(steps_seen=20), settings=s, metrics=(trace(),))
    (f,) = judge("GD502", data).findings
    assert "20 times in 20 steps" in f.message and f.gain.share_pct is None


def test_gd502_quiet_when_the_cache_is_reused():
    mem = MemoryStats(0, cuda_malloc_count=12, alloc_api_ns=MS, alloc_calls_after_first_step=0)
    assert judge("GD502", run(metrics=(trace(memory=(mem,)),))).verdict == Verdict.FINE


def test_gd502_cannot_judge_without_allocator_figures():
    assert judge("GD502", run(metrics=(trace(),))).verdict == Verdict.CANNOT_JUDGE


def test_gpu_rules_name_the_missing_gpu_on_cpu_runs():
    from rule_builders import cpu_manifest, cpu_trace

    data = run(manifest=cpu_manifest(), metrics=(cpu_trace(),), settings=settings(device_type="cpu"))
    # GD103 judges CPU runs too (dispatch-bound, tests/rules/test_rules_gd103_cpu.py)
    for code in ("GD101", "GD102", "GD104", "GD301", "GD302", "GD303", "GD401", "GD402",
                 "GD403", "GD404", "GD501", "GD502", "GD702"):
        res = judge(code, data)
        assert res.verdict == Verdict.CANNOT_JUDGE, code
        assert res.reason == "no GPU in this run", (code, res.reason)


def test_device_from_manifest_when_trace_has_none():
    data = run(manifest=manifest(devices=(Device(0, "Tesla T4", 16 * GB, "7.5"),)),
               metrics=(trace(devices=(), kernels=_fp32()),))
    (f,) = judge("GD401", data).findings
    assert "Tesla T4" in f.message and "torch.float16" in f.fix.after


def test_gd402_recognises_the_fp32_precision_api():
    s = settings(flags=(
        FlagSetting("torch.backends.cuda.matmul.allow_tf32", False, None),
        FlagSetting("torch.float32_matmul_precision", "highest", None),
        FlagSetting("torch.backends.cuda.matmul.fp32_precision", "tf32", SITE),
    ))
    res = judge("GD402", run(metrics=(trace(kernels=_fp32()),), settings=s))
    assert res.verdict == Verdict.FINE and "fp32_precision" in res.reason


def test_gd401_tf32_kernels_of_float32_ops_are_no_mixed_precision():
    """cuDNN's allow_tf32 (on by default) runs float32 convolutions on TF32 Tensor Core kernels: that is
    FP32 work, and GD401 still fires; Tensor Core kernels of other ops are reduced precision."""
    tf32 = kernels(eligible_dtypes_known=True, fp32_eligible_pct_of_gpu=70.0, tensor_core_ns=24 * MS,
                   tensor_core_pct=60.0, fp32_eligible_tensor_core_ns=24 * MS, half_tensor_core_ns=0)
    (f,) = judge("GD401", run(metrics=(trace(kernels=tf32),))).findings
    assert "no half-precision Tensor Core kernels run (0.0%; 60.0% of kernel time runs float32 ops on TF32" in f.message
    half = kernels(eligible_dtypes_known=True, fp32_eligible_pct_of_gpu=40.0, tensor_core_ns=24 * MS,
                   tensor_core_pct=60.0, fp32_eligible_tensor_core_ns=0, half_tensor_core_ns=24 * MS)
    res = judge("GD401", run(metrics=(trace(kernels=half),)))
    assert res.verdict == Verdict.FINE and "reduced precision is in use" in res.reason


def _conv_rows(slow_tflops: float, fast_tflops: float):
    from gpudoctor.model import Roofline, RooflineRow
    from gpudoctor.model.metrics import DevicePeak

    peak = DevicePeak("H200 SXM", 67.0, 494.7, 989.4, 1978.9, 4800.0, "test")
    rows = (RooflineRow("conv", "fp32", 10, 100, 40 * MS, int(slow_tflops * 40e9), 400_000_000, slow_tflops,
                        intensity_flop_per_byte=slow_tflops * 40e9 / 400e6, bound="compute"),
            RooflineRow("conv", "tf32", 10, 100, 10 * MS, int(fast_tflops * 10e9), 100_000_000, fast_tflops,
                        intensity_flop_per_byte=fast_tflops * 10e9 / 100e6, bound="compute"))
    return Roofline(device=0, device_name="NVIDIA H200", peak=peak, rows=rows)


def test_gd403_expects_what_the_run_s_own_fastest_convolutions_reach():
    """Convolutions whose kernels ran at a tenth of the rate this GPU reached on the run's other
    convolutions are expected to reach it once autotuned: 40 ms at 9.3 TFLOP/s against 93 saves 36 ms
    of the 50 ms of convolutions (72%); convolutions that all ran near one rate expect little."""
    from gpudoctor.rules.speedups import autotune_fraction

    slow = _conv_rows(9.3, 93.0)
    fraction, slow_ns, best = autotune_fraction(slow.rows, True, 4800.0)
    assert fraction == pytest.approx(0.72) and slow_ns == 40 * MS and best == 93.0
    assert autotune_fraction(slow.rows, False, 4800.0) is not None  # without TF32: only fp32 rows as a reference
    assert autotune_fraction(slow.rows, False, 4800.0)[0] == 0.0
    even, _, _ = autotune_fraction(_conv_rows(88.0, 93.0).rows, True, 4800.0)
    assert even < 0.05
    m = trace(kernels=kernels(conv_kernel_ns=20 * MS), conv_shapes_total=20, conv_shapes_max_per_step=20, roofline=slow)
    (f,) = judge("GD403", run(metrics=(m,), settings=_bench(False, SITE))).findings
    assert f.gain.expected_fraction == pytest.approx(0.72) and "93.0 TFLOP/s" in f.gain.expected_note
    plain = trace(kernels=kernels(conv_kernel_ns=20 * MS), conv_shapes_total=20, conv_shapes_max_per_step=20)
    (g,) = judge("GD403", run(metrics=(plain,), settings=_bench(False, SITE))).findings
    assert g.gain.expected_fraction == pytest.approx(0.1)  # no reference in the run: the estimate
