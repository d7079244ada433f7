"""Benchmark: ``gpudoctor analyze`` on real-GPU-shaped traces, side by side with ``json.load``.

    python benchmarks/analyze.py                      # ~320 MB in each layout, 8 ranks of ~45 MB
    python benchmarks/analyze.py --repeat 5           # more interleaved rounds (default 3)
    python benchmarks/analyze.py --source FILE        # tile another trace (.json or .json.gz)
    python benchmarks/analyze.py --keep DIR           # keep the generated traces in DIR
    python benchmarks/analyze.py --size-mb 5 --rank-mb 1 --ranks 3 --repeat 1 --no-targets   # a smoke run

**The traces.** A real A100 trace from ``../shared/traces`` (rank 0 of 16 from Holistic
Trace Analysis' tests: 109k events of cpu ops, runtime calls, kernels, memcpys and flow
events) is tiled until the file reaches ``--size-mb``: each copy is shifted in time and
its correlation ids, external ids and ProfilerStep numbers are shifted past the previous
copy's, so the result is one long, consistent trace with the real trace's proportions.
It is written in three layouts: one event per line, minified (what ``json.dump``, HTA's
filters and many tools write: no newline at all), and gzipped in Kineto's own layout (what
``torch.profiler`` writes to ``*.pt.trace.json.gz``). Without ``../shared/traces`` a
synthetic training trace stands in (``generate_trace``). Then ``--ranks`` rank traces of
``--rank-mb`` each (one event per line, ``distributedInfo`` rank 0..N-1) in one folder.

**The contenders**, each its own process, in interleaved rounds (gpudoctor, json.load,
HTA, gpudoctor, …) so a change in the machine's load hits all alike; the best round of
each is compared, and every round is printed:

- ``gpudoctor analyze --format json FILE``: the whole command (start-up, parse, every
  metric, rules, report), ``--jobs`` left at its default (the cores available);
- ``python -c "json.load(...)"``: a bare load of the same file (the floor of any json-based
  tool);
- Holistic Trace Analysis (``get_temporal_breakdown``) when ``hta`` is importable (it is
  not installed by default; this script installs nothing);
- the rank folder: ``gpudoctor analyze --jobs 1`` and ``--jobs N`` (N = the cores available).

Wall time and peak memory come from a helper process per run: the peak RSS of the
largest single process of the run (``getrusage(RUSAGE_CHILDREN)``) in the timed rounds,
and in one more round, sampled every 50 ms, the peak of the **sum** of the proportional
set sizes (PSS) of gpudoctor and its worker processes (pages shared after ``fork`` counted
once): the memory the whole command holds at once.

Before the rounds, gpudoctor's modules are byte-compiled (``compileall``), as ``pip install``
does for an installed package; an editable install under ``PYTHONDONTWRITEBYTECODE`` would
compile them again at each start.

**Targets** (ratios measured in one run; the script exits 1 when one is missed, unless
``--no-targets``): in each layout gpudoctor ≥ 4× faster than ``json.load`` (5× is the goal
we keep, printed but not enforced) with peak memory ≤ 300 MB (both measures); the rank
folder ``--jobs N`` ≥ 1.6× faster than ``--jobs 1`` (with at least 2 cores available).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_SOURCE = ROOT.parent / "shared" / "traces" / "hta" / "a100_rank0_of16_negative_queue.json.gz"
LAYOUTS = ("lines", "minified", "gzip")
TARGET_X = 4.0  # gpudoctor vs json.load, every layout
GOAL_X = 5.0
TARGET_RSS_MB = 300.0
TARGET_JOBS_X = 1.6  # rank folder: --jobs N vs --jobs 1

# --------------------------------------------------------------------------- generator


class _Writer:
    """Writes events in Kineto's ChromeTraceLogger layout."""

    def __init__(self, fh) -> None:
        self.fh = fh
        self.first = True
        self.count = 0

    def _sep(self) -> None:
        if self.first:
            self.first = False
        else:
            self.fh.write(",")
        self.count += 1

    def x(self, cat: str, name: str, pid, tid, ts: float, dur: float, args: str | None) -> None:
        self._sep()
        name = json.dumps(name)
        if args is None:
            self.fh.write(
                f'\n  {{\n    "ph": "X", "cat": "{cat}", "name": {name}, "pid": {pid}, "tid": {tid},\n'
                f'    "ts": {ts:.3f}, "dur": {dur:.3f}\n  }}'
            )
        else:
            self.fh.write(
                f'\n  {{\n    "ph": "X", "cat": "{cat}", "name": {name}, "pid": {pid}, "tid": {tid},\n'
                f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n      {args}\n    }}\n  }}'
            )

    def flow(self, ph: str, fid: int, pid, tid, ts: float) -> None:
        self._sep()
        bp = ', "bp": "e"' if ph == "f" else ""
        self.fh.write(
            f'\n  {{\n    "ph": "{ph}", "id": {fid}, "pid": {pid}, "tid": {tid}, "ts": {ts:.3f},\n'
            f'    "cat": "ac2g", "name": "ac2g"{bp}\n  }}'
        )


