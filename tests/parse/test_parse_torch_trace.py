"""A trace written by this machine's torch.profiler (CPU), read back and analyzed.

Keeps the parser honest against the writer's current layout (``tensorboard_trace_handler``
gzip output, ProfilerStep from a schedule, shapes, stacks, memory events). torch is
imported only here, to record; gpudoctor's parse and analysis never import it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.analysis import analyze_trace
from gpudoctor.parse import load_inputs
from gpudoctor.parse.kineto import read_trace_chunked
from gpudoctor.parse.stream import read_trace_streaming

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def record(out: Path, *, train: bool) -> Path:
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(64, 3, 8, 8), torch.randint(0, 2, (64,))), batch_size=8)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(out), use_gzip=True),
        record_shapes=True,
        with_stack=True,
        profile_memory=True,
    ) as prof:
        for x, y in data:
            if train:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            else:
                with torch.no_grad():
                    model(x).argmax(1)
            prof.step()
    (trace,) = sorted(out.glob("*.pt.trace.json.gz"))
    return trace


def test_training_trace_from_torch_profiler(tmp_path):
    trace = record(tmp_path, train=True)
    fast, slow = read_trace_chunked(trace), read_trace_streaming(trace)
    assert len(fast.host) == len(slow.host) > 100 and sorted(fast.host.ts_ns) == sorted(slow.host.ts_ns)
    assert fast.info.parser == "chunked" and fast.info.unknown_categories == {}
    assert fast.info.with_stack and fast.info.record_shapes and fast.info.profile_memory
    (tl,) = load_inputs([tmp_path]).timelines  # a folder of traces
    m = analyze_trace(tl)
    assert m.step_source == "ProfilerStep" and len(m.steps) == 3
    assert not m.has_gpu_activity and m.platform == "cpu" and m.utilization == ()
    assert m.has_stacks and m.has_shapes
    assert m.cpu.dataloader_ns > 0 and m.cpu.op_ns > 0 and m.cpu.python_pct is not None
    assert m.optimizer_steps == 3 and m.backward_ops > 0 and m.autograd_forward_ops > 0
    assert m.conv_shapes_total == 1 and m.conv_shapes_max_per_step == 1
    assert all(sum(b.parts_ns.values()) == b.dur_ns for b in m.breakdown)
    assert m.breakdown_mean_pct["data_loading"] > 0


def test_no_grad_evaluation_records_no_autograd(tmp_path):
    m = analyze_trace(load_inputs([record(tmp_path, train=False)]).timelines[0])
    assert m.autograd_forward_ops == 0 and m.backward_ops == 0 and m.optimizer_steps == 0
