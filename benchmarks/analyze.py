"""Benchmark: ``gpudoctor analyze`` on a large Kineto trace, side by side with ``json.load``.

    python benchmarks/analyze.py                   # generate a 320 MB trace in a temp dir
    python benchmarks/analyze.py --size-mb 1200    # a bigger one
    python benchmarks/analyze.py --trace FILE      # an existing trace (.json or .json.gz)
    python benchmarks/analyze.py --keep DIR        # keep the generated trace in DIR
    python benchmarks/analyze.py --repeat 5        # interleaved rounds (default 3), best of each

Each contender runs as its own process (``/usr/bin/time``-style: wall time and peak RSS
from ``resource.getrusage(RUSAGE_CHILDREN)`` of a fresh child that runs only it):

- ``gpudoctor analyze --format json FILE``: the whole command (start-up, parse, every
  metric, rules, report). While the engine/report layers are not there yet it falls
  back to ``python -m gpudoctor.analysis FILE`` (start-up, parse, every metric, the
  metrics as JSON) and says so.
- ``python -c "json.load(...)"``: a bare load of the same file (the floor of any
  json-based tool).
- Holistic Trace Analysis (``TraceAnalysis(...).get_temporal_breakdown()``) when
  ``hta`` is importable (it is not installed by default; nothing is installed).

The contenders run in interleaved rounds (gpudoctor, json.load, HTA, gpudoctor, …) so
that a change in the machine's load hits them alike; the best time of each is reported
with all the others. It prints time, MB/s and peak RSS for each, and the ratios. The
issue's targets on a 2-core machine: gpudoctor ≥ 3× faster than json.load, peak RSS
≤ 300 MB for 300 MB.

The generated trace mimics what ``torch.profiler`` writes for a training loop with
``record_shapes=True, with_stack=True`` on one GPU, in Kineto's own layout: ProfilerStep
and DataLoader annotations, Python frames around every op, ops with input shapes and
dtypes, runtime launches tied to kernels by correlation ids and flow events, H2D/D2H
copies, a host sync per step, and an optimizer step.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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


# --------------------------------------------------------------------------- timing


def _run(argv: list[str]) -> tuple[float, int, int, str]:
    """Run argv in a fresh process; (wall s, peak RSS bytes, exit code, stderr tail)."""
    # A helper process measures one child so that the RSS maximum is of that child alone.
    code = (
        "import resource, subprocess, sys, time, json\n"
        "t0 = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
        "wall = time.perf_counter() - t0\n"
        "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(json.dumps([wall, ru.ru_maxrss * 1024, p.returncode, p.stderr.decode(errors='replace')[-400:]]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    wall, rss, rc, err = json.loads(out.stdout)
    return wall, rss, rc, err


def _gpudoctor_cmd(trace: Path) -> tuple[list[str], str]:
    exe = shutil.which("gpudoctor")
    full = [exe, "analyze", "--format", "json", str(trace)] if exe else None
    if full:
        # Does the whole command work here yet (engine and report layers present)?
        probe = subprocess.run(
            [sys.executable, "-c", "import gpudoctor.engine, gpudoctor.report; "
             "from gpudoctor.engine import diagnose; from gpudoctor.report import render"],
            capture_output=True,
        )
        if probe.returncode == 0:
            return full, "gpudoctor analyze --format json"
    return [sys.executable, "-m", "gpudoctor.analysis", str(trace)], "python -m gpudoctor.analysis (parse + metrics)"


def _json_bytes(trace: Path) -> int:
    """Size of the JSON text: the file, or its decompressed stream for .gz."""
    if not trace.name.endswith(".gz"):
        return trace.stat().st_size
    n = 0
    with gzip.open(trace, "rb") as fh:
        while block := fh.read(16 << 20):
            n += len(block)
    return n


def _imports_torch(cmd: list[str]) -> bool | None:
    """Whether the timed command imports torch (run again on a tiny trace, with an exit hook)."""
    with tempfile.TemporaryDirectory() as d:
        tiny = Path(d) / "tiny.pt.trace.json"
        generate_trace(tiny, 1)
        if cmd[0] == sys.executable:  # python -m gpudoctor.analysis TRACE
            argv = ["gpudoctor.analysis", str(tiny)]
            entry = "runpy.run_module('gpudoctor.analysis', run_name='__main__')"
        else:  # gpudoctor analyze … TRACE
            argv = ["gpudoctor", *cmd[1:-1], str(tiny)]
            entry = "from gpudoctor.cli import main; main()"
        code = (
            "import atexit, os, runpy, sys\n"
            "atexit.register(lambda: os.write(2, b'TORCH=%d' % ('torch' in sys.modules)))\n"
            f"sys.argv = {argv!r}\n{entry}\n"
        )
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if "TORCH=" not in p.stderr:
            return None
        return p.stderr.rsplit("TORCH=", 1)[1].startswith("1")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, help="an existing Kineto trace to time")
    ap.add_argument("--size-mb", type=float, default=320.0, help="size of the generated trace (MB)")
    ap.add_argument("--gz", action="store_true", help="generate a .json.gz trace")
    ap.add_argument("--keep", type=Path, help="folder to keep the generated trace in")
    ap.add_argument("--no-json-load", action="store_true", help="skip the json.load baseline")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds; the best of each is reported")
    args = ap.parse_args(argv)

    tmp = None
    if args.trace:
        trace = args.trace
    else:
        folder = args.keep or Path(tmp := tempfile.mkdtemp(prefix="gpudoctor-bench-"))
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / ("bench.pt.trace.json" + (".gz" if args.gz else ""))
        t0 = time.perf_counter()
        n = generate_trace(trace, int(args.size_mb * 1e6))
        print(f"generated {trace} ({trace.stat().st_size / 1e6:.0f} MB, {n:,} events) in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    size_mb = _json_bytes(trace) / 1e6  # MB/s are of JSON text (decompressed for .gz)
    try:
        cmd, label = _gpudoctor_cmd(trace)
        contenders: list[tuple[str, list[str]]] = [(label, cmd)]
        if not args.no_json_load:
            opener = "gzip.open" if trace.name.endswith(".gz") else "open"
            code = f"import json, gzip; json.load({opener}({str(trace)!r}, 'rb'))"
            contenders.append(("python -c json.load", [sys.executable, "-c", code]))
        try:
            import hta  # noqa: F401

            hta_ok = True
        except ImportError:
            hta_ok = False
        if hta_ok:
            code = (
                "import sys, shutil, tempfile, os\n"
                "from hta.trace_analysis import TraceAnalysis\n"
                "d = tempfile.mkdtemp(); shutil.copy(sys.argv[1], os.path.join(d, 'rank-0.json' + "
                "('.gz' if sys.argv[1].endswith('.gz') else '')))\n"
                "TraceAnalysis(trace_dir=d).get_temporal_breakdown(visualize=False)\n"
            )
            contenders.append(("Holistic Trace Analysis", [sys.executable, "-c", code, str(trace)]))
        # interleaved rounds: each round runs every contender once, so a change in the
        # machine's load hits all of them alike; the best round of each is reported
        runs: dict[str, list[tuple[float, int, int, str]]] = {name: [] for name, _ in contenders}
        for _ in range(args.repeat):
            for name, argv_ in contenders:
                runs[name].append(_run(argv_))
        torch_imported = _imports_torch(cmd)
        rows = []
        for name, _ in contenders:
            best = min(runs[name], key=lambda r: r[0])
            rows.append((name, best[0], max(r[1] for r in runs[name]), best[2], best[3],
                         sorted(r[0] for r in runs[name])))

        gz = f", {trace.stat().st_size / 1e6:.0f} MB gzipped" if trace.name.endswith(".gz") else ""
        print(f"trace: {trace} ({size_mb:.0f} MB of JSON{gz}), {args.repeat} interleaved round(s), best time of each")
        print(f"{'contender':<48} {'time s':>8} {'MB/s':>8} {'peak RSS MB':>12} {'exit':>5}  all times s")
        for name, wall, rss, rc, _, times in rows:
            print(f"{name:<48} {wall:8.2f} {size_mb / wall:8.1f} {rss / 1e6:12.0f} {rc:>5}  "
                  + " ".join(f"{t:.2f}" for t in times))
        base = rows[0]
        for name, wall, rss, *_ in rows[1:]:
            print(f"{name} / gpudoctor: time x{wall / base[1]:.2f}, peak RSS x{rss / base[2]:.2f}")
        print(f"gpudoctor peak RSS per MB of JSON: {base[2] / 1e6 / size_mb:.2f}")
        print(f"torch imported by the gpudoctor command: {torch_imported}")
        if not hta_ok:
            print("Holistic Trace Analysis: not installed here (skipped; nothing is installed by this script)")
        for name, _, _, rc, err, _ in rows:
            if rc != 0:
                print(f"{name} failed (exit {rc}): {err}", file=sys.stderr)
        return 0 if all(r[3] == 0 for r in rows) else 1
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