_KERNELS = {
    "aten::addmm": "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "aten::mm": "ampere_sgemm_128x64_nn",
    "aten::relu": "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)",
    "aten::threshold_backward": "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, at::native::(anonymous namespace)::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, at::detail::Array<char*, 3>)",
    "aten::_foreach_add_": "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)",
    "aten::nll_loss_forward": "void cunn_ClassNLLCriterion_updateOutput_kernel<float, float, long>(float*, float*, float*, long*, float*, int, int, int, int, long)",
}


def generate_trace(path: Path, target_bytes: int, seed: int = 0) -> int:
    """Write a Kineto-layout training trace of at least ``target_bytes``; returns the event count."""
    rng = random.Random(seed)
    opener = gzip.open if path.suffix == ".gz" else open
    pid, main, bwd = 4242, 4242, 4301
    t = 1_700_000_000_000.0  # µs, like baseTimeNanoseconds-relative traces
    gpu_t = t
    ext = 1
    corr = 100_000
    ev_idx = 0
    step = 0
    written = 0
    with opener(path, "wt", encoding="utf-8") as fh:  # type: ignore[operator]
        fh.write(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n      "id": 0, "name": "NVIDIA A100-SXM4-80GB", '
            '"totalGlobalMem": 85051572224,\n      "computeMajor": 8, "computeMinor": 0,\n'
            '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
            '      "regsPerBlock": 65536, "warpSize": 32,\n      "sharedMemPerBlock": 49152, "numSms": 108\n    }\n  ],\n'
            '  "record_shapes": 1,\n  "with_stack": 1,\n  "traceEvents": ['
        )
        w = _Writer(fh)

        def op_args(dims: str, types: str, seq: int | None) -> str:
            nonlocal ext, ev_idx
            ext += 1
            ev_idx += 1
            s = (
                f'"External id": {ext},"Record function id": 0, "Concrete Inputs": ["", "", ""], '
                f'"Input type": {types}, "Input Strides": [[512, 1], [1, 512], [1]], "Input Dims": {dims}, '
                f'"Ev Idx": {ev_idx}'
            )
            if seq is not None:
                s += f', "Sequence number": {seq}, "Fwd thread id": 0'
            return s

        def py_stack(frames: list[str], ts: float, dur: float, tid: int) -> None:
            nonlocal ev_idx
            for depth, fr in enumerate(frames):
                ev_idx += 1
                w.x(
                    "python_function", fr, pid, tid, ts + depth * 0.4, dur - depth * 0.8,
                    f'"Python parent id": {ev_idx - 1}, "Python id": {ev_idx}, "Ev Idx": {ev_idx}',
                )

        def launch(opname: str, ts: float, tid: int, kdur: float, seq: int | None) -> float:
            """An op with one kernel; returns the host time after it."""
            nonlocal corr, gpu_t
            dims = "[[64, 512], [512, 512], [512]]"
            types = '["float", "float", "float"]'
            op_dur = 18.0 + rng.random() * 6
            w.x("cpu_op", opname, pid, tid, ts, op_dur, op_args(dims, types, seq))
            corr += 1
            lts = ts + op_dur - 7.5
            w.x("cuda_runtime", "cudaLaunchKernel", pid, tid, lts, 5.2,
                f'"External id": {ext}, "cbid": 211, "correlation": {corr}')
            w.flow("s", corr, pid, tid, lts)
            kts = max(gpu_t + 1.2, lts + 4.0)
            gpu_t = kts + kdur
            w.x("kernel", _KERNELS.get(opname, _KERNELS["aten::relu"]), 0, 7, kts, kdur,
                f'"External id": {ext},\n      "queued": 0, "device": 0, "context": 1,\n      "stream": 7, '
                f'"correlation": {corr},\n      "registers per thread": 64,\n      "shared memory": 0,\n'
                f'      "blocks per SM": 2.4, "warps per SM": 9.6,\n      "grid": [256, 1, 1],\n'
                f'      "block": [128, 1, 1],\n      "est. achieved occupancy %": 15')
            w.flow("f", corr, 0, 7, kts)
            return ts + op_dur + 1.0

        def memcpy(name: str, direction: str, ts: float, tid: int, nbytes: int, sync: bool) -> float:
            nonlocal corr, gpu_t
            op_dur = 40.0
            w.x("cpu_op", "aten::copy_", pid, tid, ts, op_dur + (30 if sync else 0),
                op_args("[[64, 512], [64, 512], []]", '["float", "float", "Scalar"]', None))
            corr += 1
            w.x("cuda_runtime", "cudaMemcpyAsync", pid, tid, ts + 5, 12.0,
                f'"External id": {ext}, "cbid": 41, "correlation": {corr}')
            w.flow("s", corr, pid, tid, ts + 5)
            kts = max(gpu_t + 1.0, ts + 10)
            dur = nbytes / 12_000.0
            gpu_t = kts + dur
            w.x("gpu_memcpy", name, 0, 7, kts, dur,
                f'"External id": {ext},\n      "device": 0, "context": 1,\n      "stream": 7, "correlation": {corr},\n'
                f'      "bytes": {nbytes}, "memory bandwidth (GB/s)": 12.0')
            w.flow("f", corr, 0, 7, kts)
            end = ts + op_dur
            if sync:
                corr += 1
                sdur = max(gpu_t - (ts + 20), 2.0) + 3
                w.x("cuda_runtime", "cudaStreamSynchronize", pid, tid, ts + 20, sdur,
                    f'"External id": {ext}, "cbid": 131, "correlation": {corr}')
                end = ts + 20 + sdur + 5
            return end

        layers = 24
        while True:
            step += 1
            step_start = t
            # data loading with a Python stack
            dl = 900.0 + rng.random() * 300
            w.x("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", pid, main, t, dl,
                f'"External id": {ext}, "Ev Idx": {ev_idx}')
            py_stack(["train.py(88): train", "torch/utils/data/dataloader.py(701): __next__",
                      "torch/utils/data/dataloader.py(1448): _next_data"], t, dl, main)
            t += dl + 5
            # H2D copy of the batch
            t = memcpy("Memcpy HtoD (Pinned -> Device)", "HtoD", t, main, 64 * 512 * 4, False)
            # forward
            for layer in range(layers):
                frames = ["train.py(92): train", "torch/nn/modules/module.py(1751): _wrapped_call_impl",
                          "torch/nn/modules/module.py(1762): _call_impl", f"model.py({40 + layer % 7}): forward",
                          "torch/nn/modules/linear.py(125): forward", "<built-in function linear>"]
                py_stack(frames, t - 3, 60.0, main)
                w.x("cpu_op", "aten::linear", pid, main, t, 50.0,
                    op_args("[[64, 512], [512, 512], [512]]", '["float", "float", "float"]', step * 1000 + layer))
                t = launch("aten::addmm", t + 2, main, 30.0 + rng.random() * 10, step * 1000 + layer)
                t = launch("aten::relu", t + 1, main, 3.0 + rng.random() * 3, step * 1000 + layer)
                t += 8
            t = launch("aten::nll_loss_forward", t, main, 4.0, step * 1000 + 999)
            # loss.item(): D2H + sync
            w.x("cpu_op", "aten::item", pid, main, t, 80.0, op_args("[[]]", '["float"]', None))
            py_stack(["train.py(97): train", "<built-in method item of Tensor object at 0x7f>"], t - 2, 84.0, main)
            t = memcpy("Memcpy DtoH (Device -> Pageable)", "DtoH", t + 1, main, 4, True)
            # backward on the autograd thread
            bt = t + 20
            for layer in reversed(range(layers)):
                w.x("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", pid, bwd, bt, 70.0,
                    op_args("[]", "[]", step * 1000 + layer))
                bt = launch("aten::mm", bt + 2, bwd, 35.0 + rng.random() * 10, step * 1000 + layer)
                bt = launch("aten::mm", bt, bwd, 35.0 + rng.random() * 10, step * 1000 + layer)
                bt = launch("aten::threshold_backward", bt, bwd, 3.5, step * 1000 + layer)
            t = max(bt, gpu_t - 200) + 10
            # optimizer
            opt_start = t
            for _ in range(8):
                t = launch("aten::_foreach_add_", t, main, 12.0, None)
            w.x("user_annotation", "Optimizer.step#AdamW.step", pid, main, opt_start - 2, t - opt_start + 4,
                f'"External id": {ext}, "Ev Idx": {ev_idx}')
            t += 30
            w.x("user_annotation", f"ProfilerStep#{step}", pid, main, step_start - 1, t - step_start + 1,
                f'"External id": {ext}, "Ev Idx": {ev_idx}')
            t += 10
            if step % 20 == 0:
                written = fh.tell() if opener is open else os.path.getsize(path)
                if written >= target_bytes:
                    break
        fh.write(
            ',\n  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n    "pid": "", "tid": "", '
            f'"ts": {t:.3f}\n  }}\n  ],\n  "traceName": "{path.name}",\n  "displayTimeUnit": "ms",\n'
            '  "baseTimeNanoseconds": 1700000000000000000\n}\n'
        )
    return w.count + 1


