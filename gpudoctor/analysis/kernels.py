"""Kernel statistics: durations, launch overhead, Tensor Cores, FP32 work that could use them.

Kernels counted are those that start inside the analysis windows (the ProfilerStep
windows, or the whole trace without steps; ``KernelStats.window`` says which).

- Launch overhead: host time in launch calls (``cudaLaunchKernel``, ``cuLaunchKernel``,
  ``hipLaunchKernel``, ``cudaGraphLaunch`` …) in the same windows, against kernel time
  (HTA's "launch statistics" ratio); the launch delay is kernel start − launch start of
  each correlated pair.
- Tensor Cores: by kernel name (HMMA/GMMA/wgmma/tensorop/xmma/…, cuBLASLt ``nvjet``,
  flash attention, AMD MFMA) — a name-based heuristic, as torch-tb-profiler and HTA do.
- FP32 Tensor-Core-eligible work (needs ``record_shapes``): kernels launched by conv /
  matmul / linear / bmm / attention ops whose tensor inputs were float32
  (``"Input type"`` of the op that launched them, found by external id).
- Optimizer kernels: kernels launched inside ``Optimizer.step#…`` ranges.

Read from a ``KernelStats`` (GD401's evidence): the share of kernel time in half-precision Tensor
Core kernels, and, without input dtypes, the FP32 GEMM and convolution time the heaviest kernels'
names say.
"""

from __future__ import annotations

import re

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.metrics import KernelStats, NameStat, WindowKind

TOP_KERNELS = 20
SHORT_KERNEL_NS = 10_000
_LOW_PRECISION = ("Half", "BFloat16", "Float8", "float16", "bfloat16", "half", "e4m3", "e5m2")


def is_fp32_types(text: str) -> bool:
    """An op's "Input type" list says float32 tensors and no lower precision."""
    if not text:
        return False
    return '"float"' in text and not any(t in text for t in _LOW_PRECISION)


def name_stats(names: tuple[str, ...], name_ids: np.ndarray, durs: np.ndarray, top: int) -> tuple[NameStat, ...]:
    if not len(name_ids):
        return ()
    uniq, inv = np.unique(name_ids, return_inverse=True)
    totals = np.bincount(inv, weights=durs).astype(np.int64)
    counts = np.bincount(inv)
    maxes = np.zeros(len(uniq), np.int64)
    np.maximum.at(maxes, inv, durs)
    grand = int(durs.sum())
    order = np.lexsort((uniq, -totals))[:top]
    return tuple(
        NameStat(
            name=names[int(uniq[k])],
            count=int(counts[k]),
            total_ns=int(totals[k]),
            max_ns=int(maxes[k]),
            share_pct=round(100.0 * int(totals[k]) / grand, 3) if grand else 0.0,
        )
        for k in order
    )


