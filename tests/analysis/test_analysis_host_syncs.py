"""Host syncs with their op and Python frame; the CPU side; op facts; memory; collectives."""

from __future__ import annotations

import pytest

from gpudoctor.analysis.comm import comm_stats
from gpudoctor.analysis.host import cpu_summary, op_facts, top_level
from gpudoctor.analysis.memory import memory_stats
from gpudoctor.analysis.names import is_user_frame
from gpudoctor.analysis.syncs import sync_summary
from gpudoctor.analysis.view import TraceView
from gpudoctor.model.findings import RunData
from gpudoctor.model.metrics import DeviceInfo, WindowKind
from gpudoctor.model.run import Settings
from gpudoctor.model.trace import HOST_FLAG_SEQUENCE, TimelineBuilder
from gpudoctor.model.trace import DeviceKind as D
from gpudoctor.model.trace import HostKind as H

US = 1000
DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def test_syncs_carry_the_outer_op_and_the_users_frame():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#4", 0, 1000 * US)
    b.add_host(H.PYTHON_FUNCTION, "train.py(30): main", 0, 900 * US)
    b.add_host(H.PYTHON_FUNCTION, "train.py(42): train_step", 100 * US, 500 * US)
    b.add_host(H.PYTHON_FUNCTION, "torch/_tensor.py(1000): item", 190 * US, 300 * US)
    b.add_host(H.CPU_OP, "aten::item", 200 * US, 200 * US)
    b.add_host(H.CPU_OP, "aten::_local_scalar_dense", 210 * US, 180 * US)
    b.add_host(H.RUNTIME, "cudaMemcpyAsync", 220 * US, 10 * US, correlation=1)
    b.add_host(H.RUNTIME, "cudaStreamSynchronize", 240 * US, 150 * US, correlation=2)
    b.add_host(H.RUNTIME, "cudaDeviceSynchronize", 700 * US, 20 * US, correlation=3)
    b.add_host(H.RUNTIME, "cudaStreamSynchronize", 5000 * US, 20 * US, correlation=4)  # outside the step
    s = sync_summary(TraceView(b.build()))
    assert s.count == 2 and s.total_ns == 170 * US
    assert s.share_of_steps_pct == pytest.approx(17.0)
    top = s.top[0]
    assert (top.name, top.op, top.frame, top.step) == ("cudaStreamSynchronize", "aten::item", "train.py(42): train_step", 4)
    assert s.top[1].frame == "train.py(30): main" and s.top[1].op == ""
    assert [n.name for n in s.by_op] == ["aten::item"]
    assert {n.name: n.count for n in s.by_frame} == {"train.py(42): train_step": 1, "train.py(30): main": 1}


def test_no_runtime_calls_means_no_sync_summary():
    b = TimelineBuilder()
    b.add_host(H.CPU_OP, "aten::mm", 0, 10)
    assert sync_summary(TraceView(b.build())) is None


@pytest.mark.parametrize(
    ("frame", "user"),
    [
        ("train.py(42): train_step", True),
        ("/home/me/project/model.py(12): forward", True),
        ("torch/nn/modules/module.py(1501): _call_impl", False),
        ("/usr/lib/python3.11/site-packages/foo.py(3): f", False),
        ("<built-in method item of Tensor object at 0x7f>", False),
        ("nn.Module: Linear_0", False),
    ],
)
def test_user_frames(frame, user):
    assert is_user_frame(frame) is user


def test_cpu_summary_counts_nested_ops_once_and_python_outside_ops():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 1000 * US)
    b.add_host(H.USER_ANNOTATION, DL, 0, 100 * US)
    b.add_host(H.CPU_OP, "aten::linear", 200 * US, 300 * US)
    b.add_host(H.CPU_OP, "aten::addmm", 250 * US, 100 * US)  # nested: not counted twice
    b.add_host(H.CPU_OP, "aten::relu", 400 * US, 200 * US, thread="0/1")  # another thread overlaps
    b.add_host(H.USER_ANNOTATION, "Optimizer.step#SGD.step", 700 * US, 100 * US)
    b.add_host(H.PYTHON_FUNCTION, "train.py(1): <module>", 0, 1000 * US)
    c = cpu_summary(TraceView(b.build()))
    assert c.window.kind == WindowKind.STEPS
    assert c.dataloader_ns == 100 * US and c.dataloader_pct == 10.0
    assert c.op_ns == 400 * US and c.op_pct == 40.0
    assert c.python_ns == 500 * US and c.python_pct == 50.0
    assert c.optimizer_ns == 100 * US
    assert c.top_ops[0].name == "aten::linear"


def test_top_ops_rank_by_self_time_so_a_nested_chain_is_one_cost():
    """conv2d → convolution → _convolution → cudnn_convolution: by inclusive time all four rows
    would show the same 900 µs; by self time the op that does the work leads, once."""
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 2000 * US)
    b.add_host(H.CPU_OP, "aten::conv2d", 100 * US, 900 * US)
    b.add_host(H.CPU_OP, "aten::convolution", 110 * US, 880 * US)
    b.add_host(H.CPU_OP, "aten::_convolution", 120 * US, 860 * US)
    b.add_host(H.CPU_OP, "aten::cudnn_convolution", 130 * US, 840 * US)
    b.add_host(H.CPU_OP, "aten::relu", 1100 * US, 300 * US)
    top = cpu_summary(TraceView(b.build())).top_ops
    assert [t.name for t in top[:2]] == ["aten::cudnn_convolution", "aten::relu"]
    by_name = {t.name: t.total_ns for t in top}
    assert by_name["aten::cudnn_convolution"] == 840 * US and by_name["aten::conv2d"] == 20 * US
    assert sum(by_name.values()) == 1200 * US  # each µs counted once


