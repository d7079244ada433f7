"""GD405 below-roofline, on hand-built Kineto timelines analysed end to end (analysis.analyze_trace →
the rule), and on the public traces of ../shared/traces."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rule_builders import SITE, WrapSetting, judge, run, settings

from gpudoctor.analysis import analyze_trace
from gpudoctor.config import Config, Thresholds
from gpudoctor.engine import diagnose
from gpudoctor.model import DeviceInfo, Severity
from gpudoctor.model.metrics import Component
from gpudoctor.model.trace import DeviceKind, HostKind, TimelineBuilder, TraceInfo
from gpudoctor.parse import load_inputs
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.results import Verdict

US = 1_000
MS = 1_000_000
A100 = DeviceInfo(0, "NVIDIA A100-SXM4-80GB", "8.0", 80 * 2**30)
V100 = DeviceInfo(0, "Tesla V100-SXM2-16GB", "7.0", 16 * 2**30)
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >"


def gemm_trace(*, dtype: str = '"float"', kernel: str = "volta_sgemm_128x64_nn", device: DeviceInfo = A100,
               old_style: bool = False):
    """One 10 ms step whose 8 ms GEMM kernel computes a 4096³ matmul (17 TFLOP/s)."""
    b = TimelineBuilder("gemm.pt.trace.json")
    b.add_host(HostKind.USER_ANNOTATION, "ProfilerStep#1", 0, 10 * MS)
    b.add_host(HostKind.CPU_OP, "aten::mm", 100 * US, 500 * US, external_id=2, input_dims="[[4096, 4096], [4096, 4096]]",
               input_types=f"[{dtype}, {dtype}]")
    ext = 77 if old_style else 2
    b.add_host(HostKind.RUNTIME, "cudaLaunchKernel", 200 * US, 10 * US, correlation=77, external_id=ext)
    b.add_device(DeviceKind.KERNEL, kernel, 300 * US, 8 * MS, correlation=77, external_id=ext)
    return analyze_trace(b.build(TraceInfo(platform="cuda", devices=(device,), record_shapes=True, event_count=4)))


def chain_trace(n: int = 10, us: int = 500, sizes: tuple[int, ...] = (1048576,)):
    """One 10 ms step with ``n`` back-to-back elementwise kernels (aten::add of 1M floats each; with
    ``sizes``, the i-th op adds tensors of ``sizes[i % len(sizes)]`` elements)."""
    b = TimelineBuilder("chain.pt.trace.json")
    b.add_host(HostKind.USER_ANNOTATION, "ProfilerStep#1", 0, 10 * MS)
    t = 100 * US
    for i in range(n):
        size = sizes[i % len(sizes)]
        b.add_host(HostKind.CPU_OP, "aten::add", t, 10 * US, external_id=i + 1, input_dims=f"[[{size}], [{size}], []]",
                   input_types='["float", "float", "Scalar"]')
        b.add_host(HostKind.RUNTIME, "cudaLaunchKernel", t + 2 * US, 5 * US, correlation=100 + i, external_id=i + 1)
        b.add_device(DeviceKind.KERNEL, EW, 200 * US + i * us * US, us * US, correlation=100 + i, external_id=i + 1)
        t += 15 * US
    return analyze_trace(b.build(TraceInfo(platform="cuda", devices=(A100,), record_shapes=True, event_count=3 * n)))


def _claims(f) -> dict[str, int]:
    return {c.component: c.requested_ns for c in f.gain.claims}


def test_fires_on_compute_bound_fp32_matmuls_far_below_the_tensor_core_peak():
    m = gemm_trace()
    res = judge("GD405", run(metrics=(m,)))
    (f,) = res.findings
    assert res.verdict == Verdict.FIRED and f.severity == Severity.ERROR
    assert "compute-bound FP32 matmul at 17.2 TFLOP/s" in f.message
    assert "5.5% of the A100 SXM4 80GB's BF16/FP16 Tensor Core peak (312 TFLOP/s)" in f.message
    assert "torch.bfloat16" in f.fix.after and "GD401's fix" in f.fix.instruction and "GD402's fix" in f.fix.instruction
    # the headline of the precision-capped time: GD401 and GD402 claim it, this finding heads it
    assert _claims(f) == {} and f.gain.heads == (Component.GPU_FP32_MATMUL.value,)
    assert f.gain.expected_fraction == pytest.approx(2 / 3, abs=1e-3)  # min(312 / 19.5, 3) = 3x
    assert f.gain.share_pct == pytest.approx(80.0)


def test_pytorch_1_traces_file_their_fp32_matmuls_through_the_launch_call():
    """PyTorch 1.x kernels carry only their correlation id: the ledger finds their op around the launch
    call (TraceView.eligible_op_of), so their time is FP32 matmul there too, and GD405 heads it as such."""
    (f,) = judge("GD405", run(metrics=(gemm_trace(old_style=True),))).findings
    assert f.gain.heads == (Component.GPU_FP32_MATMUL.value,)
    assert f.gain.share_pct == pytest.approx(80.0)


def test_tf32_work_is_told_to_use_amp_only():
    (f,) = judge("GD405", run(metrics=(gemm_trace(kernel="cutlass_80_tensorop_s1688gemm_64x64_nn"),))).findings
    assert "compute-bound TF32 matmul" in f.message and "GD402" not in f.fix.instruction
    assert f.gain.expected_fraction == pytest.approx(0.5, abs=1e-3)  # 312 / 156 = 2x


def test_volta_gets_float16_with_a_grad_scaler():
    (f,) = judge("GD405", run(metrics=(gemm_trace(device=V100),))).findings
    assert "torch.float16" in f.fix.after and "GradScaler" in f.fix.after
    assert "Tesla V100 SXM2" in f.message


def test_silent_on_bf16_work_and_below_the_share_threshold():
    res = judge("GD405", run(metrics=(gemm_trace(dtype='"c10::BFloat16"', kernel="ampere_bf16_s16816gemm"),)))
    assert res.verdict == Verdict.FINE and "bf16" in res.reason
    res = judge("GD405", run(metrics=(gemm_trace(),)), roofline_fp32_share_pct=90.0)
    assert res.verdict == Verdict.FINE and "threshold 90%" in res.reason


def test_an_unknown_device_cannot_be_compared_with_its_peak():
    res = judge("GD405", run(metrics=(gemm_trace(device=DeviceInfo(0, "NVIDIA GeForce GTX 1080", "6.1")),)))
    assert res.verdict == Verdict.FINE and not res.findings  # the chains part looked; the FP32 part could not
    assert "not in the table of GPU peaks" in res.reason


def test_fires_on_elementwise_chains_with_torch_compile_as_the_fix():
    res = judge("GD405", run(metrics=(chain_trace(),)))
    (f,) = res.findings
    assert "50.0% of step time runs in 1 chains" in f.message and "10 kernels" in f.message
    assert "torch.compile(model)" in f.fix.instruction and "torch.compile" in f.fix.after
    assert _claims(f) == {Component.GPU_COMPUTE.value: 5 * MS}
    assert f.gain.expected_fraction == pytest.approx(0.9)  # fused: the longest of ten equal kernels


def test_compiled_code_is_told_to_look_for_graph_breaks_not_to_compile():
    s = settings(wrappers=(WrapSetting("torch.compile", SITE, module="Net", options={"mode": "default"}),))
    (f,) = judge("GD405", run(metrics=(chain_trace(),), settings=s)).findings
    assert "graph breaks" in f.fix.instruction and "Compile the model" not in f.fix.instruction
    assert f.evidence.settings[0].name == "torch.compile"


def test_kernels_on_tensors_of_other_sizes_are_no_chain():
    """Back to back on one stream but not producer and consumer: an op on 1M elements next to one on
    64M (autocast's weight casts beside an activation) shares no tensor, and fusing them saves no
    traffic. Alternating sizes break every run; pairs of one size make runs of two, under the three a
    chain needs; runs of three of one size are chains again."""
    res = judge("GD405", run(metrics=(chain_trace(sizes=(1048576, 67108864)),)))
    assert res.verdict == Verdict.FINE and "no runs of 3+" in res.reason
    m = chain_trace(n=6, sizes=(1048576,) * 3 + (67108864,) * 3)
    assert m.roofline is not None and m.roofline.chains == 2 and m.roofline.chain_kernels == 6


def test_short_chains_are_no_finding():
    res = judge("GD405", run(metrics=(chain_trace(n=2),)))
    assert res.verdict == Verdict.FINE and "no runs of 3+" in res.reason


# --------------------------------------------------------------------------- the public traces


def _shared(shared_traces: Path) -> list[Path]:
    return sorted(p for p in shared_traces.glob("*/*.json.gz"))


def _metrics(path: Path):
    loaded = load_inputs([path])
    return dataclasses.replace(loaded.run, metrics=tuple(analyze_trace(t, loaded.run) for t in loaded.timelines))


@pytest.mark.shared_traces
def test_on_the_public_traces_it_fires_exactly_when_its_figures_pass_the_thresholds(shared_traces):
    t = Thresholds()
    for path in _shared(shared_traces):
        data = _metrics(path)
        rep = diagnose(data, Config(), "analyze")
        mine = [f for f in rep.findings if f.code == "GD405"]
        ctx = RuleContext(data, t)
        for m in data.metrics:
            r = m.roofline
            if r is None:
                continue
            chain_share = ctx.trace_share(m, r.chain_ns) or 0.0
            chained = any("chains of back-to-back" in f.message for f in mine)
            assert chained == (chain_share >= t.elementwise_chain_share_pct), (path.name, chain_share)
            for f in mine:
                assert f.gain.claims and f.gain.share_pct is not None, path.name
        if "qwen3" in path.name or "h800" in path.name:
            assert not mine, (path.name, [f.message for f in mine])