def kernel_stats(view: TraceView, windows: Windows | None = None, top: int = TOP_KERNELS,
                 launch_windows: Windows | None = None) -> KernelStats | None:
    """The kernels that start in ``windows`` and the launch calls in ``launch_windows`` (default: the
    same windows; the host's ProfilerStep windows where ``windows`` are the steps on the device's
    timeline, ``analysis.timelines``)."""
    windows = windows or view.windows
    launch_windows = launch_windows or windows
    kidx = np.flatnonzero(view.is_kernel)
    if windows.from_steps and len(kidx):
        kidx = kidx[windows.index_of(view.d_ts[kidx]) >= 0]
    if not len(kidx):
        return None
    names = view.names
    dur = view.d_dur[kidx]
    total = int(dur.sum())
    count = len(kidx)
    # launches in the same windows
    lidx = np.flatnonzero(view.is_launch_call)
    if launch_windows.from_steps and len(lidx):
        lidx = lidx[launch_windows.index_of(view.h_ts[lidx]) >= 0]
    launch_total = int(view.h_dur[lidx].sum()) if len(lidx) else 0
    launch = view.dev_launch[kidx]
    paired = launch >= 0
    delay = view.d_ts[kidx][paired] - view.h_ts[launch[paired]]
    # Tensor Cores by name
    tc = names.tensor_core[view.d_name[kidx]]
    tc_ns = int(dur[tc].sum())
    tf32 = names.tf32[view.d_name[kidx]]
    conv_k = names.conv_kernel[view.d_name[kidx]]
    # FP32 eligible ops (by the op that launched each kernel)
    shapes_known = bool(view.tl.info.record_shapes and (view.h_types >= 0).any())
    fp32_ns = fp32_tc_ns = 0
    fp32_conv_ns: int | None = None
    fp32_ops = 0
    fp32_pct = None
    half = tc & ~tf32  # Tensor Core kernels in a reduced precision: not TF32 by name, not of float32 ops
    if shapes_known:
        op = view.eligible_op_of(kidx)
        eligible = op >= 0
        types_ok = np.zeros(len(kidx), bool)
        type_cache: dict[int, bool] = {}
        for j in np.flatnonzero(eligible).tolist():
            t = int(view.h_types[op[j]])
            ok = type_cache.get(t)
            if ok is None:
                ok = type_cache[t] = is_fp32_types(view.tl.string_of(t))
            types_ok[j] = ok
        sel = eligible & types_ok
        # launched by a convolution op, whatever the kernel's name: cuDNN's layout kernels (nchwToNhwc,
        # genericTranspose) are the convolution's work as much as its implicit GEMM, and no matmul's
        by_conv = np.zeros(len(kidx), bool)
        by_conv[eligible] = view.host_is(names.conv_family_op)[op[eligible]]
        fp32_conv_ns = int(dur[sel & by_conv].sum())
        fp32_ns = int(dur[sel].sum())
        fp32_tc_ns = int(dur[sel & tc].sum())
        half &= ~sel
        fp32_ops = int(len(np.unique(op[sel])))
        fp32_pct = round(100.0 * fp32_ns / total, 3) if total else None
    # optimizer kernels: launched inside Optimizer.step ranges
    opt_idx = np.flatnonzero(view.is_optimizer_step)
    opt_per_step = None
    if len(opt_idx):
        o_s, o_e = view.optimizer_intervals  # a closure's forward and backward kernels are the model's
        lts = view.h_ts[launch[paired]]
        inside = iv.Coverage(o_s, o_e).covered(lts, lts + 1) > 0
        calls = len({(int(view.h_name[i]), int(view.h_ts[i])) for i in opt_idx.tolist()})
        opt_per_step = round(int(inside.sum()) / calls, 3) if calls else None
    return KernelStats(
        count=count,
        total_ns=total,
        p50_ns=int(np.percentile(dur, 50, method="nearest")),
        p90_ns=int(np.percentile(dur, 90, method="nearest")),
        max_ns=int(dur.max()),
        under_10us_pct=round(100.0 * int((dur < SHORT_KERNEL_NS).sum()) / count, 3),
        launch_count=len(lidx),
        launch_total_ns=launch_total,
        launch_to_kernel_ratio=round(launch_total / total, 4) if total else None,
        median_launch_delay_ns=int(np.median(delay)) if len(delay) else None,
        tensor_core_ns=tc_ns,
        tensor_core_pct=round(100.0 * tc_ns / total, 3) if total else 0.0,
        fp32_eligible_op_ns=fp32_ns,
        fp32_eligible_pct_of_gpu=fp32_pct,
        eligible_dtypes_known=shapes_known,
        top=name_stats(view.tl.names, view.d_name[kidx], dur, top),
        optimizer_kernels_per_step=opt_per_step,
        conv_kernel_ns=int(dur[conv_k].sum()),
        tf32_kernel_ns=int(dur[tf32].sum()),
        fp32_eligible_op_count=fp32_ops,
        fp32_eligible_tensor_core_ns=fp32_tc_ns,
        fp32_conv_op_ns=fp32_conv_ns,
        half_tensor_core_ns=int(dur[half].sum()),
        window=WindowKind.STEPS if windows.from_steps else WindowKind.TRACE,
    )



# --------------------------------------------------------------------------- reading a KernelStats

# cuBLAS / cuDNN single-precision SIMT kernels, and cuDNN convolutions on float, by name
_FP32_KERNEL = re.compile(
    r"sgemm|scudnn|gemv2?t?_kernel<float|"
    r"(winograd|convolve|dgrad|wgrad|conv2d|implicit_gemm)[^<]*<float\b",
    re.IGNORECASE,
)
_FP32_GEMM_KERNEL = re.compile(r"sgemm|gemv2?t?_kernel<float", re.IGNORECASE)


def fp32_named_ns(k: KernelStats, gemm: bool = False) -> int:
    """GPU time of the heaviest kernels (``KernelStats.top``) whose names say FP32 GEMM or convolution
    (GEMM alone when ``gemm``)."""
    pattern = _FP32_GEMM_KERNEL if gemm else _FP32_KERNEL
    return sum(s.total_ns for s in k.top if pattern.search(s.name))


def fp32_kernel_name_pct(k: KernelStats) -> float | None:
    """Share of kernel time, among the heaviest kernels (``KernelStats.top``), in single-precision
    GEMM and convolution kernels by name: a lower bound when the trace has no input dtypes."""
    if not k.top or k.total_ns <= 0:
        return None
    return 100.0 * fp32_named_ns(k) / k.total_ns


def half_tensor_core_pct(k: KernelStats) -> float:
    """Share of kernel time in Tensor Core kernels (by name) that are neither TF32 kernels by name nor
    kernels of float32 ops: the TF32 kernels that cuDNN (``allow_tf32``, on by default) and the matmul
    flags run float32 ops on are FP32 work, not mixed precision."""
    if k.total_ns <= 0:
        return 0.0
    if k.half_tensor_core_ns is not None:  # neither TF32 by name nor of a float32 op
        return 100.0 * k.half_tensor_core_ns / k.total_ns
    return 100.0 * max(0, k.tensor_core_ns - k.fp32_eligible_tensor_core_ns) / k.total_ns
