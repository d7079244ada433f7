"""What `gpudoctor profile` costs a training run: bare vs profiled, interleaved A B A B.

    python benchmarks/overhead.py                       # 5 pairs of 1000 steps, default settings
    python benchmarks/overhead.py --pairs 7 -- --no-stack  # options after -- go to gpudoctor profile

Runs ``benchmarks/cpu_train_loop.py`` bare (``python script.py``) and under
``python -m gpudoctor profile --no-report`` in turn. Both runs time each step with the
same code inside the script (``--step-times``), so the per-step comparison does not
depend on gpudoctor's own timing. Printed, per pair and as the median over pairs:

- whole-run ratio: wall time of the profiled run (gpudoctor's start-up, the run, the
  trace exports, the manifest) over the bare run's;
- per-step ratio outside the profiled windows: median step time of the profiled run
  over the bare run's, on the same step indices, leaving out step 0, every step in a
  torch.profiler or cProfile window and the step before each window (whose
  ``optimizer.step()`` call starts the profiler).

Both are also given in CPU time (whole run: user + sys of every process of the run,
gpudoctor's parent and sampler included; per step: the training process's CPU time).
On a shared, loaded machine the wall-time ratios swing with whatever else runs; CPU
time is what gpudoctor adds to the run itself and stays steady, so it is the figure to
trust when the two disagree.

Because wall and even CPU time per step swing by ±10 % between runs on a busy shared
machine, the script also prints gpudoctor's own costs measured inside each profiled run,
which do not depend on what else runs: its start-up before the training process starts
(from launch to ``manifest.started_at_unix_ns``), the bookkeeping between steps outside
the windows (the gaps between consecutive steps in ``steps.jsonl``), each window's cost
(its extra time over as many plain steps, export included), and the time from the end
of the training process to gpudoctor's exit. Their sum over the bare run's wall time is
the overhead the run pays, free of the machine's noise.

Targets (issue 2): whole run <= 1.03 and per step <= 1.01 with the default settings.

Hook cost per step (issue 12; ``--hooks-only`` runs this part alone): every step pays
gpudoctor's hooks (the DataLoader, the root module, ``backward()``, ``optimizer.step()``)
and its bookkeeping at the step boundary. ``benchmarks/hook_loop.py`` runs tiny loops of
each marker's shape (steps of 20-250 µs, so that microseconds show) under ``gpudoctor
profile`` with no instrument window (``--skip-first`` past the end, ``--no-cprofile``,
``--time-window off``). Two measures:

- judged, in one process: ``hook_loop.py --ab-hooks`` switches gpudoctor's hooks off (the
  original functions put back) and on again every 25 steps; the cost is the median step
  time with the hooks on minus the median with them off, in µs, the median over 5 runs
  (``--ab-runs``) of 12,000 steps. Both medians come from the same seconds of the same
  process, so neither the host's noise nor the process's memory layout enters the
  difference: the runs of one shape agree within ~1.5 µs;
- end to end, printed, not judged: the same loops bare and under ``gpudoctor profile``,
  process against process, interleaved, the median over pairs (9 by default) of the
  difference of median step times. It adds whatever else differs in a profiled process,
  but cannot resolve a few µs on this shared 2-vCPU machine: the median step of the
  230 µs ``optimizer`` loop drifts by up to 10 µs within one run and differs by as much
  between two runs; with gpudoctor's step hooks taken out of the patches (a one-off
  build), four runs of 11-21 pairs gave 0.5 to 3.3 µs (pairs -9.7 to 12.7).

The ``deep`` shape (a 300-submodule model) shows that the root-module hook is paid once per
forward, not per submodule, next to what one no-op global module hook costs the same loop
(``--global-hook``, end to end); its steps are too long for a few µs to matter, so it is a
comparison, not judged against the target. The loops' model is the script's own
``nn.Module`` class (as in most training scripts), whose ``forward`` gpudoctor wraps on the
class; the ``sequential`` shape, the ``optimizer`` loop with an ``nn.Sequential`` model (a
torch class, hooked on the instance: ``nn.Module``'s slow path), and the ``amp`` shape, the
``optimizer`` loop under ``torch.autocast`` at every step (whose bfloat16 work leaves each hook
colder, and whose autocast gpudoctor also watches), are printed as comparisons.
Target: <= 15 µs per step on every judged loop shape, in one process.

GPU case (issue 37; ``--gpu``, run by ``benchmarks/gpu_acceptance.py`` on a CUDA machine):
``benchmarks/gpu_train_loop.py`` runs two loops, ResNet-50 under BF16 autocast (the GPU limits it) and
a small MLP (the host limits it), bare and under ``gpudoctor profile --no-report`` in turn. Each loop
times its own steps with one CUDA event per step (the rate the loop sustains; no synchronization in
the loop). Printed per loop, the median over pairs:

- per step outside the windows: the median CUDA-event step of the profiled run over the bare run's, on
  the same step indices, leaving out the first 10 steps (cuDNN's and the allocator's warm-up), every
  step in a torch.profiler or cProfile window and the steps on either side of one (a window starts in
  the step before it; its trace is exported in the step after it);
- in each profiled window: its active steps' median over the bare median (the profiler's own weight
  on the steps it records: the first window records shapes and stacks, the second timings only);
- whole run: wall time of the profiled run over the bare run's.

Then, for the MLP when it misses the target (every loop with ``--gpu-isolate``), to tell where its cost
comes from: one profiled run with ``--ab-hooks`` (the hooks and
the step bookkeeping switched off and on every 25 steps in one process: their cost per step, the
difference of two medians over the same seconds), and one profiled run per instrument taken away
(``--no-cprofile``; no windows; no windows, no cProfile and no sampling), each against the bare median
of the pairs. On the H200 (2026-11-28) the MLP ran 1.21x and 1.23x bare with no window, no cProfile
(two interleaved pairs): the A/B run says whether the hooks or the process carry that.

Targets (issue 37): per step outside the windows and whole run <= 1.03.

CUPTI after a window (issue 44; ``--gpu-cupti``): gpudoctor sets ``TEARDOWN_CUPTI=1`` in the training
process (``gpudoctor/collect/cupti.py``), so that Kineto detaches CUPTI when a window ends. First
``benchmarks/cupti_weight.py`` runs the loops bare with one torch.profiler window of their own, with
``TEARDOWN_CUPTI=0`` and ``=1``, against the loop alone: what CUPTI alone leaves on the steps after a
session. Then each pair runs a third process, the profiled loop with ``TEARDOWN_CUPTI=0`` (CUPTI kept,
gpudoctor's behaviour before), judged on the same steps: printed beside the default (``kept``), not
judged. The default run's ``TEARDOWN_CUPTI`` is gpudoctor's rule (any value in this environment is
taken out), and what it decided is printed from the run's manifest. ``--gpu-json`` is written after
each part, so a call cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "cpu_train_loop.py"
GPU_SCRIPT = HERE / "gpu_train_loop.py"
GPU_LOOPS = (("resnet", 200), ("mlp", 1000))  # (model, steps): about 6 s and 2 s of steps on an H200
ISOLATE_BY_DEFAULT = ("mlp",)  # the loop whose steps are short enough for a per-step cost to show
TARGET_GPU = 1.03
GPU_WARMUP_STEPS = 10
HOOK_LOOP = HERE / "hook_loop.py"
TARGET_WHOLE = 1.03
TARGET_STEP = 1.01
TARGET_HOOK_US = 15.0
HOOK_SHAPES = ("optimizer", "amp", "backward", "module", "dataloader", "sequential", "deep")
COMPARISONS = ("amp", "sequential", "deep")  # printed, not judged against the target (see the module docstring)
# what hook_loop.py --ab-hooks must find to switch, by shape (parts of the names it reports)
AB_SWITCHED = {
    "optimizer": ("SGD.step", "torch.autograd.backward", "__next__", "MLP.forward"),
    "amp": ("SGD.step", "torch.autograd.backward", "__next__", "MLP.forward", "autocast.__init__"),
    "backward": ("torch.autograd.backward", "MLP.forward"),
    "module": ("MLP.forward",),
    "dataloader": ("__next__",),
    "sequential": ("SGD.step", "torch.autograd.backward", "__next__", "Sequential instance"),
    "deep": ("Sequential instance",),
}


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _run(cmd: list[str], cwd: str, env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall s, CPU s of the whole process tree) of one run (in ``env``, else this process's environment)."""
    cpu0 = _children_cpu()
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"overhead: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, _children_cpu() - cpu0


