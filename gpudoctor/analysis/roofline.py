"""The roofline: the work the ops did (from their input shapes), how fast their kernels did it, and
how that compares with the device's peak (``analysis.peaks``).

**Work.** ``estimate(name, dims, types, concrete)`` (``analysis.flops``, which says how) turns one op's
recorded shapes into FLOPs and bytes, in the conventions of model FLOPs (a multiply-add is 2 FLOPs;
nothing recomputed counts): matmuls, convolutions, attention and elementwise ops.

**Ops → kernels.** A kernel belongs to the op inside which its launch call ran: the innermost
modelled op that encloses the runtime call (the call with the kernel's correlation id) on the
call's thread, which holds for traces whose kernels carry the op's external id and for older
ones (PyTorch 1.x) whose kernels carry only the correlation id. Without a launch call the
kernel's external id names the op. An op that encloses another modelled op gives way to it
(``linear`` → ``addmm``; ``conv2d`` → ``cudnn_convolution``), so no FLOP counts twice; a kernel
launched by a graph launch (CUDA/HIP graphs) is not attributed. An op's FLOPs are divided by its
kernels' GPU time: achieved TFLOP/s per class and precision, and GB/s.

**Against the peak.** Each row's precision picks its peak: float32 inputs whose kernels are
TF32 kernels by name (``tf32``, Ampere's ``s1688``-style tensor-op shapes) ran in TF32 on NVIDIA.
``peak_pct`` is the time the FLOPs need at each row's peak, % of their kernels' time; MFU (model
FLOPs utilization) the same time, % of the window (the ProfilerStep windows, else the span of
GPU activity). A row is *compute-bound* when its FLOPs per byte reach the ridge point (its peak
÷ the memory bandwidth). An unknown device gets no share of peak, and a note says why.

**Elementwise chains.** Runs of ``CHAIN_MIN_KERNELS`` or more consecutive ATen elementwise kernels
(by name) on one stream whose ops work on tensors of one size (the largest recorded input of each
op, where shapes are recorded): each reads and writes device memory, where ``torch.compile`` would
fuse the run into about one kernel's traffic (``chain_fused_ns`` takes the longest kernel of each run).
"""

from __future__ import annotations

import json
import re

import numpy as np

from gpudoctor.analysis.flops import OpWork, causal_pairs, estimate, op_class
from gpudoctor.analysis.peaks import match_device, peak_tflops
from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.metrics import DeviceInfo, DevicePeak, Roofline, RooflineRow, WindowKind

__all__ = ["CHAIN_MIN_KERNELS", "OpWork", "causal_pairs", "estimate", "op_class", "roofline"]

CHAIN_MIN_KERNELS = 3  # a run of this many elementwise kernels in a row on one stream is a chain
TF32_KERNEL_SHARE = 0.5  # float32 ops whose kernels spend more than this share in Tensor Core kernels ran in TF32

COMPUTE_CLASSES = ("matmul", "conv", "attention")


# ATen's elementwise kernels (CUDA and ROCm): vectorized_/unrolled_elementwise_kernel, elementwise_kernel
_ELEMENTWISE_KERNEL = re.compile(r"elementwise_kernel")
_GRAPH_LAUNCH = re.compile(r"GraphLaunch")
# float32 inputs on TF32 Tensor Cores: cuBLAS/CUTLASS names say "tf32", or the single-precision
# tensor-op shapes of Ampere's kernels ("s1688gemm", "tensorop_s1688"); "xmma" alone does not tell
# (cuBLAS's FP32 SIMT kernels are xmma kernels too: "xmma_gemm_f32f32")
_TF32_KERNEL = re.compile(r"tf32|s1688|s16816|s16832|tensorop_s\d", re.IGNORECASE)


# --------------------------------------------------------------------------- ops -> kernels


