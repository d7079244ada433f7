"""What a torch.profiler session leaves behind on the steps after it, with and without ``TEARDOWN_CUPTI`` (issue 44).

    python benchmarks/cupti_weight.py                                # on a CUDA machine, both loops
    python benchmarks/cupti_weight.py --device cpu --steps 150       # the same code on the CPU (no CUPTI: a smoke test)

No gpudoctor here: ``benchmarks/gpu_train_loop.py`` runs bare, three processes per loop (ResNet-50
under BF16 autocast, which the GPU limits; the launch-bound MLP), in turn:

- ``no window``: the loop alone, the reference for the drift of a process's steps over its run;
- ``window, TEARDOWN_CUPTI=0``: one torch.profiler window of the loop's own (CPU and CUDA activities,
  ``--profiler-window``), 5 steps at 30 % of the run; Kineto leaves CUPTI attached when it ends;
- ``window, TEARDOWN_CUPTI=1``: the same, with ``cuptiFinalize`` at the end of the session (libkineto
  ``CuptiActivityApi.cpp``; pytorch/pytorch#144455 and PR #146604 report 10-20 % slower training after
  profiling without it). Both values are set explicitly: a Kineto that tears down by default on
  CUDA ≥ 12.6 (pytorch/kineto#1264) would otherwise blur the comparison.

Each loop times its own steps with CUDA events. Per run: the median step after the window (from 5
steps after its end to the last step) over the median step before it (from step 10 to the step
before it); then that ratio over the ``no window`` run's on the same steps (``residue``): what the
ended session leaves on every later step, free of the process's own drift. With teardown it should
read about 1.00; a residue without teardown that is gone with it is CUPTI's.

``benchmarks/overhead.py --gpu --gpu-cupti`` runs this first, in the same call as the overhead case
(docs/gpu-acceptance.md: "The profiler's weight on a GPU loop").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import GPU_LOOPS, GPU_SCRIPT, GPU_WARMUP_STEPS, _run  # noqa: E402

WINDOW_STEPS = 5
AFTER_GAP = 5  # steps after the window left out: its trace is processed in the last one
VARIANTS = (("no window", None), ("window, TEARDOWN_CUPTI=0", "0"), ("window, TEARDOWN_CUPTI=1", "1"))


def window_start(steps: int) -> int:
    return max(GPU_WARMUP_STEPS + 20, int(steps * 0.3))


def before_after(gpu_s: list[float], start: int) -> tuple[float, float]:
    """(median step before the window, median step after it), seconds."""
    before = gpu_s[GPU_WARMUP_STEPS:start]
    after = gpu_s[start + WINDOW_STEPS + AFTER_GAP:]
    if not before or not after:
        sys.exit(f"cupti_weight: {len(gpu_s)} steps leave none before or after a window at step {start}: give more steps")
    return statistics.median(before), statistics.median(after)


def probe(work: str, loops: tuple[tuple[str, int], ...], device: str = "cuda") -> dict[str, dict]:
    """Every loop's three runs (see the module docstring); the figures by loop and variant."""
    print(f"cupti_weight: one torch.profiler window of {WINDOW_STEPS} steps in a bare loop, without and with "
          "TEARDOWN_CUPTI; medians of the steps before and after it")
    print(f"{'loop':>7} | {'variant':<26} | {'before ms':>9} {'after ms':>9} {'after/before':>12} {'residue':>8}")
    results: dict[str, dict] = {}
    for model, steps in loops:
        start = window_start(steps)
        got: dict[str, dict] = {}
        for label, teardown in VARIANTS:
            times = os.path.join(work, f"cupti-{model}-{len(got)}.json")
            env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
            cmd = [sys.executable, str(GPU_SCRIPT), "--model", model, "--steps", str(steps), "--device", device,
                   "--step-times", times]
            if teardown is not None:
                env["TEARDOWN_CUPTI"] = teardown
                cmd += ["--profiler-window", str(start), "--profiler-steps", str(WINDOW_STEPS)]
            _run(cmd, work, env)
            with open(times, encoding="utf-8") as f:
                gpu = json.load(f)["gpu"]
            before, after = before_after(gpu, start)
            got[label] = {"before_ms": round(before * 1e3, 4), "after_ms": round(after * 1e3, 4),
                          "after_over_before": round(after / before, 4)}
        ref = got["no window"]["after_over_before"]
        for label, row in got.items():
            row["residue"] = round(row["after_over_before"] / ref, 4)
            print(f"{model:>7} | {label:<26} | {row['before_ms']:9.3f} {row['after_ms']:9.3f} "
                  f"{row['after_over_before']:12.3f} {row['residue']:8.3f}")
        results[model] = {"steps": steps, "window": [start, start + WINDOW_STEPS], "runs": got}
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu runs the same code on the CPU (no CUPTI)")
    ap.add_argument("--steps", type=int, default=None, help="steps of each loop (default: 200 ResNet, 1000 MLP)")
    ap.add_argument("--loops", default=",".join(m for m, _ in GPU_LOOPS), help="which loops (default: all)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()
    chosen = [m for m in args.loops.split(",") if m]
    unknown = sorted(set(chosen) - {m for m, _ in GPU_LOOPS})
    if unknown or not chosen:
        sys.exit(f"cupti_weight: --loops: unknown {', '.join(unknown) or '(none given)'}")
    work = tempfile.mkdtemp(prefix="gpudoctor-cupti-")
    results = probe(work, tuple((m, args.steps or n) for m, n in GPU_LOOPS if m in chosen), args.device)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    print(f"cupti_weight: runs kept in {work}")


if __name__ == "__main__":
    main()
