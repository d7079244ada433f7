"""Transfers (direction, memory kind, blocking) and kernel statistics on hand-built timelines."""

from __future__ import annotations

import pytest

from gpudoctor.analysis.kernels import kernel_stats
from gpudoctor.analysis.names import memcpy_kind
from gpudoctor.analysis.transfers import transfer_stats
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.metrics import WindowKind
from gpudoctor.model.trace import DeviceKind as D
from gpudoctor.model.trace import HostKind as H
from gpudoctor.model.trace import TimelineBuilder

US = 1000


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("Memcpy HtoD (Pageable -> Device)", ("HtoD", "pageable")),
        ("Memcpy HtoD (Pinned -> Device)", ("HtoD", "pinned")),
        ("Memcpy DtoH (Device -> Pageable)", ("DtoH", "pageable")),
        ("Memcpy DtoH (Device -> Pinned)", ("DtoH", "pinned")),
        ("Memcpy DtoD (Device -> Device)", ("DtoD", "device")),
        ("Memcpy HtoD (Host -> Device)", ("HtoD", "unknown")),  # ROCm
        ("Memset (Device)", ("memset", "device")),
        ("Memset (Unknown)", ("memset", "unknown")),
    ],
)
def test_memcpy_names(name, want):
    assert memcpy_kind(name) == want


def _copy(b, ts, corr, name, nbytes, call="cudaMemcpyAsync", dur=50, thread="0/0"):
    b.add_host(H.RUNTIME, call, ts * US, 10 * US, correlation=corr, thread=thread)
    b.add_device(D.MEMCPY, name, (ts + 12) * US, dur * US, correlation=corr, nbytes=nbytes)


def test_transfers_per_direction_and_kind_with_blocking():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 1000 * US)
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#2", 1000 * US, 1000 * US)
    # step 1: a pageable H2D followed by a sync (blocking), a pinned one followed by a launch
    _copy(b, 10, 1, "Memcpy HtoD (Pageable -> Device)", 4_000_000)
    b.add_host(H.RUNTIME, "cudaStreamSynchronize", 30 * US, 40 * US, correlation=2)
    _copy(b, 100, 3, "Memcpy HtoD (Pinned -> Device)", 1_000_000)
    b.add_host(H.RUNTIME, "cudaLaunchKernel", 120 * US, 5 * US, correlation=4)
    b.add_host(H.RUNTIME, "cudaStreamSynchronize", 130 * US, 5 * US, correlation=5)  # after a launch: not the copy's
    # step 2: a synchronous D2H
    _copy(b, 1100, 6, "Memcpy DtoH (Device -> Pageable)", 8, call="cudaMemcpy")
    # outside the steps: not counted
    _copy(b, 5000, 7, "Memcpy HtoD (Pageable -> Device)", 4)
    stats = {(t.direction, t.memory_kind): t for t in transfer_stats(TraceView(b.build()))}
    assert set(stats) == {("HtoD", "pageable"), ("HtoD", "pinned"), ("DtoH", "pageable")}
    p = stats[("HtoD", "pageable")]
    assert (p.count, p.bytes, p.dur_ns, p.blocking_count) == (1, 4_000_000, 50 * US, 1)
    assert p.bandwidth_gbps == pytest.approx(4_000_000 / (50 * US))
    assert p.blocking_dur_ns == 50 * US  # the async call (10) + the sync after it (40)
    assert p.per_step_count == 0.5 and p.steps_with == 1
    assert stats[("HtoD", "pinned")].blocking_count == 0
    d = stats[("DtoH", "pageable")]
    assert d.blocking_count == 1 and d.blocking_dur_ns == 10 * US and d.max_bytes == 8


def test_transfers_without_steps_count_the_whole_trace():
    b = TimelineBuilder()
    for i in range(3):
        _copy(b, 100 * i, i + 1, "Memcpy HtoD (Pageable -> Device)", 10)
    (t,) = transfer_stats(TraceView(b.build()))
    assert t.count == 3 and t.per_step_count is None and t.steps_with is None


def _kernel(b, ts, corr, name, dur, *, ext=-1, launch="cudaLaunchKernel", launch_dur=4):
    b.add_host(H.RUNTIME, launch, ts * US, launch_dur * US, correlation=corr, external_id=ext)
    b.add_device(D.KERNEL, name, (ts + 10) * US, dur * US, correlation=corr, external_id=ext)