# --------------------------------------------------------------------------- tiling


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        obj = json.load(fh)
    return {"traceEvents": obj} if isinstance(obj, list) else obj


def tiles(obj: dict, rank: int | None = None, world: int | None = None) -> Iterator[dict]:
    """The events of ``obj`` again and again, each copy shifted past the previous one
    (time, correlation and external ids, flow ids, ProfilerStep numbers). Endless."""
    events = obj["traceEvents"]
    timed = [e for e in events if isinstance(e, dict) and isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    span = int(t1 - t0) + 1000
    ids = [e.get("id", 0) for e in events if isinstance(e, dict) and isinstance(e.get("id"), int)]
    args = [e["args"] for e in events if isinstance(e, dict) and isinstance(e.get("args"), dict)]
    corr_step = max([a.get("correlation", 0) for a in args if isinstance(a.get("correlation"), int)] + ids + [0]) + 1
    ext_step = max([a.get("External id", 0) for a in args if isinstance(a.get("External id"), int)] + [0]) + 1
    steps = [int(e["name"][13:]) for e in events if isinstance(e, dict)
             and str(e.get("name", "")).startswith("ProfilerStep#") and e["name"][13:].isdigit()]
    step_step = max(steps) - min(steps) + 1 if steps else 0
    k = 0
    while True:
        for e in events:
            if not isinstance(e, dict) or (k and e.get("ph") == "M"):
                continue
            if k:
                e = dict(e)
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = e["ts"] + k * span
                if isinstance(e.get("id"), int):
                    e["id"] += k * corr_step
                a = e.get("args")
                if isinstance(a, dict):
                    a = dict(a)
                    if isinstance(a.get("correlation"), int):
                        a["correlation"] += k * corr_step
                    if isinstance(a.get("External id"), int):
                        a["External id"] += k * ext_step
                    e["args"] = a
                name = e.get("name")
                if step_step and isinstance(name, str) and name.startswith("ProfilerStep#") and name[13:].isdigit():
                    e["name"] = f"ProfilerStep#{int(name[13:]) + k * step_step}"
            yield e
        k += 1


def _kineto_block(e: dict) -> str:
    """One event as Kineto's ChromeTraceLogger writes it (indented lines, args on their own)."""
    d = json.dumps
    first = ", ".join(f"{d(k)}: {d(v)}" for k, v in e.items() if k not in ("ts", "dur", "args"))
    timing = ", ".join(f'"{k}": {d(e[k])}' for k in ("ts", "dur") if k in e)
    out = "  {\n    " + first + (",\n    " + timing if timing else "")
    if isinstance(e.get("args"), dict):
        out += ',\n    "args": {\n      ' + ", ".join(f"{d(k)}: {d(v)}" for k, v in e["args"].items()) + "\n    }"
    return out + "\n  }"


def write_tiled(obj: dict, path: Path, layout: str, target_bytes: int, rank: int | None = None,
                world: int | None = None) -> int:
    """Write ``obj`` tiled to at least ``target_bytes`` of JSON in ``layout``; the event count."""
    header = {k: v for k, v in obj.items() if k not in ("traceEvents", "traceName", "displayTimeUnit",
                                                          "baseTimeNanoseconds")}
    if rank is not None:
        header["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    tail = {k: obj[k] for k in ("traceName", "displayTimeUnit", "baseTimeNanoseconds") if k in obj}
    opener = (lambda p: gzip.open(p, "wt", encoding="utf-8", compresslevel=6)) if layout == "gzip" else (
        lambda p: open(p, "w", encoding="utf-8"))
    written = 0
    n = 0
    with opener(path) as fh:
        def put(s: str) -> None:
            nonlocal written
            fh.write(s)
            written += len(s)

        if layout == "minified":
            put(json.dumps(header, separators=(",", ":"))[:-1] + (',' if header else '') + '"traceEvents":[')
        elif layout == "lines":
            put(json.dumps(header)[:-1] + (", " if header else "") + '"traceEvents": [\n')
        else:
            put("{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in header.items())
                + '  "traceEvents": [\n')
        for e in tiles(obj):
            if n:
                put("," if layout == "minified" else ",\n")
            if layout == "minified":
                put(json.dumps(e, separators=(",", ":")))
            elif layout == "lines":
                put(json.dumps(e))
            else:
                put(_kineto_block(e))
            n += 1
            if written >= target_bytes and e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"):
                break
            if written >= target_bytes * 1.05:
                break
        if layout == "minified":
            put("]" + "".join(f",{json.dumps(k)}:{json.dumps(v, separators=(',', ':'))}" for k, v in tail.items())
                + "}")
        else:
            put("\n  ]" + "".join(f",\n  {json.dumps(k)}: {json.dumps(v)}" for k, v in tail.items()) + "\n}\n")
    return n


# --------------------------------------------------------------------------- timing

_HELPER = r"""
import json, resource, subprocess, sys, time
sample = sys.argv[1] == "1"
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
peak_pss = 0
if sample:
    import psutil
    root = psutil.Process(p.pid)
    while p.poll() is None:
        total = 0
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for q in procs:
            try:
                total += q.memory_full_info().pss
            except psutil.Error:
                pass
        peak_pss = max(peak_pss, total)
        time.sleep(0.05)
err = p.communicate()[1]
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = ru.ru_utime + ru.ru_stime
print(json.dumps([wall, ru.ru_maxrss * 1024, peak_pss, p.returncode, err.decode(errors="replace")[-400:], cpu]))
"""


def _run(argv: list[str], sample: bool = False) -> tuple[float, int, int, int, str, float]:
    """Run argv in a fresh process: (wall s, peak RSS of its largest process, peak PSS of its
    process tree (0 unless ``sample``), exit code, stderr tail, CPU s of all its processes)."""
    out = subprocess.run([sys.executable, "-c", _HELPER, "1" if sample else "0", *argv],
                         capture_output=True, text=True, check=True)
    wall, rss, pss, rc, err, cpu = json.loads(out.stdout)
    return wall, rss, pss, rc, err, cpu


def _gpudoctor(*args: str) -> list[str]:
    exe = shutil.which("gpudoctor")
    return [exe, *args] if exe else [sys.executable, "-m", "gpudoctor", *args]


def _json_load(trace: Path) -> list[str]:
    opener = "gzip.open" if trace.name.endswith(".gz") else "open"
    return [sys.executable, "-c", f"import json, gzip; json.load({opener}({str(trace)!r}, 'rb'))"]


def _hta(trace: Path) -> list[str] | None:
    try:
        import hta  # noqa: F401
    except ImportError:
        return None
    code = (
        "import sys, shutil, tempfile, os\n"
        "from hta.trace_analysis import TraceAnalysis\n"
        "d = tempfile.mkdtemp(); shutil.copy(sys.argv[1], os.path.join(d, 'rank-0.json' + "
        "('.gz' if sys.argv[1].endswith('.gz') else '')))\n"
        "TraceAnalysis(trace_dir=d).get_temporal_breakdown(visualize=False)\n"
    )
    return [sys.executable, "-c", code, str(trace)]


def _json_bytes(trace: Path) -> int:
    if not trace.name.endswith(".gz"):
        return trace.stat().st_size
    n = 0
    with gzip.open(trace, "rb") as fh:
        while block := fh.read(16 << 20):
            n += len(block)
    return n


def _imports_torch() -> bool | None:
    """Whether ``gpudoctor analyze`` imports torch (on a tiny trace, with an exit hook)."""
    with tempfile.TemporaryDirectory() as d:
        tiny = Path(d) / "tiny.pt.trace.json"
        generate_trace(tiny, 1)
        code = (
            "import atexit, os, sys\n"
            "atexit.register(lambda: os.write(2, b'TORCH=%d' % ('torch' in sys.modules)))\n"
            f"sys.argv = ['gpudoctor', 'analyze', '--format', 'json', {str(tiny)!r}]\n"
            "from gpudoctor.cli import main; main()\n"
        )
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if "TORCH=" not in p.stderr:
            return None
        return p.stderr.rsplit("TORCH=", 1)[1].startswith("1")


def _rounds(contenders: list[tuple[str, list[str]]], repeat: int) -> dict[str, list[tuple]]:
    runs: dict[str, list[tuple]] = {name: [] for name, _ in contenders}
    for _ in range(repeat):
        for name, argv in contenders:
            runs[name].append(_run(argv))
    for name, argv in contenders:  # one more round for the memory of the whole process tree
        if name.startswith("gpudoctor"):
            runs[name].append(_run(argv, sample=True))
    return runs


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, help="the trace to tile (default: ../shared/traces' A100 rank 0 of 16)")
    ap.add_argument("--size-mb", type=float, default=320.0, help="size of each single-trace layout (MB of JSON)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}, kineto")
    ap.add_argument("--ranks", type=int, default=8, help="rank traces in the folder case (0: skip it)")
    ap.add_argument("--rank-mb", type=float, default=45.0, help="size of each rank trace (MB)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved timed rounds; the best of each is compared")
    ap.add_argument("--keep", type=Path, help="folder to write the traces to and keep them in")
    ap.add_argument("--reuse", action="store_true", help="with --keep: use the traces already there")
    ap.add_argument("--no-targets", action="store_true", help="print the figures, exit 0 whatever they are")
    args = ap.parse_args(argv)

    source = args.source or (SHARED_SOURCE if SHARED_SOURCE.is_file() else None)
    tmp = None
    folder = args.keep or Path(tmp := tempfile.mkdtemp(prefix="gpudoctor-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    try:
        t0 = time.perf_counter()
        if source is not None:
            obj = _load(source)
            what = f"{source.name} ({len(obj['traceEvents']):,} events) tiled"
        else:
            synth = folder / "synthetic.pt.trace.json"
            generate_trace(synth, 30_000_000)
            obj = _load(synth)
            synth.unlink()
            what = "a synthetic training trace (../shared/traces is absent) tiled"
        traces: list[tuple[str, Path, int]] = []
        for layout in [x.strip() for x in args.layouts.split(",") if x.strip()]:
            if layout not in (*LAYOUTS, "kineto"):
                ap.error(f"unknown layout {layout!r}")
            path = folder / f"bench-{layout}.pt.trace.json{'.gz' if layout == 'gzip' else ''}"
            if args.reuse and path.is_file():
                n = -1
            else:
                n = write_tiled(obj, path, layout, int(args.size_mb * 1e6))
            traces.append((layout, path, n))
        rank_dir = folder / "ranks"
        if args.ranks:
            rank_dir.mkdir(exist_ok=True)
            for r in range(args.ranks):
                rp = rank_dir / f"rank{r}.pt.trace.json"
                if not (args.reuse and rp.is_file()):
                    write_tiled(obj, rp, "lines", int(args.rank_mb * 1e6), r, args.ranks)
        print(f"traces: {what}, written in {time.perf_counter() - t0:.0f} s to {folder}", file=sys.stderr)
        # gpudoctor's modules byte-compiled, as pip does when it installs the package: an editable
        # install run with PYTHONDONTWRITEBYTECODE (this machine's setting) compiles them at every start
        # (~0.08 s of each run here)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "gpudoctor")], check=False,
                       stdout=subprocess.DEVNULL)
        print("machine: " + f"{_cores()} cores available, load average {os.getloadavg()[0]:.2f} at the start")

        for layout, path, n in traces:
            size_mb = _json_bytes(path) / 1e6
            contenders = [("gpudoctor analyze", _gpudoctor("analyze", "--format", "json", str(path))),
                          ("json.load", _json_load(path))]
            hta = _hta(path)
            if hta:
                contenders.append(("Holistic Trace Analysis", hta))
            runs = _rounds(contenders, args.repeat)
            gz = f", {path.stat().st_size / 1e6:.0f} MB gzipped" if path.name.endswith(".gz") else ""
            events = f"{n:,} events" if n >= 0 else "reused"
            print(f"\n[{layout}] {path.name}: {size_mb:.0f} MB of JSON{gz}, {events}; "
                  f"{args.repeat} interleaved round(s), best time of each")
            print(f"  {'contender':<26} {'time s':>7} {'MB/s':>7} {'max RSS MB':>11} {'tree PSS MB':>12} {'exit':>5}"
                  "  all times s")
            best = {}
            for name, _ in contenders:
                timed = runs[name][: args.repeat]
                b = min(timed, key=lambda r: r[0])
                rss = max(r[1] for r in runs[name])
                pss = max(r[2] for r in runs[name])
                best[name] = (b[0], rss, pss, min(r[5] for r in timed))
                print(f"  {name:<26} {b[0]:7.2f} {size_mb / b[0]:7.1f} {rss / 1e6:11.0f} "
                      f"{(f'{pss / 1e6:.0f}' if pss else '-'):>12} {max(r[3] for r in runs[name]):>5}  "
                      + " ".join(f"{r[0]:.2f}" for r in timed))
                for r in runs[name]:
                    if r[3] != 0:
                        failures.append(f"{layout}: {name} failed (exit {r[3]}): {r[4]}")
            g_time, g_rss, g_pss, g_cpu = best["gpudoctor analyze"]
            ratio = best["json.load"][0] / g_time
            print(f"  json.load / gpudoctor: x{ratio:.2f} (target ≥ {TARGET_X:g}, goal {GOAL_X:g}); "
                  f"gpudoctor peak memory: largest process {g_rss / 1e6:.0f} MB, whole tree {g_pss / 1e6:.0f} MB "
                  f"(target ≤ {TARGET_RSS_MB:.0f}); json.load peak RSS x{best['json.load'][1] / g_rss:.1f} gpudoctor's")
            print(f"  CPU time (all processes, least of the rounds): gpudoctor {g_cpu:.2f} s, json.load "
                  f"{best['json.load'][3]:.2f} s: x{best['json.load'][3] / g_cpu:.2f} (load-independent; not a target)")
            if "Holistic Trace Analysis" in best:
                print(f"  HTA / gpudoctor: x{best['Holistic Trace Analysis'][0] / g_time:.2f}")
            if ratio < TARGET_X:
                failures.append(f"{layout}: x{ratio:.2f} of json.load, under {TARGET_X:g}")
            if max(g_rss, g_pss) / 1e6 > TARGET_RSS_MB:
                failures.append(f"{layout}: peak memory {max(g_rss, g_pss) / 1e6:.0f} MB, over {TARGET_RSS_MB:.0f}")

        if args.ranks:
            cores = _cores()
            total = sum(p.stat().st_size for p in rank_dir.iterdir()) / 1e6
            contenders = [("gpudoctor analyze --jobs 1", _gpudoctor("analyze", "--format", "json", "--jobs", "1",
                                                                     str(rank_dir))),
                          (f"gpudoctor analyze --jobs {cores}", _gpudoctor("analyze", "--format", "json", "--jobs",
                                                                            str(cores), str(rank_dir)))]
            runs = _rounds(contenders, args.repeat)
            print(f"\n[ranks] {args.ranks} rank traces, {total:.0f} MB of JSON in all (one event per line); "
                  f"{args.repeat} interleaved round(s)")
            print(f"  {'contender':<30} {'time s':>7} {'max RSS MB':>11} {'tree PSS MB':>12}  all times s")
            best_t = {}
            for name, _ in contenders:
                timed = runs[name][: args.repeat]
                b = min(timed, key=lambda r: r[0])
                best_t[name] = b[0]
                print(f"  {name:<30} {b[0]:7.2f} {max(r[1] for r in runs[name]) / 1e6:11.0f} "
                      f"{max(r[2] for r in runs[name]) / 1e6:12.0f}  " + " ".join(f"{r[0]:.2f}" for r in timed))
                for r in runs[name]:
                    if r[3] != 0:
                        failures.append(f"ranks: {name} failed (exit {r[3]}): {r[4]}")
            speedup = best_t[contenders[0][0]] / best_t[contenders[1][0]]
            print(f"  --jobs {cores} vs --jobs 1: x{speedup:.2f} (target ≥ {TARGET_JOBS_X:g} with 2+ cores)")
            if cores >= 2 and speedup < TARGET_JOBS_X:
                failures.append(f"ranks: --jobs {cores} x{speedup:.2f} of --jobs 1, under {TARGET_JOBS_X:g}")

        print(f"\ntorch imported by gpudoctor analyze: {_imports_torch()}")
        if _hta(Path("x")) is None:
            print("Holistic Trace Analysis: not installed here (skipped; this script installs nothing)")
        print(f"load average at the end: {os.getloadavg()[0]:.2f} (other work on the machine slows every contender)")
        for f in failures:
            print(f"MISSED: {f}")
        if failures and not args.no_targets:
            return 1
        print("all targets met" if not failures else "targets not enforced (--no-targets)")
        return 0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