def test_top_level_is_per_thread():
    b = TimelineBuilder()
    b.add_host(H.CPU_OP, "outer", 0, 100)
    b.add_host(H.CPU_OP, "inner", 10, 20)
    b.add_host(H.CPU_OP, "other_thread", 10, 20, thread="0/9")
    b.add_host(H.CPU_OP, "after", 100, 20)
    v = TraceView(b.build())
    import numpy as np

    assert top_level(v, np.arange(4)).tolist() == [True, False, True, True]


def test_op_facts_conv_shapes_autograd_and_host_loss():
    b = TimelineBuilder()
    for n, start, shape in ((1, 0, "[[8, 3, 224, 224]]"), (2, 1000, "[[8, 3, 200, 200]]")):
        s = start * US
        b.add_host(H.USER_ANNOTATION, f"ProfilerStep#{n}", s, 1000 * US)
        b.add_host(H.CPU_OP, "aten::conv2d", s + 10 * US, 100 * US, input_dims=shape,
                   input_types='["float"]', flags=HOST_FLAG_SEQUENCE)
        b.add_host(H.CPU_OP, "aten::convolution", s + 20 * US, 80 * US, input_dims=shape, input_types='["float"]')
        b.add_host(H.RUNTIME, "cudaLaunchKernel", s + 30 * US, 5 * US, correlation=n)
        b.add_device(D.KERNEL, "implicit_convolve_sgemm", s + 40 * US, 50 * US, correlation=n)
        b.add_device(D.MEMCPY, "Memcpy DtoH (Device -> Pageable)", s + 200 * US, 5 * US, nbytes=4000)
        b.add_host(H.CPU_OP, "aten::mse_loss", s + 300 * US, 50 * US)  # no launch: computed on the host
        b.add_host(H.CPU_OP, "autograd::engine::evaluate_function: ConvolutionBackward0", s + 400 * US, 100 * US)
        b.add_host(H.CPU_OP, "ConvolutionBackward0", s + 410 * US, 80 * US)
        b.add_host(H.USER_ANNOTATION, "Optimizer.step#SGD.step", s + 600 * US, 100 * US)
    f = op_facts(TraceView(b.build()))
    assert f.conv_shapes_total == 2 and f.conv_shapes_max_per_step == 1
    assert f.backward_ops == 2
    assert f.autograd_forward_ops == 2  # the two aten::conv2d (top level, "Sequence number")
    assert f.optimizer_steps == 2
    assert [(s.name, s.count) for s in f.host_loss_ops] == [("aten::mse_loss", 2)]
    assert f.host_loss_after_d2h == 2


def test_op_facts_without_shapes_leave_conv_unknown():
    b = TimelineBuilder()
    b.add_host(H.CPU_OP, "aten::conv2d", 0, 100)
    f = op_facts(TraceView(b.build()))
    assert f.conv_shapes_total is None and f.host_loss_ops == () and f.host_loss_after_d2h is None


def test_memory_peaks_and_allocator_calls():
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#1", 0, 100 * US)
    b.add_host(H.USER_ANNOTATION, "ProfilerStep#2", 100 * US, 100 * US)
    b.add_device(D.KERNEL, "k", 0, 10 * US, device=0)
    b.add_host(H.RUNTIME, "cudaMalloc", 10 * US, 500 * US)
    b.add_host(H.RUNTIME, "cudaMalloc", 150 * US, 5 * US)
    b.add_host(H.RUNTIME, "cudaFree", 160 * US, 5 * US)
    b.add_memory(5 * US, 0, 1_000, 2_000)
    b.add_memory(6 * US, 0, 3_000, 4_000)
    b.add_memory(7 * US, -1, 9_999_999, 0)  # CPU memory: not a device's
    run = RunData(source="x", settings=Settings(empty_cache_count=3))
    (m,) = memory_stats(TraceView(b.build()), (DeviceInfo(0, "A100", "8.0", 80_000),), run)
    assert (m.device, m.peak_allocated_bytes, m.peak_reserved_bytes, m.total_bytes) == (0, 3_000, 4_000, 80_000)
    assert (m.cuda_malloc_count, m.cuda_free_count, m.empty_cache_count) == (2, 1, 3)
    assert m.alloc_calls_after_first_step == 2 and m.alloc_api_ns == 510 * US


def test_comm_exposed_time_and_host_collectives():
    b = TimelineBuilder()
    b.add_device(D.KERNEL, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 100 * US, stream=20)
    b.add_device(D.KERNEL, "gemm", 50 * US, 100 * US, stream=7)  # hides [50, 100)
    b.add_host(H.USER_ANNOTATION, "nccl:all_reduce", 0, 10 * US)
    (c,) = comm_stats(TraceView(b.build()))
    assert (c.device, c.kernel_count, c.comm_ns, c.exposed_ns) == (0, 1, 100 * US, 50 * US)
    assert c.exposed_pct == 50.0 and c.share_of_busy_pct == pytest.approx(100 * 100 / 150, abs=1e-3)
    assert c.host_ops == 1 and c.top[0].name.startswith("ncclDevKernel")
    b = TimelineBuilder()
    b.add_host(H.USER_ANNOTATION, "gloo:all_reduce", 0, 10 * US)
    (g,) = comm_stats(TraceView(b.build()))
    assert g.device == -1 and g.host_ops == 1 and g.host_ns == 10 * US
    assert comm_stats(TraceView(TimelineBuilder().build())) == ()
