"""What fixes are expected to win: the models behind each finding's expected gain (docs/account.md).

Every model here states its factors and where they come from; a rule's "Expected gain" section
says which it uses. The Tensor Core models of GD401 (AMP) and GD402 (TF32) first:

A rule's *expected* gain (docs/account.md) needs the speed-up its fix gives the kernels it
claims. For matrix math moved onto Tensor Cores that speed-up is bounded twice:

- by the **peak ratio** of the two precisions on that GPU (dense throughput, from the vendor's
  datasheet or whitepaper; ``PEAK_TFLOPS`` below);
- by what kernels **realize**: convolutions and GEMMs of training-sized layers are partly bound by
  memory traffic, so they reach a fraction of the peak ratio. NVIDIA's mixed-precision training
  guide reports speed-ups of up to 3x on matmul-heavy networks from Tensor Cores; the cap is
  ``Thresholds.tensor_core_speedup_max_ratio`` (3).

``kernel_speedup(cc, source, target, cap)`` is the lesser of the two. The share of a kernel's
time a fix wins is then ``1 - 1 / speedup`` (Amdahl's law over the claimed kernels only).

The peak figures are those of one reference part per architecture in ``analysis/peaks.py``, the one
table of GPU peaks with the source of each figure (``ARCH_REFERENCE``): V100 SXM2 (7.0), T4 (7.5),
A100 SXM (8.0), A10 for GA10x (8.6, 8.9 taken alike), H100 SXM (9.0), B200 (10.0, 12.0 taken alike)
and MI300X for ROCm (``amd``: its traces report no NVIDIA compute capability).
"""

from __future__ import annotations

from gpudoctor.analysis.peaks import ARCH_REFERENCE

# (fp32, tf32, half) dense peak TFLOPS of a reference part of each architecture; tf32 None: none
PEAK_TFLOPS: dict[str, tuple[float, float | None, float]] = {
    arch: (p.fp32_tflops, p.tf32_tflops, p.half_tflops) for arch, p in ARCH_REFERENCE.items()
}


def _arch(cc: float | None, amd: bool = False) -> str | None:
    if amd:
        return "amd"
    if cc is None:
        return None
    if cc >= 10.0:
        return "10.0"
    if cc >= 9.0:
        return "9.0"
    if cc >= 8.6:
        return "8.6"
    if cc >= 8.0:
        return "8.0"
    if cc >= 7.5:
        return "7.5"
    if cc >= 7.0:
        return "7.0"
    return None


def peak_ratio(cc: float | None, source: str, target: str, *, amd: bool = False) -> float | None:
    """The datasheet's throughput of ``target`` over ``source`` ("fp32", "tf32", "half"); None when
    the GPU has no Tensor Cores of that kind (or is unknown)."""
    arch = _arch(cc, amd)
    if arch is None:
        return None
    fp32, tf32, half = PEAK_TFLOPS[arch]
    value = {"fp32": fp32, "tf32": tf32, "half": half}
    a, b = value[source], value[target]
    if a is None or b is None or a <= 0:
        return None
    return b / a


def kernel_speedup(cc: float | None, source: str, target: str, cap: float, *, amd: bool = False) -> float | None:
    """The expected speed-up of matrix kernels moved from ``source`` to ``target`` precision: the
    peak ratio, at most ``cap`` (what kernels realize). None: no model for this GPU."""
    ratio = peak_ratio(cc, source, target, amd=amd)
    if ratio is None:
        return None
    return max(1.0, min(ratio, cap))


def won_fraction(speedup: float | None) -> float | None:
    """The share of the kernels' time a speed-up removes: ``1 - 1/speedup``."""
    if speedup is None or speedup <= 0:
        return None
    return max(0.0, 1.0 - 1.0 / speedup)


# --------------------------------------------------------------------------- what the run had on


def is_amd(device_name: str) -> bool:
    """ROCm devices: their traces report a gfx compute capability, not an NVIDIA one."""
    n = device_name.lower()
    return "amd" in n or "instinct" in n or "radeon" in n or n.startswith("mi2") or n.startswith("mi3")