def test_kernel_stats_distribution_launch_ratio_and_tensor_cores():
    b = TimelineBuilder()
    _kernel(b, 0, 1, "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_tn", 100)  # Tensor Cores
    _kernel(b, 200, 2, "void at::native::vectorized_elementwise_kernel<4>", 4)
    _kernel(b, 300, 3, "void at::native::vectorized_elementwise_kernel<4>", 6)
    _kernel(b, 400, 4, "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", 50)  # TF32 on Tensor Cores
    k = kernel_stats(TraceView(b.build()))
    assert k.count == 4 and k.total_ns == 160 * US and k.max_ns == 100 * US
    assert k.under_10us_pct == 50.0
    assert k.p50_ns in (6 * US, 50 * US) and k.p90_ns == 100 * US
    assert k.launch_count == 4 and k.launch_total_ns == 16 * US
    assert k.launch_to_kernel_ratio == pytest.approx(16 / 160, abs=1e-4)
    assert k.median_launch_delay_ns == 10 * US
    assert k.tensor_core_ns == 150 * US and k.tensor_core_pct == pytest.approx(93.75)
    assert k.tf32_kernel_ns == 50 * US
    assert k.top[0].name.startswith("ampere_fp16") and k.top[1].count == 1
    assert k.window == WindowKind.TRACE
    assert not k.eligible_dtypes_known and k.fp32_eligible_pct_of_gpu is None


def test_fp32_eligible_ops_need_shapes_and_follow_the_launching_op():
    b = TimelineBuilder()
    b.add_host(H.CPU_OP, "aten::addmm", 0, 50 * US, external_id=10,
               input_dims="[[512], [64, 256], [256, 512]]", input_types='["float", "float", "float"]')
    _kernel(b, 5, 1, "ampere_sgemm_128x64_nn", 40, ext=10)
    b.add_host(H.CPU_OP, "aten::mm", 100 * US, 50 * US, external_id=11,
               input_dims="[[64, 256], [256, 512]]", input_types='["c10::BFloat16", "c10::BFloat16"]')
    _kernel(b, 105, 2, "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 20, ext=11)
    b.add_host(H.CPU_OP, "aten::relu", 200 * US, 50 * US, external_id=12,
               input_dims="[[64, 512]]", input_types='["float"]')
    _kernel(b, 205, 3, "elementwise", 40, ext=12)
    k = kernel_stats(TraceView(b.build()))
    assert k.eligible_dtypes_known
    assert k.fp32_eligible_op_ns == 40 * US and k.fp32_eligible_op_count == 1
    assert k.fp32_eligible_pct_of_gpu == pytest.approx(40.0)
    assert k.fp32_eligible_tensor_core_ns == 0


def test_optimizer_kernels_per_step_and_step_window():
    b = TimelineBuilder()
    for n, start in ((1, 0), (2, 1000)):
        b.add_host(H.USER_ANNOTATION, f"ProfilerStep#{n}", start * US, 1000 * US)
        b.add_host(H.USER_ANNOTATION, "Optimizer.step#Adam.step", (start + 500) * US, 300 * US)
        for j in range(3):
            _kernel(b, start + 510 + 50 * j, n * 10 + j, "multi_tensor_apply_kernel", 5)
        _kernel(b, start + 100, n * 10 + 9, "forward_kernel", 5)
    _kernel(b, 5000, 99, "outside", 5)
    k = kernel_stats(TraceView(b.build()))
    assert k.count == 8 and k.window == WindowKind.STEPS
    assert k.optimizer_kernels_per_step == 3.0


def test_a_sync_on_another_thread_does_not_make_a_copy_blocking():
    b = TimelineBuilder()
    _copy(b, 10, 1, "Memcpy HtoD (Pinned -> Device)", 100, thread="1/1")
    b.add_host(H.RUNTIME, "cudaStreamSynchronize", 30 * US, 40 * US, correlation=2, thread="1/2")
    (t,) = transfer_stats(TraceView(b.build()))
    assert t.blocking_count == 0 and t.blocking_dur_ns == 0


def test_simt_kernels_are_not_tensor_core_kernels_whatever_their_prefix():
    """cuBLAS names its FP32 SIMT GEMMs like its Tensor Core ones ("sm80_xmma_gemm_…"): "ffma" (and
    CUTLASS's "simt") say they run on the FP32 units, unless the name also names a Tensor Core type."""
    from gpudoctor.analysis.names import NameClasses

    names = (
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize256x64x8_stage3_warpsize2x2x1_ffma",  # a real H200 trace's
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(cutlass_80_simt_sgemm_256x128_8x4_nt_align1::Params)",
        "sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x64x32",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT",
        "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",
    )
    assert NameClasses(names).tensor_core.tolist() == [False, False, True, True, True]