def _excluded(run_dir: Path) -> set[int]:
    """Step indices inside an instrument window, the step before each window, and step 0."""
    out = {0}
    with open(run_dir / "steps.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("window"):
                out.add(rec["index"])
                out.add(rec["index"] - 1)
    return out


def _own_costs(run_dir: Path, launched_unix: float, exited_unix: float) -> dict[str, float]:
    """gpudoctor's costs inside one profiled run, in seconds (see the module docstring)."""
    with open(run_dir / "manifest.json", encoding="utf-8") as f:
        m = json.load(f)
    with open(run_dir / "steps.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    start = m["started_at_unix_ns"] / 1e9 - launched_unix
    end = exited_unix - (m["started_at_unix_ns"] / 1e9 + m["duration_s"])
    plain = [r["wall_ns"] for r in rows[1:] if not r["window"]]
    median_step = statistics.median(plain) if plain else 0
    gaps = []
    windows = 0.0
    for a, b in zip(rows, rows[1:], strict=False):
        gap = b["start_ns"] - (a["start_ns"] + a["wall_ns"])
        if not a["window"] and not b["window"]:
            gaps.append(gap)
        else:
            windows += gap  # starting the profiler, exporting a trace
    for r in rows:
        if r["window"]:
            windows += r["wall_ns"] - median_step
    bookkeeping = statistics.median(gaps) if gaps else 0
    return {
        "start": start,
        "end": end,
        "windows": windows / 1e9,
        "bookkeeping_per_step": bookkeeping / 1e9,
        "bookkeeping_total": sum(gaps) / 1e9,
        "median_step": median_step / 1e9,
    }


def _verdict(value: float, target: float) -> str:
    return "ok" if value <= target else "MISSED"


def _median_step_us(path: str) -> float:
    with open(path, encoding="utf-8") as f:
        ns = json.load(f)["ns"]
    return statistics.median(ns[100:] or ns) / 1e3  # the first steps warm up


def _profile_hook_loop(work: str, loop_args: list[str]) -> None:
    """hook_loop.py under gpudoctor profile with no instrument window."""
    _run([sys.executable, "-m", "gpudoctor", "profile", "--no-report", "--out", os.path.join(work, "hook-runs"),
          "--skip-first", "1000000000", "--no-cprofile", "--time-window", "off", str(HOOK_LOOP), "--", *loop_args], work)


def hook_costs_ab(work: str, runs: int, steps: int, shapes: tuple[str, ...] = HOOK_SHAPES) -> bool:
    """The hook cost per step of each loop shape, in one profiled process that switches the hooks
    off and on every 25 steps (see the module docstring); True when every judged shape meets the
    target (none measured with 0 runs)."""
    if runs <= 0:
        return True
    print(f"overhead: hook cost per step, in one profiled process switching gpudoctor's hooks off and on every 25 "
          f"steps: {runs} runs of {steps} steps per shape")
    print(f"{'shape':>10} | {'on µs':>8} {'off µs':>8} {'cost µs':>8} {'ratio':>6} | runs (cost µs) | switched")
    ok = True
    for shape in shapes:
        on_med, off_med, costs = [], [], []
        switched: list[str] = []
        for i in range(runs):
            path = os.path.join(work, f"hook-{shape}-ab{i}.json")
            _profile_hook_loop(work, ["--shape", shape, "--steps", str(steps), "--ab-hooks", "--step-times", path])
            with open(path, encoding="utf-8") as f:
                got = json.load(f)
            switched = got["switched"]
            missing = [w for w in AB_SWITCHED[shape] if not any(w in name for name in switched)]
            if missing:
                sys.exit(f"overhead: {shape}: gpudoctor's {', '.join(missing)} hook not found to switch "
                         f"(switched: {', '.join(switched) or 'nothing'})")
            on = statistics.median(ns for ns, st in zip(got["ns"], got["on"], strict=True) if st == 1) / 1e3
            off = statistics.median(ns for ns, st in zip(got["ns"], got["on"], strict=True) if st == 0) / 1e3
            on_med.append(on)
            off_med.append(off)
            costs.append(on - off)
        cost = statistics.median(costs)
        if shape in COMPARISONS:
            verdict = "comparison"
        else:
            ok &= cost <= TARGET_HOOK_US
            verdict = _verdict(cost, TARGET_HOOK_US)
        on, off = statistics.median(on_med), statistics.median(off_med)
        print(f"{shape:>10} | {on:8.1f} {off:8.1f} {cost:8.1f} {on / off:6.3f} | {' '.join(f'{c:.1f}' for c in costs)}"
              f"  ({verdict}) | {', '.join(switched)}")
    print(f"overhead: hook cost per step: {'every shape' if ok else 'NOT every shape'} within {TARGET_HOOK_US:g} µs")
    return ok


def hook_costs(work: str, pairs: int, steps: int, shapes: tuple[str, ...] = HOOK_SHAPES) -> None:
    """The whole cost of gpudoctor profile per step of each loop shape, process against process
    (see the module docstring): the end-to-end check of :func:`hook_costs_ab` (none with 0 pairs)."""
    if pairs <= 0:
        return
    print(f"overhead: end to end, {pairs} pairs of {steps} steps per shape ({min(pairs, 3)} for comparisons) "
          "(bare vs gpudoctor profile without instrument windows; processes differ by several µs, see the docstring)")
    print(f"{'shape':>10} | {'bare µs':>8} {'prof µs':>8} {'cost µs':>8} {'ratio':>6} | pairs (cost µs)")
    for shape in shapes:
        loop_args = ["--shape", shape, "--steps", str(steps)]
        bare, prof, glob = [], [], []
        for i in range(min(pairs, 3) if shape in COMPARISONS else pairs):
            b = os.path.join(work, f"hook-{shape}-bare{i}.json")
            p = os.path.join(work, f"hook-{shape}-prof{i}.json")
            _run([sys.executable, str(HOOK_LOOP), *loop_args, "--step-times", b], work)
            _profile_hook_loop(work, [*loop_args, "--step-times", p])
            bare.append(_median_step_us(b))
            prof.append(_median_step_us(p))
            if shape == "deep":
                g = os.path.join(work, f"hook-{shape}-global{i}.json")
                _run([sys.executable, str(HOOK_LOOP), *loop_args, "--global-hook", "--step-times", g], work)
                glob.append(_median_step_us(g))
        costs = [pp - bb for pp, bb in zip(prof, bare, strict=True)]
        cost = statistics.median(costs)
        print(f"{shape:>10} | {statistics.median(bare):8.1f} {statistics.median(prof):8.1f} {cost:8.1f} "
              f"{statistics.median(prof) / statistics.median(bare):6.3f} | {' '.join(f'{c:.1f}' for c in costs)}")
        if glob:
            g_cost = statistics.median(gg - bb for gg, bb in zip(glob, bare, strict=True))
            print(f"{'':>10} | one no-op global module forward pre-hook would cost {g_cost:.1f} µs per step here")


def _windows(run_dir: Path) -> tuple[set[int], list[list[int]]]:
    """(steps to leave out of the steady state, the active steps of each torch.profiler window in order)."""
    out: set[int] = set(range(GPU_WARMUP_STEPS))
    windows: list[list[int]] = []
    last_active = None
    with open(run_dir / "steps.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            i = rec["index"]
            if rec.get("window"):
                out.update((i - 1, i, i + 1))
            if rec.get("window") == "active":
                if last_active != i - 1:
                    windows.append([])
                windows[-1].append(i)
                last_active = i
    return out, windows


ISOLATION = (("no cProfile", ("--no-cprofile",)), ("no windows", ("--skip-first", "1000000000")),
             ("no windows, no cProfile, no sampling", ("--skip-first", "1000000000", "--no-cprofile",
                                                         "--sample-interval-ms", "100000000")))


def _isolate(work: str, out_dir: str, model: str, steps: int, bare_times: str, device: str = "cuda") -> dict[str, float]:
    """Where the per-step cost comes from (see the module docstring): the hooks' in-process A/B cost, and
    each instrument taken away, as ratios to the last bare run's median (outside the first 10 steps)."""
    with open(bare_times, encoding="utf-8") as f:
        bare = statistics.median(json.load(f)["gpu"][GPU_WARMUP_STEPS:])
    out: dict[str, float] = {}
    ab = os.path.join(work, f"gpu-{model}-ab.json")
    _run([sys.executable, "-m", "gpudoctor", "profile", "--no-report", "--out", out_dir, "--skip-first", "1000000000",
          "--no-cprofile", str(GPU_SCRIPT), "--", "--model", model, "--steps", str(steps), "--device", device,
          "--ab-hooks", "--step-times", ab], work)
    with open(ab, encoding="utf-8") as f:
        got = json.load(f)
    on_steps = [g for g, st in zip(got["gpu"], got["on"], strict=True) if st == 1]
    off_steps = [g for g, st in zip(got["gpu"], got["on"], strict=True) if st == 0]
    if not on_steps or not off_steps:
        sys.exit(f"overhead (GPU): {model}: {steps} steps leave no step with the hooks switched off and on "
                 "(the A/B warms up 50 steps, then blocks of 25): give more steps")
    on, off = statistics.median(on_steps), statistics.median(off_steps)
    out["hooks_on_ms"], out["hooks_off_ms"], out["bare_ms"] = on * 1e3, off * 1e3, bare * 1e3
    line = (f"overhead (GPU): {model}: in one profiled process, hooks on {on * 1e3:.3f} ms, off {off * 1e3:.3f} ms "
            f"({(on - off) * 1e6:+.0f} µs per step; switched {', '.join(got.get('switched', [])) or 'nothing'}); "
            f"bare process {bare * 1e3:.3f} ms")
    for name, opts in ISOLATION:
        t = os.path.join(work, f"gpu-{model}-{len(out)}.json")
        _run([sys.executable, "-m", "gpudoctor", "profile", "--no-report", "--out", out_dir, *opts, str(GPU_SCRIPT),
              "--", "--model", model, "--steps", str(steps), "--device", device, "--step-times", t], work)
        with open(t, encoding="utf-8") as f:
            out[name] = statistics.median(json.load(f)["gpu"][GPU_WARMUP_STEPS:]) / bare
        line += f"; {name} {out[name]:.3f}x"
    print(line)
    return out


def _teardown_decision(run_dir: Path) -> str:
    """What gpudoctor did with TEARDOWN_CUPTI in a run (the manifest's ``collected[cupti_teardown]``)."""
    with open(run_dir / "manifest.json", encoding="utf-8") as f:
        for c in json.load(f).get("collected", []):
            if c.get("name") == "cupti_teardown":
                return c.get("detail") if c.get("ok") else f"not set: {c.get('reason')}"
    return "not recorded (a gpudoctor before issue 44)"


def _profiled(work: str, out_dir: str, gpudoctor_args: list[str], loop_args: list[str], times: str,
              env: dict[str, str]) -> tuple[float, Path]:
    """One profiled run: (its wall time, its run directory)."""
    before = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else set()
    wall, _ = _run([sys.executable, "-m", "gpudoctor", "profile", "--no-report", "--out", out_dir,
                    *gpudoctor_args, str(GPU_SCRIPT), "--", *loop_args, "--step-times", times], work, env)
    (new,) = set(os.listdir(out_dir)) - before
    return wall, Path(out_dir) / new


def gpu_case(work: str, pairs: int, loops: tuple[tuple[str, int], ...], gpudoctor_args: list[str],
             json_out: str | None = None, device: str = "cuda", isolate: bool | None = None,
             cupti: bool = False) -> bool:
    """Bare vs profiled GPU loops (see the module docstring); True when both ratios meet the target.
    ``cupti``: each pair also runs the profiled loop with ``TEARDOWN_CUPTI=0`` (CUPTI kept after each
    window, gpudoctor's behaviour before issue 44), and the default run is left to gpudoctor's rule."""
    out_dir = os.path.join(work, "gpu-runs")
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"} if cupti else None  # gpudoctor's rule
    kept_env = {**(env or {}), "TEARDOWN_CUPTI": "0"}
    print(f"overhead (GPU): {pairs} pairs per loop; gpudoctor options: {' '.join(gpudoctor_args) or '(defaults)'}"
          + ("; each pair also profiled with TEARDOWN_CUPTI=0 (kept: CUPTI stays attached after a window)" if cupti else ""))
    print(f"{'loop':>7} {'pair':>4} | {'bare ms':>8} {'prof ms':>8} {'step':>6} | {'bare s':>6} {'prof s':>6} "
          f"{'whole':>6} | windows (active steps' median over the bare median)" + (" | kept: step whole" if cupti else ""))
    ok = True
    results: dict[str, dict] = {}
    for model, steps in loops:
        loop_args = ["--model", model, "--steps", str(steps), "--device", device]
        _run([sys.executable, str(GPU_SCRIPT), "--model", model, "--steps", "20", "--device", device], work)  # warm-up
        step_ratios, whole_ratios, window_ratios, kept_ratios = [], [], [], []
        decision = ""
        for i in range(pairs):
            bare_t = os.path.join(work, f"gpu-{model}-bare{i}.json")
            prof_t = os.path.join(work, f"gpu-{model}-prof{i}.json")
            wb, _ = _run([sys.executable, str(GPU_SCRIPT), *loop_args, "--step-times", bare_t], work)
            wp, run_dir = _profiled(work, out_dir, gpudoctor_args, loop_args, prof_t, env)
            decision = decision or _teardown_decision(run_dir)
            skip, windows = _windows(run_dir)
            with open(bare_t, encoding="utf-8") as f:
                b = json.load(f)["gpu"]
            with open(prof_t, encoding="utf-8") as f:
                p = json.load(f)["gpu"]
            kept = None
            if cupti:  # the same loop, CUPTI kept after each window: judged on the same steps
                kept_t = os.path.join(work, f"gpu-{model}-kept{i}.json")
                wk, kept_dir = _profiled(work, out_dir, gpudoctor_args, loop_args, kept_t, kept_env)
                skip |= _windows(kept_dir)[0]
                with open(kept_t, encoding="utf-8") as f:
                    kept = (json.load(f)["gpu"], wk)
            n = min(len(b), len(p), len(kept[0]) if kept else len(p))
            keep = [k for k in range(n) if k not in skip]
            mb = statistics.median(b[k] for k in keep) * 1e3
            mp = statistics.median(p[k] for k in keep) * 1e3
            win = [statistics.median(p[k] for k in w if k < len(p)) * 1e3 / mb for w in windows if w]
            step_ratios.append(mp / mb)
            whole_ratios.append(wp / wb)
            window_ratios.append(win)
            row = (f"{model:>7} {i + 1:>4} | {mb:8.3f} {mp:8.3f} {mp / mb:6.3f} | {wb:6.2f} {wp:6.2f} {wp / wb:6.3f} | "
                   + " ".join(f"{r:.2f}x" for r in win))
            if kept:
                mk = statistics.median(kept[0][k] for k in keep) * 1e3
                kept_ratios.append((mk / mb, kept[1] / wb))
                row += f" | {mk / mb:6.3f} {kept[1] / wb:6.3f}"
            print(row)
        step, whole = statistics.median(step_ratios), statistics.median(whole_ratios)
        ok &= step <= TARGET_GPU and whole <= TARGET_GPU
        results[model] = {"step_ratio": round(step, 4), "whole_ratio": round(whole, 4),
                          "windows": window_ratios, "pairs": pairs, "steps": steps, "teardown": decision}
        print(f"overhead (GPU): {model}: per step outside the windows {step:.3f} ({_verdict(step, TARGET_GPU)}), "
              f"whole run {whole:.3f} ({_verdict(whole, TARGET_GPU)}); target <= {TARGET_GPU}")
        print(f"overhead (GPU): {model}: TEARDOWN_CUPTI: {decision}")
        if kept_ratios:
            ks, kw = statistics.median(r[0] for r in kept_ratios), statistics.median(r[1] for r in kept_ratios)
            results[model] |= {"kept_step_ratio": round(ks, 4), "kept_whole_ratio": round(kw, 4)}
            print(f"overhead (GPU): {model}: with TEARDOWN_CUPTI=0 (CUPTI kept after each window): per step outside "
                  f"the windows {ks:.3f}, whole run {kw:.3f} (compare, not judged)")
        if isolate or (isolate is None and step > TARGET_GPU and model in ISOLATE_BY_DEFAULT):  # where it comes from
            results[model]["isolation"] = _isolate(work, out_dir, model, steps, bare_t, device)
        if json_out:  # after each loop: a call cut short by its time limit keeps what it measured
            _write_json(json_out, {"target": TARGET_GPU, "ok": ok, "loops": results})
    return ok


def _write_json(path: str, figures: dict) -> None:
    """``figures`` into ``path``, keeping what is there under other keys (cupti_weight's probe, written
    first in the same call with --gpu-cupti)."""
    old: dict = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**old, **figures}, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in the training script")
    ap.add_argument("--hook-pairs", type=int, default=9,
                    help="pairs per loop shape for the hook cost end to end (the comparison shapes run at most "
                         "3; 0: none)")
    ap.add_argument("--hook-steps", type=int, default=3000, help="steps per run for the hook cost, end to end")
    ap.add_argument("--ab-runs", type=int, default=5,
                    help="profiled runs per loop shape switching the hooks off and on (0: none)")
    ap.add_argument("--ab-steps", type=int, default=12000, help="steps per run switching the hooks off and on")
    ap.add_argument("--hooks-only", action="store_true", help="measure the hook cost per step only")
    ap.add_argument("--hook-shapes", default=",".join(HOOK_SHAPES),
                    help=f"comma-separated loop shapes for the hook cost (default: all of {','.join(HOOK_SHAPES)})")
    ap.add_argument("--gpu", action="store_true", help="the GPU case only (needs CUDA; see the module docstring)")
    ap.add_argument("--gpu-pairs", type=int, default=2, help="pairs per GPU loop (default 2)")
    ap.add_argument("--gpu-json", default=None, help="also write the GPU case's figures to this JSON file")
    ap.add_argument("--gpu-device", default="cuda", help="cuda (default); cpu runs the GPU case's code on the CPU (tests)")
    ap.add_argument("--gpu-steps", type=int, default=None, help="steps of each GPU loop (default: 200 ResNet, 1000 MLP)")
    ap.add_argument("--gpu-loops", default=",".join(m for m, _ in GPU_LOOPS), help="which GPU loops (default: all)")
    ap.add_argument("--gpu-isolate", action="store_true",
                    help="always run the isolation runs (default: only for a loop that misses the target)")
    ap.add_argument("--gpu-cupti", action="store_true",
                    help="also what CUPTI leaves behind: benchmarks/cupti_weight.py's bare loops with a window of "
                         "their own first, then each pair profiled with TEARDOWN_CUPTI=0 as well (issue 44)")
    ap.add_argument("--in-process", action="store_true",
                    help="profile with gpudoctor.session() around the script in its own process (issue 43), not the "
                    "CLI; the hook cost (the same code either way) is not measured again")
    ap.add_argument("gpudoctor_args", nargs="*", help="options for gpudoctor profile (after --)")
    args = ap.parse_args()
    if args.gpu:
        work = tempfile.mkdtemp(prefix="gpudoctor-overhead-gpu-")
        if args.gpu_json and os.path.exists(args.gpu_json):  # written part by part below: none of an older call
            os.remove(args.gpu_json)
        chosen = [m for m in args.gpu_loops.split(",") if m]
        unknown = sorted(set(chosen) - {m for m, _ in GPU_LOOPS})
        if unknown or not chosen:
            sys.exit(f"overhead: --gpu-loops: unknown {', '.join(unknown) or '(none given)'}")
        loops = tuple((m, args.gpu_steps or n) for m, n in GPU_LOOPS if m in chosen)
        if args.gpu_cupti:
            from cupti_weight import probe  # noqa: PLC0415 (beside this file)

            got = probe(work, loops, args.gpu_device)
            if args.gpu_json:
                _write_json(args.gpu_json, {"cupti_probe": got})
        ok = gpu_case(work, args.gpu_pairs, loops, args.gpudoctor_args, args.gpu_json, args.gpu_device,
                      True if args.gpu_isolate else None, cupti=args.gpu_cupti)
        print(f"overhead (GPU): runs kept in {work}")
        sys.exit(0 if ok else 1)
    if args.pairs < 5:
        sys.exit("overhead: at least 5 pairs")

    shapes = tuple(s for s in args.hook_shapes.split(",") if s)
    unknown = sorted(set(shapes) - set(HOOK_SHAPES))
    if unknown or not shapes:
        sys.exit(f"overhead: --hook-shapes: unknown {', '.join(unknown) or '(none given)'}; "
                 f"choose from {', '.join(HOOK_SHAPES)}")
    work = tempfile.mkdtemp(prefix="gpudoctor-overhead-")
    if args.hooks_only:
        try:
            load = " load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
        except OSError:
            load = ""
        print(f"overhead: {os.cpu_count()} CPUs,{load}")
        hook_costs_ab(work, args.ab_runs, args.ab_steps, shapes)
        hook_costs(work, args.hook_pairs, args.hook_steps, shapes)
        print(f"overhead: runs kept in {work}")
        return
    out_dir = os.path.join(work, "runs")
    script_args = ["--steps", str(args.steps), "--threads", str(args.threads)]
    try:
        load = " load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    except OSError:
        load = ""
    print(f"overhead: {args.pairs} pairs, {os.cpu_count()} CPUs,{load}; torch threads {args.threads}, "
          f"{args.steps} steps; gpudoctor options: {' '.join(args.gpudoctor_args) or '(defaults)'}")

    # one untimed bare run: warm the page cache
    _run([sys.executable, str(SCRIPT), "--steps", "50", "--threads", str(args.threads)], work)

    rows = []
    costs: list[tuple[dict[str, float], float]] = []
    print(f"{'pair':>4} | {'bare s':>6} {'prof s':>6} {'wall':>6} {'cpu':>6} | "
          f"{'bare ms':>7} {'prof ms':>7} {'wall':>6} {'cpu':>6} | kept")
    for i in range(args.pairs):
        bare_times = os.path.join(work, f"bare{i}.json")
        prof_times = os.path.join(work, f"prof{i}.json")
        wb, cb = _run([sys.executable, str(SCRIPT), *script_args, "--step-times", bare_times], work)
        before = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else set()
        launched = time.time()
        wp, cp = _run(_profiled(args.in_process, out_dir, args.gpudoctor_args, [*script_args, "--step-times", prof_times]),
                      work)
        exited = time.time()
        (new,) = set(os.listdir(out_dir)) - before
        skip = _excluded(Path(out_dir) / new)
        costs.append((_own_costs(Path(out_dir) / new, launched, exited), wb))
        with open(bare_times, encoding="utf-8") as f:
            b = json.load(f)
        with open(prof_times, encoding="utf-8") as f:
            p = json.load(f)
        keep = [k for k in range(min(len(b["wall"]), len(p["wall"]))) if k not in skip]
        mb = statistics.median(b["wall"][k] for k in keep) * 1e3
        mp = statistics.median(p["wall"][k] for k in keep) * 1e3
        cpu_b = statistics.median(b["cpu"][k] for k in keep)
        cpu_p = statistics.median(p["cpu"][k] for k in keep)
        row = (wp / wb, cp / cb, mp / mb, cpu_p / cpu_b)
        rows.append(row)
        print(f"{i + 1:>4} | {wb:6.2f} {wp:6.2f} {row[0]:6.3f} {row[1]:6.3f} | "
              f"{mb:7.3f} {mp:7.3f} {row[2]:6.3f} {row[3]:6.3f} | {len(keep)}")

    med = [statistics.median(r[j] for r in rows) for j in range(4)]
    print(f"overhead: whole run, median of {args.pairs} pairs: wall {med[0]:.3f} ({_verdict(med[0], TARGET_WHOLE)}), "
          f"CPU {med[1]:.3f} ({_verdict(med[1], TARGET_WHOLE)}); target <= {TARGET_WHOLE}")
    print(f"overhead: per step outside the profiled windows: wall {med[2]:.3f} ({_verdict(med[2], TARGET_STEP)}), "
          f"CPU {med[3]:.3f} ({_verdict(med[3], TARGET_STEP)}); target <= {TARGET_STEP}")
    def med_cost(key: str) -> float:
        return statistics.median(c[key] for c, _ in costs)

    own = statistics.median(
        (c["start"] + c["end"] + c["windows"] + c["bookkeeping_total"]) / wb for c, wb in costs
    )
    print(
        "overhead: gpudoctor's own costs (medians): start-up {:.0f} ms, windows {:.0f} ms in all, "
        "bookkeeping {:.0f} µs per step ({:.2f}% of a {:.1f} ms step), end {:.0f} ms".format(
            med_cost("start") * 1e3, med_cost("windows") * 1e3, med_cost("bookkeeping_per_step") * 1e6,
            100 * med_cost("bookkeeping_per_step") / med_cost("median_step"), med_cost("median_step") * 1e3,
            med_cost("end") * 1e3,
        )
    )
    print(f"overhead: their sum over the bare run's wall time: {1 + own:.3f} ({_verdict(1 + own, TARGET_WHOLE)})")
    if not args.in_process:
        hook_costs_ab(work, args.ab_runs, args.ab_steps, shapes)
        hook_costs(work, args.hook_pairs, args.hook_steps, shapes)
    print(f"overhead: runs kept in {work}")


# the script under gpudoctor.session() in its own process: the session starts after Python and gpudoctor's
# import, torch is imported by the session (a bare run imports it too), the report is not made (as --no-report)
IN_PROCESS = """
import runpy, sys
import gpudoctor
out, script, *args = sys.argv[1:]
sys.argv = [script, *args]
with gpudoctor.session(out=out, diagnose=False):
    runpy.run_path(script, run_name="__main__")
"""


def _profiled(in_process: bool, out_dir: str, gpudoctor_args: list[str], script_args: list[str]) -> list[str]:
    if in_process:
        if gpudoctor_args:
            sys.exit("overhead: --in-process takes no gpudoctor profile options")
        return [sys.executable, "-c", IN_PROCESS, out_dir, str(SCRIPT), *script_args]
    return [sys.executable, "-m", "gpudoctor", "profile", "--no-report", "--out", out_dir, *gpudoctor_args,
            str(SCRIPT), "--", *script_args]


if __name__ == "__main__":
    main()
