"""What "no trace deleted before its gzipped copy reads back whole" costs the parent process.

The parent gzips each plain trace the training process exported (``rundir.compress_trace``:
the Python-call filter, then gzip, fsynced) and, since issue 17, reads the gzipped copy back
to its end before deleting the plain one (``rundir.verify_gzip``). Both run in the parent,
off the training process's time, but on the same cores. This script builds a synthetic
Kineto trace shaped like a Python-heavy window (CPU ops, each under a stack of Python calls)
and prints, from one run, interleaved repetitions side by side:

    compress    median seconds of compress_trace (filter + gzip + fsync)
    verify      median seconds of verify_gzip on its output
    ratio       verify / compress: what the check adds to the parent's work per trace

    python benchmarks/writes.py [--events 400000] [--repeat 5] [--no-python]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from gpudoctor.collect import rundir


def synthetic_trace(path: Path, events: int, python: bool = True) -> int:
    """A plain trace of ``events`` events: one op per 8, each under 7 nested Python calls
    (``python`` False: ops only, gzipped as recorded)."""
    out = []
    ts = 1_000_000.0
    pid = tid = 1
    python_id = 0
    for i in range(events // 8):
        parent = None
        for depth in range(7 if python else 0):
            python_id += 1
            args = {"Python id": python_id, "Python thread": 0}
            if parent is not None:
                args["Python parent id"] = parent
            dur = 3.0 if depth == 6 else 40.0 - depth
            out.append({"ph": "X", "cat": "python_function", "name": f"train.py({i % 300}): f{depth}", "pid": pid,
                        "tid": tid, "ts": ts + depth, "dur": dur, "args": args})
            parent = python_id
        for k in range(1 if python else 8):
            out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": tid, "ts": ts + 10 + k,
                        "dur": 20.0, "args": {"External id": i * 8 + k, "Input Dims": [[64, 64], [64, 64]]}})
        ts += 50.0
    doc = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": out, "traceName": path.name}
    path.write_text(json.dumps(doc))
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=400_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-python", dest="python", action="store_false",
                    help="ops only: no Python calls to filter, the trace is gzipped as recorded")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpudoctor-bench-writes-") as tmp:
        plain = Path(tmp) / "bench.00000010.pt.trace.json"
        size = synthetic_trace(plain, args.events, args.python)
        compress, verify = [], []
        for i in range(args.repeat):
            final = Path(tmp) / f"out{i}.pt.trace.json.gz"
            t0 = time.perf_counter()
            rundir.compress_trace(plain, final)
            t1 = time.perf_counter()
            bad = rundir.verify_gzip(final)
            t2 = time.perf_counter()
            assert not bad, bad
            compress.append(t1 - t0)
            verify.append(t2 - t1)
            final.unlink()
        c, v = statistics.median(compress), statistics.median(verify)
        kind = "Python calls filtered" if args.python else "ops only, gzipped as recorded"
        print(f"trace: {size / 1e6:.1f} MB plain, {args.events:,} events ({kind}); {args.repeat} interleaved repetitions")
        print(f"compress  {c:.3f} s (median; min {min(compress):.3f}, max {max(compress):.3f})")
        print(f"verify    {v:.3f} s (median; min {min(verify):.3f}, max {max(verify):.3f})")
        print(f"ratio     verify / compress = {v / c:.3f}")


if __name__ == "__main__":
    main()