def matmul_tf32_flags(settings) -> tuple[bool | None, list, list]:
    """Are float32 matmuls run in TF32? (on: True/False, None when no flag is recorded; the flags that
    turn it on; every TF32 flag recorded). ``torch.backends.cuda.matmul.allow_tf32``,
    ``torch.set_float32_matmul_precision`` and PyTorch 2.9's ``fp32_precision`` settings."""
    if settings is None:
        return None, [], []

    def flag(suffix: str):
        for f in settings.flags:
            if f.name == suffix or f.name.endswith("." + suffix) or f.name.endswith(suffix):
                return f
        return None

    allow = flag("matmul.allow_tf32")
    precision = flag("float32_matmul_precision")
    fp32_matmul = flag("cuda.matmul.fp32_precision")
    fp32_generic = flag("torch.backends.fp32_precision")
    refs = [f for f in (allow, precision, fp32_matmul) if f is not None]
    if not refs:
        return None, [], []
    enabling = [
        f
        for f, on_values in ((precision, ("high", "medium")), (allow, (True,)), (fp32_matmul, ("tf32",)))
        if f is not None and (f.value.lower() if isinstance(f.value, str) else f.value) in on_values
    ]
    if (fp32_matmul is not None and str(fp32_matmul.value).lower() == "none"
            and fp32_generic is not None and str(fp32_generic.value).lower() == "tf32"):
        enabling.append(fp32_generic)
    return bool(enabling), enabling, refs


def conv_tf32(settings) -> bool:
    """cuDNN runs float32 convolutions in TF32 unless ``torch.backends.cudnn.allow_tf32`` is False
    (its default is True)."""
    if settings is None:
        return True
    for f in settings.flags:
        if f.name.endswith("cudnn.allow_tf32"):
            return f.value is not False
    return True


# --------------------------------------------------------------------------- copies (GD301)

# Pinned host→device bandwidth a x16 link sustains: ~75% of its theoretical rate per direction
# (PCIe 3.0: 15.75 GB/s, 4.0: 31.5 GB/s, 5.0: 63 GB/s after 128b/130b encoding; PCI-SIG), the
# share CUDA's bandwidthTest sample reaches with pinned buffers. Used when the trace has no pinned
# copies of its own to measure (the public A100 traces measure 8-12 GB/s pinned: a shared or
# narrower link; a measurement of the run itself wins).
PCIE_PINNED_GBPS: dict[int, float] = {3: 12.0, 4: 24.0, 5: 48.0}
# A small copy's device time whatever its size: 1.3-2.7 µs per copy of a few bytes in the public
# traces of ../shared/traces (A100, V100, B200).
COPY_LATENCY_NS = 1_500
MIN_MEASURED_COPY_BYTES = 1 << 20  # pinned copies this large on average measure the link, not latency


def pcie_generation(cc: float | None, *, amd: bool = False) -> int | None:
    """The host link of each architecture's data-centre parts: Volta/Turing PCIe 3, Ampere/Ada 4,
    Hopper/Blackwell and MI300 5."""
    if amd:
        return 5
    if cc is None:
        return None
    return 5 if cc >= 9.0 else 4 if cc >= 8.0 else 3


def pinned_copy_fraction(count: int, nbytes: int, dur_ns: int, pinned_gbps: float | None) -> float | None:
    """The share of pageable copies' time that pinned copies would save: they would take
    ``count × COPY_LATENCY_NS + bytes ÷ pinned bandwidth``."""
    if dur_ns <= 0 or not pinned_gbps:
        return None
    after = count * COPY_LATENCY_NS + nbytes / pinned_gbps  # bytes ÷ (GB/s) = ns
    return max(0.0, min(1.0, 1.0 - after / dur_ns))


# --------------------------------------------------------------------------- host-side waits (GD102, GD302)


def runs_ahead_fraction(device_pct: float, blocked_pct: float, at_stake_pct: float) -> tuple[float | None, str]:
    """Without a blocking wait the host runs ahead of the GPU: a step takes the longer of the GPU's busy
    time and the host's own time (the step less the time it sat blocked). The share of ``at_stake_pct``
    that wins (and the model in words)."""
    if at_stake_pct <= 0:
        return None, ""
    host = max(0.0, 100.0 - blocked_pct)
    after = max(device_pct, host)
    win = max(0.0, 100.0 - after)
    return min(1.0, win / at_stake_pct), (
        f"step after ≈ max(GPU busy {device_pct:.1f}%, host time without the waits {host:.1f}%) of today's "
        f"step: −{min(win, at_stake_pct):.1f}%")


