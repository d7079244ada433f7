"""analyze_trace end to end on a hand-built timeline; the JSON entry point; no torch import."""

from __future__ import annotations

import json
import subprocess
import sys

from gpudoctor.analysis import analyze_trace
from gpudoctor.analysis.__main__ import main
from gpudoctor.model.findings import RunData
from gpudoctor.model.metrics import GapCause, TraceMetrics, WindowKind
from gpudoctor.model.run import Device, Manifest
from gpudoctor.model.trace import DeviceKind as D
from gpudoctor.model.trace import HostKind as H
from gpudoctor.model.trace import TimelineBuilder

US = 1000


def training_timeline(steps: int = 3) -> TimelineBuilder:
    b = TimelineBuilder("train.pt.trace.json")
    corr = 0
    for n in range(steps):
        s = n * 1000
        b.add_host(H.USER_ANNOTATION, f"ProfilerStep#{n + 10}", s * US, 1000 * US)
        b.add_host(H.USER_ANNOTATION, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", s * US, 400 * US)
        for j in range(5):
            corr += 1
            t = s + 400 + 100 * j
            b.add_host(H.CPU_OP, "aten::addmm", t * US, 20 * US, external_id=corr)
            b.add_host(H.RUNTIME, "cudaLaunchKernel", (t + 10) * US, 5 * US, correlation=corr, external_id=corr)
            b.add_device(D.KERNEL, "ampere_sgemm_64x64_nn", (t + 20) * US, 70 * US, correlation=corr, external_id=corr)
    return b


def test_analyze_trace_fills_every_section():
    m = analyze_trace(training_timeline().build())
    assert m.has_gpu_activity and m.step_source == "ProfilerStep"
    assert [s.step for s in m.steps] == [10, 11, 12]
    kinds = [w.kind for w in m.windows]
    assert kinds == [WindowKind.STEPS, WindowKind.SPAN, WindowKind.HTA, WindowKind.TRACE]
    (u,) = m.utilization
    assert u.idle_pct_steps == 65.0  # 5 × 70 µs busy per 1000 µs step
    assert {c.cause for c in u.gap_causes} >= {GapCause.DATALOADER}
    assert len(m.breakdown) == 3 and m.breakdown_mean_pct["gpu_compute"] == 35.0
    assert m.kernels.count == 15 and m.kernels.window == WindowKind.STEPS
    assert m.syncs.count == 0 and m.cpu.dataloader_pct == 40.0
    assert m.memory[0].device == 0 and m.transfers == ()
    assert [n for n in m.notes if not n.startswith("device 0: HTA 0.5.0 window")] == []
    assert TraceMetrics.from_dict(json.loads(json.dumps(m.to_dict()))) == m


def test_whole_trace_window_and_run_fallbacks():
    b = TimelineBuilder()
    b.add_host(H.RUNTIME, "cudaLaunchKernel", 0, 5 * US, correlation=1)
    b.add_device(D.KERNEL, "k", 10 * US, 10 * US, correlation=1)
    run = RunData(
        source="run",
        manifest=Manifest(
            schema_version=1, gpudoctor_version="0", run_id="r", command=(), script=None, module=None, argv=(),
            cwd="/", started_at="", started_at_unix_ns=0, rank=2, world_size=4,
            devices=(Device(index=0, name="NVIDIA L4", total_memory_bytes=24, compute_capability="8.9"),),
        ),
    )
    m = analyze_trace(b.build(), run)
    assert m.step_source == "trace" and m.steps == () and len(m.breakdown) == 1
    assert "span of GPU activity is one window" in m.notes[0]
    assert m.breakdown[0].dur_ns == 10 * US and m.ledger is not None and m.ledger.label == "rank 2"
    assert (m.rank, m.world_size) == (2, 4)
    assert m.devices[0].compute_capability == "8.9" and m.memory[0].total_bytes == 24
    assert m.utilization[0].gaps_window == WindowKind.SPAN


def test_json_entry_point(tmp_path, capsys):
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 40,
         "args": {"device": 0, "stream": 7, "correlation": 1}},
    ]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(trace))
    assert main([str(p)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"][0]["utilization"][0]["idle_pct_steps"] == 60.0
    assert main([str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_parse_and_analysis_do_not_import_torch():
    code = (
        "import sys, gpudoctor.parse, gpudoctor.analysis, gpudoctor.analysis.__main__\n"
        "print(sorted(m for m in ('torch', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
