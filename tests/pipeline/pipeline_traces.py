"""Kineto-like per-rank traces of a data-parallel job, written as JSON files.

Each rank records ``steps`` ProfilerStep windows: a forward and backward of ``layers``
ops (a ``cudaLaunchKernel`` and a kernel each, tied by correlation ids and flow events),
then an NCCL all-reduce. The straggler's kernels are slower; the other ranks wait in the
all-reduce, as in synchronized training.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def rank_trace(rank: int, world: int, *, steps: int = 6, layers: int = 12, straggler: int | None = 1,
               base_us: float = 1_700_000_000_000.0) -> dict:
    ev: list[dict] = [{"name": "process_name", "ph": "M", "pid": 100 + rank, "tid": 0, "ts": base_us,
                       "args": {"name": f"rank {rank}"}}]
    pid, tid = 100 + rank, 100 + rank
    slow = 1.6 if rank == straggler else 1.0
    t = base_us
    corr = 1000 * (rank + 1)
    ext = 1
    step_len = 0.0
    for s in range(steps):
        start = t
        gpu = t + 5
        for layer in range(layers):
            ext += 1
            corr += 1
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": pid, "tid": tid, "ts": t,
                       "dur": 12.0, "args": {"External id": ext, "Sequence number": layer,
                                             "Input Dims": [[64, 256], [256, 256], [256]],
                                             "Input type": ["float", "float", "float"]}})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                       "ts": t + 4, "dur": 5.0, "args": {"External id": ext, "correlation": corr, "cbid": 211}})
            ev.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": t + 4, "cat": "ac2g", "name": "ac2g"})
            kdur = (40.0 + 3 * (layer % 4)) * slow
            gpu = max(gpu, t + 8)
            ev.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7,
                       "ts": gpu, "dur": kdur, "args": {"External id": ext, "device": 0, "stream": 7,
                                                        "correlation": corr}})
            ev.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": gpu, "cat": "ac2g", "name": "ac2g",
                       "bp": "e"})
            gpu += kdur + 1
            t += 14
        # every rank's all-reduce ends when the slowest rank's compute is done
        compute = layers * (40.0 + 4.5) * 1.6 + 20
        corr += 1
        ar_start = gpu
        ar_end = start + compute + 60
        ev.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": pid, "tid": tid, "ts": t,
                   "dur": 10.0, "args": {"External id": ext + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0,
                   "tid": 20, "ts": ar_start, "dur": ar_end - ar_start,
                   "args": {"device": 0, "stream": 20, "correlation": corr}})
        step_len = ar_end - start + 10
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{10 + s}", "pid": pid,
                   "tid": tid, "ts": start, "dur": step_len, "args": {"External id": ext}})
        t = start + step_len + 2
    return {"schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_000_000_000,
                                  "computeMajor": 8, "computeMinor": 0}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": ev, "traceName": f"rank{rank}", "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def write_trace(path: Path, obj: dict, layout: str = "lines") -> Path:
    """``lines``: one event per line; ``minified``; a ``.gz`` name is gzipped."""
    if layout == "minified":
        text = json.dumps(obj, separators=(",", ":"))
    else:
        head = {k: v for k, v in obj.items() if k != "traceEvents"}
        text = (json.dumps(head)[:-1] + ', "traceEvents": [\n'
                + ",\n".join(json.dumps(e) for e in obj["traceEvents"]) + "\n]}")
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def rank_folder(folder: Path, world: int = 4, **kw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        layout = "minified" if r % 2 else "lines"
        name = f"rank{r}.pt.trace.json" + (".gz" if r % 3 == 0 else "")
        write_trace(folder / name, rank_trace(r, world, **kw), layout)
    return folder


def run_gpudoctor(*args: str, cwd: Path | None = None, timeout: float = 300):
    """``gpudoctor ARGS`` in a fresh process (exit codes and stderr as a user sees them)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)