# --------------------------------------------------------------------------- launches (GD103, GD404)

# torch.optim's multi-tensor ("foreach") and fused kernels take up to this many tensors per launch
# (depth 4, the parameter, gradient and two moments of Adam: ATen's MultiTensorApply.cuh
# depth_to_max_tensors = {110, 64, 48, 36, 30})
TENSORS_PER_LAUNCH = 36
# torch.compile's fusion at least halves the kernels a launch-bound eager loop issues (runs of
# pointwise ops become one kernel); CUDA graphs ("reduce-overhead") replace every launch of the
# captured region by one. gpudoctor's conservative reading of the PyTorch 2 paper (Ansel et al.,
# ASPLOS 2024), whose training speed-ups come mostly from fewer, fused kernels; --verify cannot
# try it (it changes the code), so the expected gain says so.
COMPILE_LAUNCH_REDUCTION = 2.0


def launch_fraction(kernels_now: float, kernels_after: float) -> float | None:
    """Per-launch cost scales with the launches: the share saved going from one count to the other."""
    if kernels_now <= 0:
        return None
    return max(0.0, min(1.0, 1.0 - kernels_after / kernels_now))


# --------------------------------------------------------------------------- the rest

# GD303: read device results on the host every this many steps (the fix's example) instead of every step
READ_EVERY_STEPS = 100
# GD702: a loss on the device costs the host a few small ops each step instead of the CPU loss and the
# copy of the outputs back: ~5 ops of ~10 µs dispatch each (analysis.dispatch.SHORT_OP_NS)
DEVICE_LOSS_HOST_NS_PER_STEP = 50_000
# GD602: a bf16/fp16 DDP communication hook halves the bytes all-reduced, and a bandwidth-bound
# all-reduce's time with them (torch.distributed.algorithms.ddp_comm_hooks: fp16_compress_hook,
# bf16_compress_hook)
COMM_COMPRESSION_FRACTION = 0.5
# GD403: cuDNN's heuristics usually pick a near-fastest algorithm; timing every candidate wins the
# rest. No published figure: gpudoctor's conservative estimate of 10% of convolution time, which
# --verify measures (the flag is injectable).
CUDNN_BENCHMARK_FRACTION = 0.1


def autotune_fraction(rows, tf32_allowed: bool, memory_gbps: float | None) -> tuple[float, int, float] | None:
    """The share of convolution kernel time autotuning is expected to win, measured on the run itself:
    (fraction, the kernel ns of the rows below the reference, the reference TFLOP/s); None where the
    run's convolutions give no reference (fewer than two convolution rows of the roofline with a rate).

    cuDNN's heuristic picks an algorithm per shape; autotuning times the candidates and keeps the
    fastest, which for a shape the heuristic served badly is one that runs at about the rate the same
    device reached on the run's other convolutions. So each row of convolution ops (``Roofline.rows``,
    by precision) below the fastest row's achieved TFLOP/s is expected to reach it, but not beyond its
    memory roof (arithmetic intensity × bandwidth), nor switch to TF32 where cuDNN's ``allow_tf32`` is
    off: saved time = kernel time × (1 − achieved ÷ reachable)."""
    conv = [x for x in rows if x.op_class == "conv" and x.achieved_tflops and x.kernel_ns > 0]
    if len(conv) < 2:
        return None
    total = sum(x.kernel_ns for x in conv)
    won = 0.0
    slow_ns = 0
    best_any = max(x.achieved_tflops for x in conv)
    for x in conv:
        same = [y.achieved_tflops for y in conv if y.dtype == x.dtype or (tf32_allowed and y.dtype == "tf32")]
        reach = max(same) if same else best_any
        if memory_gbps and x.intensity_flop_per_byte:
            reach = min(reach, x.intensity_flop_per_byte * memory_gbps / 1e3)
        if reach > x.achieved_tflops:
            won += x.kernel_ns * (1.0 - x.achieved_tflops / reach)
            slow_ns += x.kernel_ns
    return won / total if total else 0.0, slow_ns, best_any