def _innermost(idx: np.ndarray, ts: np.ndarray, end: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """Of nested host events (per thread), those that enclose none of the others."""
    if len(idx) < 2:
        return idx
    s = idx[np.lexsort((-end[idx], ts[idx], thread[idx]))]
    contains_next = (thread[s][1:] == thread[s][:-1]) & (ts[s][1:] < end[s][:-1])
    keep = np.ones(len(s), bool)
    keep[:-1] = ~contains_next
    return s[keep]


def _outermost(idx: np.ndarray, ts: np.ndarray, end: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """Of nested host events (per thread), those that no other encloses."""
    if len(idx) < 2:
        return idx
    s = idx[np.lexsort((-end[idx], ts[idx], thread[idx]))]
    keep = np.ones(len(s), bool)
    th = thread[s]
    cuts = np.r_[0, np.flatnonzero(th[1:] != th[:-1]) + 1, len(s)]
    for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        e = end[s[lo:hi]]
        reach = np.maximum.accumulate(e)
        keep[lo + 1 : hi] = ts[s[lo + 1 : hi]] >= reach[:-1]
    return s[keep]


class _Disjoint:
    """Host events that do not overlap on their thread, for "which one encloses time t on thread th"."""

    def __init__(self, idx: np.ndarray, ts: np.ndarray, end: np.ndarray, thread: np.ndarray) -> None:
        self.idx = idx[np.lexsort((ts[idx], thread[idx]))]
        self.ts, self.end, self.thread = ts[self.idx], end[self.idx], thread[self.idx]

    def find(self, q_thread: np.ndarray, q_ts: np.ndarray, q_end: np.ndarray | None = None) -> np.ndarray:
        """Position (into ``idx``) of the event enclosing each query on its thread, -1 where none."""
        out = np.full(len(q_ts), -1, np.int64)
        if not len(self.idx) or not len(q_ts):
            return out
        q_end = q_ts if q_end is None else q_end
        for th in np.unique(self.thread).tolist():
            q = np.flatnonzero(q_thread == th)
            if not len(q):
                continue
            lo = int(np.searchsorted(self.thread, th, side="left"))
            hi = int(np.searchsorted(self.thread, th, side="right"))
            k = np.searchsorted(self.ts[lo:hi], q_ts[q], side="right") - 1
            kk = np.maximum(k, 0)
            ok = (k >= 0) & (q_end[q] <= self.end[lo:hi][kk])
            out[q[ok]] = lo + kk[ok]
        return out


def _device_info(devices: tuple[DeviceInfo, ...], device: int) -> DeviceInfo | None:
    for d in devices:
        if d.index == device:
            return d
    return devices[0] if devices else None


def _is_amd(name: str, platform: str) -> bool:
    n = name.lower()
    return platform == "rocm" or any(w in n for w in ("amd", "instinct", "radeon"))


def _pct(a: float, b: float) -> float | None:
    return round(100.0 * a / b, 3) if b > 0 else None


def _row(op_class: str, dtype: str, ops: int, kernels: int, ns: int, flops: int, nbytes: int,
         peak: DevicePeak | None, top: str) -> RooflineRow:
    tflops = flops / ns / 1e3 if ns > 0 else None  # FLOP/ns = GFLOP/s
    gbps = nbytes / ns if ns > 0 else None  # B/ns = GB/s
    intensity = flops / nbytes if nbytes > 0 else None
    pk = peak_tflops(peak, dtype)
    bound = ""
    if pk and peak is not None and intensity is not None:
        ridge = pk * 1e3 / peak.memory_gbps  # FLOP per byte where the two roofs meet
        bound = "compute" if intensity >= ridge else "memory"
    return RooflineRow(
        op_class=op_class, dtype=dtype, ops=ops, kernels=kernels, kernel_ns=ns, estimated_flops=flops,
        estimated_bytes=nbytes,
        achieved_tflops=round(tflops, 3) if tflops is not None else None,
        achieved_gbps=round(gbps, 3) if gbps is not None else None,
        intensity_flop_per_byte=round(intensity, 3) if intensity is not None else None,
        peak_tflops=pk,
        peak_pct=_pct(tflops, pk) if tflops is not None and pk else None,
        bandwidth_pct=_pct(gbps, peak.memory_gbps) if gbps is not None and peak is not None else None,
        bound=bound, top_op=top,
    )


def _largest_numel(dims_text: str) -> int:
    """The element count of the largest tensor among an op's recorded input dims (-1: none readable)."""
    try:
        dims = json.loads(dims_text)
    except ValueError:
        return -1
    best = -1
    for d in dims if isinstance(dims, list) else ():
        if isinstance(d, list) and all(isinstance(x, int) for x in d):
            n = 1
            for x in d:
                n *= x
            best = max(best, n)
    return best


def _kernel_numel(view: TraceView, k: np.ndarray) -> np.ndarray:
    """Per kernel: the element count of the largest input of the op that launched it (by the kernel's
    external id), -1 where the op or its shapes are unknown."""
    out = np.full(len(k), -1, np.int64)
    if not len(k) or not (view.h_dims >= 0).any():
        return out
    op = view.op_of_external(view.d_ext[k])
    known = op >= 0
    dims = np.full(len(k), -1, np.int64)
    dims[known] = view.h_dims[op[known]]
    cache: dict[int, int] = {}
    for j in np.flatnonzero(dims >= 0).tolist():
        d = int(dims[j])
        n = cache.get(d)
        if n is None:
            n = cache[d] = _largest_numel(view.tl.string_of(d))
        out[j] = n
    return out


def _chains(view: TraceView, kidx: np.ndarray) -> tuple[int, int, int, int, int, int]:
    """(elementwise kernels, their ns, chains, kernels in chains, chain ns, fused ns) of the kernels.

    A chain is a run of elementwise kernels back to back on one stream whose ops (where their shapes
    are recorded) work on tensors of one size: the largest input of each has as many elements as the
    one before's. A fused kernel saves the traffic between producer and consumer; kernels on tensors
    of different sizes (the weight casts of autocast, a bias next to an activation) are not one's
    output and the next one's input, and fusing them saves nothing."""
    ew = view.dev_is(_name_table(view, _ELEMENTWISE_KERNEL))[kidx]
    n_ew, ns_ew = int(ew.sum()), int(view.d_dur[kidx][ew].sum())
    if not n_ew:
        return 0, 0, 0, 0, 0, 0
    order = np.lexsort((view.d_ts[kidx], view.d_stream[kidx]))
    k = kidx[order]
    flag = ew[order]
    stream = view.d_stream[k]
    dur = view.d_dur[k]
    numel = _kernel_numel(view, k)
    other_size = (numel[1:] >= 0) & (numel[:-1] >= 0) & (numel[1:] != numel[:-1])
    # a run breaks where the stream changes, a kernel is not elementwise or works on tensors of another size
    start = np.r_[True, (stream[1:] != stream[:-1]) | ~flag[:-1] | other_size]
    run_id = np.cumsum(start) - 1
    sel = np.flatnonzero(flag)
    ids, inv, counts = np.unique(run_id[sel], return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=dur[sel]).astype(np.int64)
    longest = np.zeros(len(ids), np.int64)
    np.maximum.at(longest, inv, dur[sel])
    long_runs = counts >= CHAIN_MIN_KERNELS
    return (n_ew, ns_ew, int(long_runs.sum()), int(counts[long_runs].sum()), int(sums[long_runs].sum()),
            int(longest[long_runs].sum()))


def _name_table(view: TraceView, rx: re.Pattern[str]) -> np.ndarray:
    return np.fromiter((rx.search(n) is not None for n in view.tl.names), bool, len(view.tl.names))


def roofline(view: TraceView, windows: Windows | None = None, devices: tuple[DeviceInfo, ...] = ()) -> Roofline | None:
    """The roofline of the busiest device's kernels that start in the windows (None: no kernels)."""
    windows = windows or view.windows
    device = view.primary_device
    if device is None:
        return None
    kidx = np.flatnonzero(view.is_kernel & (view.d_device == device))
    if windows.from_steps and len(kidx):
        kidx = kidx[windows.index_of(view.d_ts[kidx]) >= 0]
    if not len(kidx):
        return None
    info = _device_info(devices, device)
    name = info.name if info is not None else ""
    peak = match_device(name, info.compute_capability if info else None, info.total_memory_bytes if info else None)
    amd = _is_amd(name, view.tl.info.platform)
    notes: list[str] = []
    if peak is None:
        notes.append(f"device {name!r} is not in the table of GPU peaks (gpudoctor/analysis/peaks.py): "
                     "achieved throughput is given without a share of peak" if name else
                     "the trace does not name its GPU: achieved throughput is given without a share of peak")
    kernel_ns = int(view.d_dur[kidx].sum())
    if windows.from_steps:
        window_ns = windows.total_ns
    else:
        act = np.flatnonzero(view.is_activity & (view.d_device == device))
        window_ns = int(view.d_end[act].max() - view.d_ts[act].min())
    n_ew, ns_ew, chains, chain_kernels, chain_ns, fused_ns = _chains(view, kidx)
    base = dict(device=device, device_name=name, peak=peak,
                window=WindowKind.STEPS if windows.from_steps else WindowKind.SPAN, window_ns=window_ns,
                kernel_ns=kernel_ns, elementwise_kernels=n_ew, elementwise_ns=ns_ew,
                chain_min_kernels=CHAIN_MIN_KERNELS, chains=chains, chain_kernels=chain_kernels,
                chain_ns=chain_ns, chain_fused_ns=fused_ns)
    if not bool(((view.h_dims >= 0) & view.is_cpu_op).any()):
        notes.append("no input shapes in the trace (record_shapes): the ops' FLOPs cannot be estimated")
        return Roofline(**base, notes=tuple(notes))
    rows, figures, peak_ns, more_notes = _attribute(view, kidx, peak, amd)
    notes.extend(more_notes)
    mfu = _pct(peak_ns, window_ns) if figures["peak_pct"] is not None else None
    return Roofline(**base, **figures, mfu_pct=mfu, rows=tuple(rows), notes=tuple(notes))


def _unique_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, axis=0, return_inverse=True)`` of an (n, 4) array of ids >= -1, the same rows in the
    same order: the rows packed into one int64 each where their ids fit (a 1-D unique: measured 4-5× faster on
    ~400k rows than the row-wise one), then the few distinct rows ordered as the row-wise unique orders them."""
    shifted = keys.astype(np.int64) + 1  # ids of -1 (none) become 0
    bits = [max(int(shifted[:, j].max()), 1).bit_length() for j in range(keys.shape[1])]
    if sum(bits) > 62:
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        return uniq, inv.reshape(-1)
    packed = np.zeros(len(keys), np.int64)
    for j, b in enumerate(bits):
        packed <<= b
        packed |= shifted[:, j]
    _, first, inv1 = np.unique(packed, return_index=True, return_inverse=True)
    uniq, inv2 = np.unique(keys[first], axis=0, return_inverse=True)
    return uniq, inv2.reshape(-1)[inv1.reshape(-1)]


def _attribute(view: TraceView, kidx: np.ndarray, peak: DevicePeak | None,
               amd: bool) -> tuple[list[RooflineRow], dict, float, list[str]]:
    """Rows by class and precision, the overall figures, the time the FLOPs need at peak (ns) and notes."""
    tl = view.tl
    names = tl.names
    classes = [op_class(n) for n in names]
    cls_code = np.array([COMPUTE_CLASSES.index(c) if c in COMPUTE_CLASSES else (3 if c == "elementwise" else -1)
                         for c in classes], np.int8)
    cand = np.flatnonzero(view.is_cpu_op & (view.h_dims >= 0))
    if len(cls_code):
        cand = cand[cls_code[view.h_name[cand]] >= 0]
    # one estimate per distinct (name, dims, types, concrete)
    concrete_col = view.h_concrete if len(view.h_concrete) == len(view.h_name) else np.full(len(view.h_name), -1, np.int32)
    keys = np.stack([view.h_name[cand], view.h_dims[cand], view.h_types[cand], concrete_col[cand]], axis=1)
    flops = np.zeros(len(cand), np.int64)
    nbytes = np.zeros(len(cand), np.int64)
    dtypes: list[str] = []
    dtype_idx = np.zeros(len(cand), np.int16)
    ok = np.zeros(len(cand), bool)
    if len(cand):
        uniq, inv = _unique_rows(keys)
        parsed: dict[int, list] = {}

        def load(i: int) -> list:
            if i < 0:
                return []
            v = parsed.get(i)
            if v is None:
                try:
                    v = json.loads(tl.string_of(i))
                except ValueError:
                    v = []
                parsed[i] = v if isinstance(v, list) else []
            return parsed[i]

        u_flops = np.zeros(len(uniq), np.int64)
        u_bytes = np.zeros(len(uniq), np.int64)
        u_dtype = np.zeros(len(uniq), np.int16)
        u_ok = np.zeros(len(uniq), bool)
        for j, (n, d, t, c) in enumerate(uniq.tolist()):
            w = estimate(names[n], load(d), load(t), load(c))
            if w is None:
                continue
            u_ok[j] = True
            u_flops[j], u_bytes[j] = min(w.flops, 2**62), min(w.bytes, 2**62)
            if w.dtype not in dtypes:
                dtypes.append(w.dtype)
            u_dtype[j] = dtypes.index(w.dtype)
        flops, nbytes, dtype_idx, ok = u_flops[inv], u_bytes[inv], u_dtype[inv], u_ok[inv]
    ccode = cls_code[view.h_name[cand]] if len(cand) else np.zeros(0, np.int8)
    ts, end, thread = view.h_ts, view.h_end, view.h_thread
    compute = _innermost(cand[ok & (ccode < 3)], ts, end, thread)
    c_look = _Disjoint(compute, ts, end, thread)
    # elementwise ops outside every modelled compute op; ops of compute kind without an estimate
    def outside_compute(idx: np.ndarray) -> np.ndarray:
        pos = c_look.find(thread[idx], ts[idx], end[idx])
        return idx[pos < 0]

    elementwise = _innermost(outside_compute(cand[ok & (ccode == 3)]), ts, end, thread)
    e_look = _Disjoint(elementwise, ts, end, thread)
    unmodelled = _outermost(outside_compute(cand[~ok & (ccode < 3)]), ts, end, thread)
    u_look = _Disjoint(unmodelled, ts, end, thread)
    # each kernel's launch call (not a graph launch), else its external id
    launch = view.dev_launch[kidx]
    graph = _name_table(view, _GRAPH_LAUNCH)
    has_launch = launch >= 0
    safe = np.maximum(launch, 0)
    from_graph = has_launch & graph.take(view.h_name[safe]) if len(graph) else np.zeros(len(kidx), bool)
    lt, lth = ts[safe], thread[safe]

    def attribute(look: _Disjoint) -> np.ndarray:
        pos = np.full(len(kidx), -1, np.int64)
        q = np.flatnonzero(has_launch & ~from_graph)
        pos[q] = look.find(lth[q], lt[q])
        rest = np.flatnonzero(~has_launch)
        if len(rest) and len(look.idx):
            op = view.op_of_external(view.d_ext[kidx[rest]])
            order = np.argsort(look.idx)
            at = np.searchsorted(look.idx[order], op)
            atc = np.minimum(at, len(order) - 1)
            hit = (op >= 0) & (look.idx[order][atc] == op)
            pos[rest[hit]] = order[atc[hit]]
        return pos

    c_pos = attribute(c_look)
    e_pos = np.where(c_pos < 0, attribute(e_look), -1)
    u_pos = np.where((c_pos < 0) & (e_pos < 0), attribute(u_look), -1)
    dur = view.d_dur[kidx]
    tc = _name_table(view, _TF32_KERNEL)[view.d_name[kidx]] if len(names) else np.zeros(len(kidx), bool)
    cand_pos = np.full(len(view.h_name), -1, np.int64)  # host index -> position in cand
    cand_pos[cand] = np.arange(len(cand))
    labels = [*dtypes, "tf32"]  # precision codes: dtypes' own, then float32 on TF32 kernels
    rows: list[RooflineRow] = []
    totals = {"flops": 0, "ns": 0, "peak_ns": 0.0, "peak_kernel_ns": 0, "by_dtype": {}}
    notes: list[str] = []
    for look, pos, compute_rows in ((c_look, c_pos, True), (e_look, e_pos, False)):
        if not len(look.idx):
            continue
        m = pos >= 0
        n_ops = len(look.idx)
        op_ns = np.bincount(pos[m], weights=dur[m], minlength=n_ops).astype(np.int64)
        op_k = np.bincount(pos[m], minlength=n_ops)
        op_tc = np.bincount(pos[m], weights=(dur * tc)[m], minlength=n_ops)
        used = np.flatnonzero(op_k > 0)  # ops with a kernel in the window
        js = cand_pos[look.idx[used]]
        dt = dtype_idx[js].astype(np.int64)
        if compute_rows and not amd and "fp32" in dtypes:
            on_tf32 = (dt == dtypes.index("fp32")) & (op_tc[used] > TF32_KERNEL_SHARE * op_ns[used])
            dt = np.where(on_tf32, len(dtypes), dt)
        name_ids = view.h_name[look.idx[used]].astype(np.int64)
        key = cls_code[name_ids].astype(np.int64) * (len(labels) + 1) + dt
        for k in np.unique(key).tolist():
            sel = key == k
            ps, jj = used[sel], js[sel]
            cls = COMPUTE_CLASSES[k // (len(labels) + 1)] if k // (len(labels) + 1) < 3 else "elementwise"
            d = labels[k % (len(labels) + 1)]
            ns, fl, by = int(op_ns[ps].sum()), int(flops[jj].sum()), int(nbytes[jj].sum())
            ids, inv_n = np.unique(name_ids[sel], return_inverse=True)
            per_name = np.bincount(inv_n.reshape(-1), weights=op_ns[ps])
            top = names[int(ids[int(np.argmax(per_name))])]
            rows.append(_row(cls, d, len(ps), int(op_k[ps].sum()), ns, fl, by, peak, top))
            if compute_rows:
                totals["flops"] += fl
                totals["ns"] += ns
                totals["by_dtype"][d] = totals["by_dtype"].get(d, 0) + fl
                pk = peak_tflops(peak, d)
                if pk:
                    totals["peak_ns"] += fl / (pk * 1e3)
                    totals["peak_kernel_ns"] += ns
                elif peak is not None:
                    notes.append(f"{cls} in {d}: {peak.name} has no {d} peak in the table; left out of the share of peak")
    rows.sort(key=lambda r: (-r.kernel_ns, r.op_class, r.dtype))
    u_ns = int(dur[u_pos >= 0].sum())
    if u_ns:
        u_names = sorted({names[int(view.h_name[u_look.idx[p]])] for p in np.unique(u_pos[u_pos >= 0]).tolist()})
        notes.append(f"{u_ns / 1e6:.3f} ms of kernels of matmul/conv/attention ops without usable shapes "
                     f"({', '.join(u_names[:4])}{' …' if len(u_names) > 4 else ''}): not in the FLOPs"
                     + ("; a forward convolution needs Concrete Inputs (stride, padding), which PyTorch records "
                        "from 2.x on" if any("conv" in n for n in u_names) else ""))
    ns_all = totals["ns"]
    kernel_ns = int(dur.sum())
    figures = dict(
        modelled_kernel_ns=ns_all,
        modelled_pct=_pct(ns_all, kernel_ns),
        estimated_flops=totals["flops"],
        achieved_tflops=round(totals["flops"] / ns_all / 1e3, 3) if ns_all else None,
        peak_pct=_pct(totals["peak_ns"], totals["peak_kernel_ns"]) if totals["peak_kernel_ns"] else None,
        dtype=max(sorted(totals["by_dtype"]), key=lambda k: totals["by_dtype"][k]) if totals["by_dtype"] else "",
        unmodelled_ns=u_ns,
    )
    return rows, figures, float(totals["peak_ns"]), notes
