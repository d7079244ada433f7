"""The profiler's own weight on the steps it records: how much slower a window's steps run than the
unprofiled steps of the same run, with shapes and stacks recorded and without (issue 37).

    python benchmarks/window_weight.py                    # the CPU sample scripts, 60 steps each
    python benchmarks/window_weight.py --only tiny_batch_launch_bound --repeat 3

Each script runs once (per ``--repeat``) under ``gpudoctor profile --no-report --steps 60``: with
``--steps 60`` the schedule fits two windows (docs/profile.md), the first recording shapes and stacks,
the second timings only. Each trace tells which it is (Python function events are recorded only with
stacks) and which steps it recorded (its ``ProfilerStep#N`` spans); the run's ``steps.jsonl`` times every
step. Printed per script: the median wall time of the unprofiled steady steps (no instrument ran in them,
nor in the step before: ``model.steady.unprofiled_steps``), and the median of each window's recorded steps
over it (``model.steady.window_weight``, the figure the report states). Both come from the same run, side
by side: the machine's noise is common to them.

The account is charged on the window without stacks (``docs/account.md``); its ratio is the weight
the report states ("profiled steps ran 1.04x the unprofiled ones").
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_scripts"
# the sample scripts that run on a CPU (the others need a GPU), and the shapes of loop they cover
CPU_SCRIPTS = ("tiny_batch_launch_bound", "rnn_manual_updates", "starved_dataloader", "eval_without_no_grad",
               "cpu_preprocessing_in_loop", "tuned_baseline", "grad_accumulation_slow_collate",
               "inference_over_tensors")
_STEP = re.compile(r"ProfilerStep#(\d+)")


def trace_steps(path: Path) -> tuple[set[int], bool]:
    """(the steps a trace recorded, whether it recorded Python stacks)."""
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
        data = json.load(f)
    steps: set[int] = set()
    stacks = False
    for ev in data.get("traceEvents", []):
        name = ev.get("name", "")
        if ev.get("ph") == "X" and name.startswith("ProfilerStep#") and ev.get("cat") != "gpu_user_annotation":
            m = _STEP.match(name)
            if m:
                steps.add(int(m.group(1)))
        if ev.get("cat") == "python_function":
            stacks = True
    return steps, stacks


def weigh(run_dir: Path) -> dict[str, float | None]:
    """The weight of each kind of window, as the report computes it (``model.steady``): the median of a
    window's recorded steps over the median of the unprofiled steady steps (no instrument, nor right
    after one), at the rate the loop sustains (wall time on a CPU)."""
    from gpudoctor.model.run import StepRecord  # noqa: PLC0415 - the benchmark runs from a checkout
    from gpudoctor.model.steady import steady_steps, unprofiled_steps, window_weight  # noqa: PLC0415

    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text(encoding="utf-8").splitlines() if line]
    records = [StepRecord.from_dict(r) for r in rows]
    by_index = {s.index: s for s in records}
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    bare = unprofiled_steps(steady_steps(records, manifest.get("step_source"), None))
    out: dict[str, float | None] = {"bare_ms": statistics.median(s.wall_ns for s in bare) / 1e6 if bare else None,
                                    "stacks": None, "no_stacks": None}
    for trace in sorted(run_dir.glob("*.pt.trace.json*")):
        steps, stacks = trace_steps(trace)
        w = window_weight([by_index[i] for i in sorted(steps) if i in by_index], bare)
        key = "stacks" if stacks else "no_stacks"
        if w is not None and out[key] is None:
            out[key] = w.ratio
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", metavar="NAME", help="a sample script (repeatable)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    names = args.only or list(CPU_SCRIPTS)
    work = Path(tempfile.mkdtemp(prefix="gpudoctor-window-weight-"))
    print(f"window_weight: {len(names)} scripts x {args.repeat}, --steps {args.steps}; runs under {work}")
    print(f"{'script':<32} {'unprofiled ms':>13} {'with stacks':>12} {'without':>8}")
    with_s, without = [], []
    for name in names:
        for k in range(args.repeat):
            out = work / f"{name}-{k}"
            cmd = [sys.executable, "-m", "gpudoctor", "profile", "--no-report", "--out", str(out), "--steps",
                   str(args.steps), str(SAMPLES / f"{name}.py")]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            dirs = [d for d in out.iterdir() if d.is_dir()] if out.is_dir() else []
            if proc.returncode != 0 or len(dirs) != 1:
                print(f"{name:<32} failed ({proc.returncode}): {proc.stderr.strip()[-200:]}")
                continue
            w = weigh(dirs[0])
            if w["stacks"] is not None:
                with_s.append(w["stacks"])
            if w["no_stacks"] is not None:
                without.append(w["no_stacks"])

            def show(x: float | None) -> str:
                return f"{x:.2f}x" if x is not None else "-"

            bare = f"{w['bare_ms']:.2f}" if w["bare_ms"] is not None else "-"
            print(f"{name:<32} {bare:>13} {show(w['stacks']):>12} {show(w['no_stacks']):>8}")
    if with_s and without:
        print(f"window_weight: median over runs: with shapes and stacks {statistics.median(with_s):.2f}x, "
              f"timings only {statistics.median(without):.2f}x the unprofiled steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
