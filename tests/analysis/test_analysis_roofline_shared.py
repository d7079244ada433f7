"""The roofline on the public traces of ../shared/traces (skipped when that folder is absent).

The Qwen3-8B prefill+decode trace (SGLang on an MI300X) is matmul-dominated: its achieved TFLOP/s
and share of peak are checked against a hand computation from the raw JSON events (aten::mm ops,
their shapes, and the kernels that carry their external id), not through gpudoctor's own
parser or ops → kernels attribution.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from functools import cache
from pathlib import Path

import pytest

from gpudoctor.analysis import analyze_trace
from gpudoctor.config import Config
from gpudoctor.engine import diagnose
from gpudoctor.model import Report
from gpudoctor.parse import load_inputs

pytestmark = pytest.mark.shared_traces

QWEN = "tracelens/mi300x_sglang_qwen3_prefilldecode.json.gz"
MI300X_BF16_TFLOPS = 1307.4  # AMD Instinct MI300X datasheet: dense BF16 matrix peak
# traces recorded with shapes on A100/H100-class parts (A100, B200, MI300X) whose ops gpudoctor models
WITH_SHAPES = {
    "hta/a100_rank3_of8_trace_diff_control.json.gz": "A100 40GB",
    "hta/a100_rank0_of16_negative_queue.json.gz": "A100 SXM4 80GB",
    "tracelens/b200_eager.json.gz": "B200",
    "tracelens/mi300x_ddp_resnet18.json.gz": "Instinct MI300X",
    "tracelens/mi300x_resnet_act_checkpoint.json.gz": "Instinct MI300X",
    QWEN: "Instinct MI300X",
    "tracelens/mi300x_torch_compile_triton.json.gz": "Instinct MI300X",
}


def _path(shared_traces: Path, name: str) -> Path:
    p = shared_traces / name
    if not p.is_file():
        pytest.skip(f"{name} is not in {shared_traces}")
    return p


@cache
def _report(path: str) -> Report:
    loaded = load_inputs([Path(path)])
    metrics = tuple(analyze_trace(t, loaded.run) for t in loaded.timelines)
    return diagnose(dataclasses.replace(loaded.run, metrics=metrics), Config(), "analyze")


def _stats(rep: Report) -> dict[str, object]:
    return {s.key: s.value for s in rep.summary}


def _hand_figures(path: Path) -> tuple[float, float, float]:
    """(FLOPs, kernel seconds, span seconds) of the trace's aten::mm ops, from the raw events."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        events = json.load(fh)["traceEvents"]
    flops_of: dict[int, int] = {}
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm":
            (m, k), (k2, n) = e["args"]["Input Dims"][:2]
            assert k == k2
            flops_of[e["args"]["External id"]] = 2 * m * k * n
    flops, kernel_us, seen = 0, 0.0, set()
    lo, hi = float("inf"), float("-inf")
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            lo, hi = min(lo, e["ts"]), max(hi, e["ts"] + e["dur"])
        if e.get("cat") == "kernel" and e["args"].get("External id") in flops_of:
            ext = e["args"]["External id"]
            kernel_us += e["dur"]
            if ext not in seen:
                seen.add(ext)
                flops += flops_of[ext]
    assert len(seen) == len(flops_of) == 145  # every mm launched its kernel
    return flops, kernel_us * 1e-6, (hi - lo) * 1e-6


def test_matmul_dominated_trace_against_a_hand_computation(shared_traces):
    path = _path(shared_traces, QWEN)
    flops, kernel_s, span_s = _hand_figures(path)
    tflops = flops / kernel_s / 1e12
    assert 500 < tflops < 520  # 213.4 TFLOP in 420.3 ms of GEMM kernels
    rep = _report(str(path))
    stats = _stats(rep)
    assert stats["roofline_tflops"] == pytest.approx(tflops, rel=1e-3)
    assert stats["roofline_peak_pct"] == pytest.approx(100 * tflops / MI300X_BF16_TFLOPS, rel=1e-3)
    assert stats["mfu"] == pytest.approx(100 * flops / (MI300X_BF16_TFLOPS * 1e12) / span_s, rel=1e-3)
    label = next(s for s in rep.summary if s.key == "roofline_peak_pct")
    assert "MI300X" in label.window and "BF16" in label.window and "1307.4" in label.window
    r = rep.run.metrics[0].roofline
    assert r.dtype == "bf16" and r.rows[0].op_class == "matmul" and r.rows[0].bound == "compute"
    assert r.modelled_pct > 80  # matmul-dominated: 85% of kernel time


@pytest.mark.parametrize("name", sorted(WITH_SHAPES))
def test_summary_reports_throughput_and_share_of_peak(shared_traces, name):
    rep = _report(str(_path(shared_traces, name)))
    stats = _stats(rep)
    r = rep.run.metrics[0].roofline
    assert r.peak is not None and r.peak.name == WITH_SHAPES[name]
    assert stats["roofline_tflops"] > 0 and 0 < stats["roofline_peak_pct"] < 100
    if r.modelled_pct >= 50:
        assert 0 <= stats["mfu"] <= stats["roofline_peak_pct"]  # the window holds at least the kernels' time
    else:  # an MFU of a sliver of the kernels would misread as the model's
        assert str(stats["mfu"]).startswith("not stated: the shapes model")
    for row in r.rows:  # no op class beats its roof
        if row.peak_pct is not None:
            assert row.peak_pct < 100 and (row.bandwidth_pct or 0) < 100, (name, row)


def test_a_trace_that_does_not_name_its_gpu_says_so(shared_traces):
    rep = _report(str(_path(shared_traces, "tracelens/vllm_decode_cuda_graph.json.gz")))
    stats = _stats(rep)
    assert stats["roofline_tflops"] > 0 and "roofline_peak_pct" not in stats
    assert stats["roofline_peak"].startswith("unknown: the trace does not name its GPU")


def test_traces_without_shapes_report_no_throughput(shared_traces):
    rep = _report(str(_path(shared_traces, "deepseek/h800_rank0_of64_train.json.gz")))
    assert not {"roofline_tflops", "roofline_peak_pct", "mfu"} & set(_stats(rep))
    assert rep.run.metrics[0].roofline.peak.name == "H800 SXM"  # the device is known, the work is not
