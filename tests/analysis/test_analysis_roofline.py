"""analysis.roofline and analysis.peaks: FLOP and byte models, ops → kernels, the table of GPU peaks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpudoctor.analysis import analyze_trace
from gpudoctor.analysis.peaks import ARCH_REFERENCE, GPU_PEAKS, match_device, peak_tflops
from gpudoctor.analysis.roofline import (
    CHAIN_MIN_KERNELS,
    _unique_rows,
    causal_pairs,
    estimate,
    op_class,
    roofline,
)
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.metrics import DeviceInfo
from gpudoctor.model.trace import DeviceKind, HostKind, TimelineBuilder, TraceInfo
from gpudoctor.rules.speedups import PEAK_TFLOPS

US = 1_000
MS = 1_000_000
F32, BF16 = '"float"', '"c10::BFloat16"'
A100 = DeviceInfo(0, "NVIDIA A100-SXM4-80GB", "8.0", 80 * 2**30)
SGEMM = "volta_sgemm_128x64_nn"
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >"


# --------------------------------------------------------------------------- FLOP and byte models


def test_matmul_family():
    w = estimate("aten::mm", [[64, 32], [32, 16]], ["float", "float"])
    assert (w.op_class, w.flops, w.bytes, w.dtype) == ("matmul", 2 * 64 * 32 * 16, (64 * 32 + 32 * 16 + 64 * 16) * 4, "fp32")
    w = estimate("aten::addmm", [[16], [64, 32], [32, 16], [], []], ["c10::BFloat16"] * 3 + ["Scalar", "Scalar"])
    assert w.flops == 2 * 64 * 32 * 16 and w.dtype == "bf16"
    assert w.bytes == (16 + 64 * 32 + 32 * 16 + 64 * 16) * 2
    assert estimate("aten::bmm", [[8, 64, 32], [8, 32, 16]], ["float", "float"]).flops == 8 * 2 * 64 * 32 * 16
    # matmul broadcasts its batch dims; a vector operand is one row / column
    assert estimate("aten::matmul", [[4, 1, 64, 32], [3, 32, 16]], ["c10::Half"] * 2).flops == 12 * 2 * 64 * 32 * 16
    assert estimate("aten::matmul", [[32], [32, 16]], ["float"] * 2).flops == 2 * 32 * 16
    # linear: every leading dim of the input is a row; the weight is [out, in]
    w = estimate("aten::linear", [[4, 128, 512], [2048, 512], [2048]], ["c10::BFloat16"] * 3)
    assert w.flops == 2 * 4 * 128 * 512 * 2048
    assert estimate("aten::mv", [[64, 32], [32]], ["float"] * 2).flops == 2 * 64 * 32
    # fp8 scaled mm: the first two operands, in their own precision
    w = estimate("aten::_scaled_mm", [[64, 32], [32, 16], [], []], ["c10::Float8_e4m3fn"] * 2 + ["float", "float"])
    assert w.flops == 2 * 64 * 32 * 16 and w.dtype == "fp8"


@pytest.mark.parametrize("name,dims", [
    ("aten::mm", [[64, 32], [31, 16]]),  # inner dims differ
    ("aten::mm", [[8, 64, 32], [32, 16]]),  # mm is 2-D only
    ("aten::linear", [[4, 512], [2048, 511]]),
    ("aten::mm", [[64, 32]]),  # a missing operand
])
def test_matmul_shapes_that_do_not_fit_give_no_estimate(name, dims):
    assert estimate(name, dims, ["float"] * len(dims)) is None


def test_forward_convolution_needs_stride_and_padding():
    dims = [[10, 256, 14, 14], [512, 256, 3, 3], [], [], [], [], []]
    types = ["c10::BFloat16", "c10::BFloat16", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"]
    w = estimate("aten::conv2d", dims, types, ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"])
    out = (14 + 2 - 2 - 1) // 2 + 1  # 7
    assert out == 7 and w.flops == 2 * 10 * out * out * 512 * 256 * 3 * 3 and w.op_class == "conv"
    assert w.bytes == (10 * 256 * 14 * 14 + 512 * 256 * 9 + 10 * 512 * 7 * 7) * 2
    # without Concrete Inputs (PyTorch 1.x) the output size is unknown
    assert estimate("aten::conv2d", dims, types) is None
    # cuDNN / MIOpen take padding before stride; MIOpen has a bias argument first
    miopen = estimate("aten::miopen_convolution", dims[:2] + [[]] * 7, types[:2] + [""] * 7,
                      ["", "", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False"])
    cudnn = estimate("aten::cudnn_convolution", dims[:2] + [[]] * 7, types[:2] + [""] * 7,
                     ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"])
    assert miopen.flops == cudnn.flops == w.flops
    # padding="same" keeps the spatial size; groups live in the weight's shape
    same = estimate("aten::conv2d", [[2, 64, 32, 32], [64, 1, 3, 3]], ["float", "float"],
                    ["", "", "", "[1, 1]", "same", "[1, 1]", "64"])
    assert same.flops == 2 * 2 * 32 * 32 * 64 * 1 * 9


def test_convolution_backward_counts_the_gradients_asked_for():
    dims = [[10, 512, 7, 7], [10, 256, 14, 14], [512, 256, 3, 3]] + [[]] * 8
    types = ["float"] * 3 + [""] * 8
    forward = 2 * 10 * 7 * 7 * 512 * 256 * 9
    both = estimate("aten::convolution_backward", dims, types)  # no Concrete Inputs: both gradients
    assert both.flops == 2 * forward
    concrete = ["", "", "", "[0]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[False, True, False]"]
    assert estimate("aten::convolution_backward", dims, types, concrete).flops == forward  # the weight's only


def test_transposed_convolution_needs_only_its_input():
    w = estimate("aten::conv_transpose2d", [[2, 64, 8, 8], [64, 32, 4, 4]], ["float", "float"])
    assert w.flops == 2 * 2 * 8 * 8 * 64 * 32 * 16


def test_attention():
    q = [8, 16, 4096, 128]
    types = ["c10::BFloat16"] * 3 + ["Scalar"] * 4
    full = estimate("aten::_scaled_dot_product_flash_attention", [q, q, q, [], [], [], []], types,
                    ["", "", "", "0.", "False", "False", "0.088"])
    assert full.flops == 2 * 8 * 16 * 4096 * 4096 * (128 + 128) and full.op_class == "attention"
    causal = estimate("aten::_scaled_dot_product_flash_attention", [q, q, q, [], [], [], []], types,
                      ["", "", "", "0.", "True", "False", "0.088"])
    assert causal.flops == 2 * 8 * 16 * (4096 * 4097 // 2) * 256
    sdpa = estimate("aten::scaled_dot_product_attention", [q, q, q], types[:3])
    assert sdpa.flops == full.flops
    back = estimate("aten::_scaled_dot_product_efficient_attention_backward", [q, q, q, q, [], q] + [[]] * 7,
                    ["c10::BFloat16"] * 4 + [""] + ["c10::BFloat16"] + [""] * 7)
    assert back.flops == 2 * full.flops  # model FLOPs: twice the forward
    assert causal_pairs(4, 4) == 10 and causal_pairs(2, 5) == 3 and causal_pairs(5, 2) == 3 + 3 * 2


def test_elementwise_bytes_read_and_written_once():
    add = estimate("aten::add", [[1024, 1024], [1024], []], ["float", "float", "Scalar"])
    assert add.op_class == "elementwise" and add.bytes == (1024 * 1024 + 1024) * 4 + 1024 * 1024 * 4
    assert estimate("aten::fill_", [[256], []], ["c10::Half", "Scalar"]).bytes == 256 * 2  # written only
    assert estimate("aten::copy_", [[256], [256], []], ["c10::Half", "float", ""]).bytes == 256 * 4 + 256 * 2
    assert op_class("aten::relu_") == "elementwise" and op_class("aten::softmax") is None
    assert op_class("aten::cudnn_convolution") == "conv" and op_class("aten::linear") == "matmul"


# --------------------------------------------------------------------------- the table of peaks


@pytest.mark.parametrize("name,entry", [
    ("Tesla V100-SXM2-16GB", "Tesla V100 SXM2"),
    ("Tesla V100-PCIE-32GB", "Tesla V100 PCIe"),
    ("Tesla T4", "Tesla T4"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("NVIDIA A100-PG509-200", "A100 40GB"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H800", "H800 SXM"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA GeForce RTX 2080 Ti", "GeForce RTX 2080 Ti"),
    ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090"),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
    ("AMD Instinct MI250X", "Instinct MI250X (one GCD)"),
    ("AMD Instinct MI300X", "Instinct MI300X"),
])
def test_devices_are_matched_by_name(name, entry):
    assert match_device(name).name == entry


@pytest.mark.parametrize("name", ["NVIDIA L40S", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GH200 480GB",
                                  "NVIDIA GeForce GTX 1080", ""])
def test_other_devices_are_unknown_not_guessed(name):
    assert match_device(name) is None


def test_a_rocm_gcd_without_a_name_is_matched_by_architecture_and_memory():
    assert match_device("AMD Radeon Graphics", "9.0", 68_702_699_520).name == "Instinct MI250/MI210 (one GCD)"
    assert match_device("AMD Radeon Graphics", "9.0", 32 * 2**30) is None  # an MI100 has 32 GB
    assert match_device("AMD Radeon Graphics") is None


def test_every_entry_is_sourced_and_ordered():
    for _, p in GPU_PEAKS:
        assert p.source and p.memory_gbps > 0 and 0 < p.fp32_tflops < p.half_tflops
        assert p.tf32_tflops is None or p.fp32_tflops <= p.tf32_tflops <= p.half_tflops
        assert p.fp8_tflops is None or p.fp8_tflops == pytest.approx(2 * p.half_tflops, rel=0.01)
    h100 = match_device("NVIDIA H100 80GB HBM3")
    assert peak_tflops(h100, "bf16") == peak_tflops(h100, "fp16") == 989.4
    assert peak_tflops(h100, "fp64") is None and peak_tflops(None, "bf16") is None
    assert peak_tflops(match_device("Tesla V100-SXM2-16GB"), "tf32") is None


def test_the_speedup_models_read_the_same_table():
    for arch, p in ARCH_REFERENCE.items():
        assert PEAK_TFLOPS[arch] == (p.fp32_tflops, p.tf32_tflops, p.half_tflops)
    assert PEAK_TFLOPS["8.0"] == (19.5, 156.0, 312.0)


# --------------------------------------------------------------------------- ops → kernels


def _timeline(*, dtype: str = F32, kernel_us: int = 8000, kernel: str = SGEMM, old_style: bool = False,
              device: DeviceInfo | None = A100, shapes: bool = True, n: int = 4096, graph: bool = False):
    """One 10 ms step: ``aten::linear`` → ``aten::addmm`` launching one GEMM kernel of an n×n×n matmul.
    ``old_style``: the kernel carries its correlation id as its external id (PyTorch 1.x)."""
    b = TimelineBuilder("gemm.pt.trace.json")
    b.add_host(HostKind.USER_ANNOTATION, "ProfilerStep#1", 0, 10 * MS, thread="1/1")
    dims = f"[[{n}, {n}], [{n}, {n}], [{n}]]" if shapes else None
    b.add_host(HostKind.CPU_OP, "aten::linear", 100 * US, 800 * US, thread="1/1", external_id=1, input_dims=dims,
               input_types=f"[{dtype}, {dtype}, {dtype}]" if shapes else None)
    b.add_host(HostKind.CPU_OP, "aten::addmm", 150 * US, 700 * US, thread="1/1", external_id=2,
               input_dims=f"[[{n}], [{n}, {n}], [{n}, {n}], [], []]" if shapes else None,
               input_types=f'[{dtype}, {dtype}, {dtype}, "Scalar", "Scalar"]' if shapes else None)
    corr = 77
    ext = corr if old_style else 2
    b.add_host(HostKind.RUNTIME, "cudaGraphLaunch" if graph else "cudaLaunchKernel", 200 * US, 10 * US,
               thread="1/1", correlation=corr, external_id=ext)
    b.add_device(DeviceKind.KERNEL, kernel, 300 * US, kernel_us * US, correlation=corr, external_id=ext)
    info = TraceInfo(platform="cuda", devices=(device,) if device else (), record_shapes=shapes, event_count=5)
    return b.build(info)


def _roofline(tl):
    return roofline(TraceView(tl), None, tl.info.devices)


def test_a_gemm_is_attributed_to_the_innermost_op_and_measured_against_the_peak():
    r = _roofline(_timeline())
    (row,) = r.rows
    flops = 2 * 4096**3
    assert (row.op_class, row.dtype, row.ops, row.kernels, row.top_op) == ("matmul", "fp32", 1, 1, "aten::addmm")
    assert row.estimated_flops == r.estimated_flops == flops  # linear gives way to addmm: counted once
    assert row.achieved_tflops == pytest.approx(flops / 8e-3 / 1e12, rel=1e-3)
    assert row.peak_tflops == 19.5 and row.peak_pct == pytest.approx(100 * flops / 8e-3 / 19.5e12, rel=1e-3)
    assert row.bound == "compute" and row.intensity_flop_per_byte > 19.5e3 / 2039
    assert r.peak.name == "A100 SXM4 80GB" and r.modelled_pct == 100.0 and r.window_ns == 10 * MS
    assert r.mfu_pct == pytest.approx(100 * (flops / 19.5e12) / 10e-3, rel=1e-3)
    assert r.dtype == "fp32" and not r.notes


def test_pytorch_1_traces_tie_kernels_to_ops_through_the_launch_call():
    new, old = _roofline(_timeline()), _roofline(_timeline(old_style=True))
    assert old.rows == new.rows and old.estimated_flops > 0


def test_float32_on_tensor_core_kernels_is_tf32_and_bf16_has_its_own_peak():
    tf32 = _roofline(_timeline(kernel="cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4")).rows[0]
    assert tf32.dtype == "tf32" and tf32.peak_tflops == 156.0
    bf16 = _roofline(_timeline(dtype=BF16, kernel="ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_nn", kernel_us=800))
    assert bf16.rows[0].dtype == "bf16" and bf16.rows[0].peak_tflops == 312.0 and bf16.dtype == "bf16"


def test_graph_launched_kernels_are_not_attributed():
    r = _roofline(_timeline(graph=True))
    assert not r.rows and r.modelled_kernel_ns == 0 and r.kernel_ns == 8 * MS


def test_an_unknown_device_gets_throughput_without_a_share_of_peak():
    r = _roofline(_timeline(device=DeviceInfo(0, "NVIDIA GeForce GTX 1080", "6.1")))
    assert r.peak is None and r.rows[0].achieved_tflops > 0 and r.rows[0].peak_pct is None
    assert r.peak_pct is None and r.mfu_pct is None
    assert any("not in the table of GPU peaks" in n for n in r.notes)
    nameless = _roofline(_timeline(device=None))
    assert any("does not name its GPU" in n for n in nameless.notes)


def test_without_shapes_only_the_kernel_figures():
    r = _roofline(_timeline(shapes=False))
    assert r.rows == () and r.estimated_flops == 0 and r.kernel_ns == 8 * MS
    assert any("no input shapes" in n for n in r.notes)


def test_a_forward_convolution_without_concrete_inputs_is_unmodelled_time():
    b = TimelineBuilder("conv")
    b.add_host(HostKind.CPU_OP, "aten::conv2d", 0, 500 * US, input_dims="[[8, 64, 56, 56], [64, 64, 3, 3]]",
               input_types='["float", "float"]')
    b.add_host(HostKind.RUNTIME, "cudaLaunchKernel", 10 * US, 5 * US, correlation=5)
    b.add_device(DeviceKind.KERNEL, "implicit_convolve_sgemm", 100 * US, 300 * US, correlation=5)
    r = _roofline(b.build(TraceInfo(platform="cuda", devices=(A100,), record_shapes=True)))
    assert r.rows == () and r.unmodelled_ns == 300 * US
    assert any("Concrete Inputs" in n for n in r.notes)


def _chain_timeline(kernels: list[tuple[str, int]], stream_of=lambda i: 7):
    """Kernels back to back (``(name, µs)``), each launched by its own aten::add of 1M floats."""
    b = TimelineBuilder("chain")
    t = 0
    for i, (name, us) in enumerate(kernels):
        b.add_host(HostKind.CPU_OP, "aten::add", t, 20 * US, input_dims="[[1048576], [1048576], []]",
                   input_types='["float", "float", "Scalar"]', external_id=i + 1)
        b.add_host(HostKind.RUNTIME, "cudaLaunchKernel", t + 5 * US, 5 * US, correlation=100 + i, external_id=i + 1)
        b.add_device(DeviceKind.KERNEL, name, t + 30 * US, us * US, correlation=100 + i, external_id=i + 1,
                     stream=stream_of(i))
        t += (30 + us) * US
    return b.build(TraceInfo(platform="cuda", devices=(A100,), record_shapes=True))


def test_elementwise_chains_are_runs_on_one_stream():
    ks = [(EW, 10), (EW, 30), (EW, 20), (SGEMM, 50), (EW, 10), (EW, 10)]
    r = _roofline(_chain_timeline(ks))
    assert CHAIN_MIN_KERNELS == 3
    assert (r.elementwise_kernels, r.chains, r.chain_kernels) == (5, 1, 3)
    assert r.chain_ns == 60 * US and r.chain_fused_ns == 30 * US
    (row,) = [x for x in r.rows if x.op_class == "elementwise"]
    assert row.ops == 6 and row.kernel_ns == 130 * US  # every add's kernels, whatever their names
    assert row.estimated_bytes == 6 * 3 * 1048576 * 4  # two inputs read, one output written, per add
    assert row.achieved_gbps == pytest.approx(row.estimated_bytes / (130 * US), rel=1e-3)
    assert row.bound == "memory" and row.bandwidth_pct == pytest.approx(100 * row.achieved_gbps / 2039, rel=1e-3)
    # the first two on another stream: no stream has three in a row
    split = _roofline(_chain_timeline(ks, stream_of=lambda i: 7 if i < 2 else 8))
    assert split.chains == 0


def test_analyze_trace_carries_the_roofline():
    m = analyze_trace(_timeline())
    assert m.roofline is not None and m.roofline.estimated_flops == 2 * 4096**3
    assert m.roofline.window.value == "steps"
    assert math.isclose(m.roofline.achieved_tflops, 2 * 4096**3 / 8e-3 / 1e12, rel_tol=1e-3)


def test_the_roofline_round_trips_through_json():
    import json

    from gpudoctor.model.metrics import TraceMetrics

    m = analyze_trace(_timeline(kernel="cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4"))
    back = TraceMetrics.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back.roofline == m.roofline and back.roofline.rows[0].dtype == "tf32"


@pytest.mark.parametrize(("rows", "high"), [(5000, 40), (3000, 2**20), (200, 2**31 - 1), (1, 3)])
def test_unique_rows_is_numpy_row_unique(rows, high):
    # ids >= -1 (none); packed where they fit in 62 bits, the row-wise unique beyond (2**31 - 1 in 4 columns)
    rng = np.random.default_rng(rows)
    keys = rng.integers(-1, high, size=(rows, 4)).astype(np.int32)
    keys[::3] = keys[0]  # repeated rows, as ops of one name and shape repeat
    want, want_inv = np.unique(keys, axis=0, return_inverse=True)
    got, got_inv = _unique_rows(keys)
    assert np.array_equal(got, want)
    assert np.array_equal(got_inv, want_inv.reshape(-1))
    assert np.array_equal(got[got_inv], keys)
