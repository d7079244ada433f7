"""Can a user bet on ``--verify``? A/A trials and a planted effect, on this machine, as it is.

Two experiments on ``benchmarks/verify_loop.py`` (a little compute, a wait, a planted tail),
each a full ``gpudoctor.verify.measure`` (the trial runs, the rounds, the looks, the load
checks: the code ``gpudoctor verify`` runs), not a simulation:

- **A/A**: the unchanged script on both sides, the "fix" an ``env`` injection that changes
  nothing (``VERIFY_LOOP_MARK=1``). ``--aa`` sessions, every other one with a CPU hog
  started beside it (a Python process spinning on one core for the whole session). The
  true speed-up is 1: a "confirmed" is a false confirm, a "refuted" as *slower* (the whole
  interval under 1/1.05) is a false alarm. "Refuted: no gain worth the fix" (the whole
  interval under the 1.05× a fix must win) is the right answer for a change that does
  nothing, and is counted apart.
  Targets: false confirms at most α (5%), none called slower.
- **Planted effect**: the script with a 30 ms tail on every fifth step (``--tail-ms 30``)
  against the fix that removes it (an ``env`` injection setting ``VERIFY_LOOP_TAIL_MS=0``): the median step does
  not move, time per step does. The true ratio is measured apart, from ``--calibration`` pairs
  of runs before and after the repetitions (each run's judged steps, as the trials judge
  them). Targets: every repetition confirmed, and its interval covers the true ratio in at
  least 90% of them.

- **A load on one side only** (``--lopsided``): A/A sessions where the CPU hog runs during the
  fix's runs only, as when another job starts and stops at the wrong moments. The target:
  never confirmed or called slower; ``inconclusive`` with the load as the reason.

For each A/A session's first look (3 runs a side) it also says what the statistics ``--verify``
used before the run became the unit would have concluded on the same runs: the steps of all
runs of a side pooled as independent draws (the bootstrap interval of the ratio of medians and its
test from the same resamples, ``analysis.stats.speedup_stats``; Mann-Whitney U before issue 42).

    python benchmarks/verify_aa.py                      # 40 A/A (20 with a hog), 4 lopsided, 20 planted
    python benchmarks/verify_aa.py --aa 10 --planted 5  # a quick look
    python benchmarks/verify_aa.py --json verify_aa.json

Prints one line per session and the figures at the end (docs/verify.md has the ones
measured on the shared 2-core CI machine). Exit status 1 when a target is missed. Takes
about 25-35 minutes with the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpudoctor.analysis.stats import run_speedup_stats, speedup_stats  # noqa: E402
from gpudoctor.config import Config  # noqa: E402
from gpudoctor.model import Injection, Verification, VerifyStatus  # noqa: E402
from gpudoctor.verify import VerifyOptions, _Arm, _steady, decide, measure  # noqa: E402

LOOP = ROOT / "benchmarks" / "verify_loop.py"
TAIL_MS = 30.0
MARK = Injection("env", "VERIFY_LOOP_MARK", "1", text="VERIFY_LOOP_MARK=1 (changes nothing)")
UNTAIL = Injection("env", "VERIFY_LOOP_TAIL_MS", "0", text="VERIFY_LOOP_TAIL_MS=0 (the tail removed)")
HOG = "import time\nend = time.monotonic() + 3600\nwhile time.monotonic() < end:\n    pass\n"


def _profile(work: Path, name: str, args: tuple[str, ...], steps: int) -> Any:
    """The profiled run verify starts from (a run directory with its manifest, which the trial runs
    repeat: the same arguments), read back."""
    from gpudoctor.collect import ProfileOptions, profile_run  # noqa: PLC0415
    from gpudoctor.parse import load_inputs  # noqa: PLC0415

    shutil.copy(LOOP, work / LOOP.name)
    run_dir = work / name
    profile_run(ProfileOptions(script=LOOP.name, args=args, cwd=str(work), run_dir=run_dir, max_steps=steps,
                               torch_profiler=False, cprofile=False, summary=False, output_log=True))
    return load_inputs([run_dir]).run


class Hog:
    """A Python process spinning on one core while the ``with`` block runs."""

    def __enter__(self) -> Hog:
        self.proc = subprocess.Popen([sys.executable, "-c", HOG])
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def _pooled_verdict(arm: _Arm, baseline: _Arm, rounds: int, warmup: int) -> str:
    """What the statistics of before (steps pooled over runs as independent) said at the first look."""
    a = [s.wall_ns for r in baseline.runs if r.ok and r.round <= rounds for s in _steady(r, warmup)]
    b = [s.wall_ns for r in arm.runs if r.ok and r.round <= rounds for s in _steady(r, warmup)]
    if len(a) < 5 or len(b) < 5:
        return "-"
    st = speedup_stats(a, b)
    if st.speedup is None or st.ci_low is None or st.ci_high is None:
        return "inconclusive"
    if st.significant and st.ci_low > 1.0 and st.speedup >= 1.05:
        return "confirmed"
    if st.ci_high < 1.0:
        return "slower"
    if st.ci_high < 1.05:
        return "no_gain"
    return "inconclusive"


def _kind(v: Verification) -> str:
    """confirmed, slower, no_gain or inconclusive (``verify.decide``'s kinds; the load checks' too)."""
    if v.status == VerifyStatus.REFUTED:
        return "slower" if "slower with the fix" in v.reason else "no_gain"
    return v.status.value


def _rekind(r: dict[str, Any]) -> str:
    """A saved session's kind by today's ``verify.decide`` (a JSON written by an earlier version)."""
    if r["status"] != "refuted" or not r["ci"]:
        return r["kind"]
    kind = decide(r["speedup"], r["ci"][0], r["ci"][1], Config().thresholds.verify_min_speedup_ratio)[1]
    return "slower" if kind == "slower" else "no_gain"  # the saved interval is rounded: refuted stays refuted


def session(run: Any, change: Injection, opts: VerifyOptions, hog: bool) -> dict[str, Any]:
    """One verify of one "fix", measured as ``gpudoctor verify`` measures it."""
    arm = _Arm("AA" if change is MARK else "planted", (change,))
    t0 = time.monotonic()
    if hog:
        with Hog():
            out, sess = measure(run, [arm], Config(), opts)
    else:
        out, sess = measure(run, [arm], Config(), opts)
    v = out[arm.label]
    pooled = _pooled_verdict(arm, sess.baseline, opts.trials, opts.warmup_steps) if sess and sess.baseline else "-"
    gap = None
    if v.load_baseline and v.load_trial and v.load_baseline.others_cpu_pct is not None \
            and v.load_trial.others_cpu_pct is not None:
        gap = v.load_trial.others_cpu_pct - v.load_baseline.others_cpu_pct
    return {
        "hog": hog,
        "status": v.status.value,
        "kind": _kind(v),
        "speedup": v.speedup,
        "ci": list(v.ci) if v.ci else None,
        "median_speedup": v.median_speedup,
        "looks": v.looks,
        "runs_a_side": v.trials,
        "load_reason": v.load_reason,
        "others_cores": (v.load_baseline.others_cpu_pct / 100) if v.load_baseline and v.load_baseline.others_cpu_pct is not None else None,
        "runq_wait_pct": v.load_baseline.runq_wait_pct if v.load_baseline else None,
        "load_gap_pct": gap,
        "per_run_ms": {side: [round(r.step_ns / 1e6, 3) for r in v.per_run if r.arm == side and r.step_ns]
                       for side in ("baseline", "trial")},
        "seconds": round(time.monotonic() - t0, 1),
        "pooled_first_look": pooled,
        "reason": v.reason,
    }


def lopsided(run: Any, opts: VerifyOptions) -> dict[str, Any]:
    """An A/A session with the hog beside the fix's runs only (``verify.trials._trial`` wrapped)."""
    from gpudoctor.verify import trials  # noqa: PLC0415

    plain = trials._trial

    def trial(manifest, run_dir, rel, changes, *a, **kw):  # noqa: ANN001, ANN002, ANN003
        if not changes:
            return plain(manifest, run_dir, rel, changes, *a, **kw)
        with Hog():
            return plain(manifest, run_dir, rel, changes, *a, **kw)

    trials._trial = trial
    try:
        return session(run, MARK, opts, False)
    finally:
        trials._trial = plain


def calibrate(run: Any, opts: VerifyOptions, pairs: int) -> list[tuple[float, float]]:
    """(tail, no tail) time per step of ``pairs`` interleaved pairs of runs, judged as the trials are."""
    one = dataclasses.replace(opts, trials=pairs, max_trials=pairs, ladder=False)
    arm = _Arm("calibration", (UNTAIL,))
    out, _ = measure(run, [arm], Config(), one)
    v = out["calibration"]
    base = [r.step_ns for r in v.per_run if r.arm == "baseline" and r.step_ns]
    fix = [r.step_ns for r in v.per_run if r.arm == "trial" and r.step_ns]
    return list(zip(base, fix, strict=False))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aa", type=int, default=40, help="A/A sessions (every other one with a CPU hog)")
    p.add_argument("--planted", type=int, default=20, help="planted-effect repetitions")
    p.add_argument("--lopsided", type=int, default=4, help="A/A sessions with the hog beside the fix's runs only")
    p.add_argument("--calibration", type=int, default=6, help="pairs of runs before and after, for the true ratio")
    p.add_argument("--steps", type=int, default=30, help="steps of each trial run")
    p.add_argument("--trials", type=int, default=3, help="rounds before the first look")
    p.add_argument("--max-trials", type=int, default=6, help="rounds at most for an undecided session")
    p.add_argument("--json", type=Path, default=None, help="write every session's figures here")
    p.add_argument("--verbose", action="store_true", help="every trial run's progress line")
    p.add_argument("--summarize", type=Path, default=None, metavar="JSON",
                   help="print the figures of a --json file written before, and run nothing")
    args = p.parse_args()
    if args.summarize:
        results = json.loads(args.summarize.read_text())
        for r in (*results["aa"], *results["planted"], *results.get("lopsided", [])):
            r["kind"] = _rekind(r)
        return summarize(results, None)
    opts = VerifyOptions(steps=args.steps, trials=args.trials, max_trials=args.max_trials, budget_s=3600.0,
                         ladder=False, progress=(lambda line: print(line, file=sys.stderr)) if args.verbose else None)
    results: dict[str, Any] = {"aa": [], "planted": [], "calibration": {}, "lopsided": []}
    with tempfile.TemporaryDirectory(prefix="gpudoctor-verify-aa-") as tmp:
        work = Path(tmp)
        if args.aa:
            run = _profile(work, "aa", (), 40)
            for i in range(args.aa):
                hog = i % 2 == 1
                r = session(run, MARK, opts, hog)
                results["aa"].append(r)
                ci = f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if r["ci"] else "-"
                print(f"A/A {i + 1:>2}/{args.aa} {'hog ' if hog else 'none'} {r['kind']:<12} {r['speedup'] or 0:.3f}x "
                      f"{ci:<16} looks {r['looks']} runs {r['runs_a_side']} others {r['others_cores'] or 0:.2f} cores "
                      f"gap {r['load_gap_pct'] or 0:+.0f}; pooled steps: {r['pooled_first_look']} ({r['seconds']:.0f} s)"
                      + (f" load: {r['load_reason'][:80]}" if r["load_reason"] else ""), flush=True)
        if args.lopsided:
            run = _profile(work, "lopsided", (), 40)
            for i in range(args.lopsided):
                r = lopsided(run, opts)
                results["lopsided"].append(r)
                print(f"lopsided {i + 1}/{args.lopsided} {r['kind']:<12} {r['speedup'] or 0:.3f}x gap "
                      f"{r['load_gap_pct'] or 0:+.0f} ({r['seconds']:.0f} s) {r['load_reason'][:100]}", flush=True)
        if args.planted:
            run = _profile(work, "planted", ("--tail-ms", f"{TAIL_MS:g}"), 40)
            before = calibrate(run, opts, args.calibration) if args.calibration else []
            for i in range(args.planted):
                r = session(run, UNTAIL, opts, False)
                results["planted"].append(r)
                ci = f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if r["ci"] else "-"
                print(f"planted {i + 1:>2}/{args.planted} {r['kind']:<12} {r['speedup'] or 0:.3f}x {ci:<16} median "
                      f"{r['median_speedup'] or 0:.3f}x looks {r['looks']} ({r['seconds']:.0f} s)", flush=True)
            after = calibrate(run, opts, args.calibration) if args.calibration else []
            pairs = before + after
            if pairs:
                st = run_speedup_stats([a for a, _ in pairs], [b for _, b in pairs])
                results["calibration"] = {"pairs": len(pairs), "true_ratio": st.speedup,
                                          "ci": [st.ci_low, st.ci_high], "tail_ms": TAIL_MS}
    return summarize(results, args.json)


def summarize(results: dict[str, Any], out: Path | None) -> int:
    """Print the figures and the targets; write ``results`` to ``out``; 1 when a target is missed."""
    misses: list[str] = []
    aa = results["aa"]
    if aa:
        print("\nA/A: the same script both sides (true speed-up 1)")
        for label, rows in (("all", aa), ("no hog", [r for r in aa if not r["hog"]]), ("CPU hog", [r for r in aa if r["hog"]])):
            if not rows:
                continue
            n = len(rows)
            kinds = {k: sum(r["kind"] == k for r in rows) for k in ("confirmed", "slower", "no_gain", "inconclusive")}
            unfair = sum(bool(r["load_reason"]) for r in rows)
            second = sum(r["looks"] == 2 for r in rows)
            print(f"  {label:<8} {n:>3} sessions: false confirms {kinds['confirmed']} ({100 * kinds['confirmed'] / n:.1f}%), "
                  f"called slower {kinds['slower']}, no gain {kinds['no_gain']}, inconclusive {kinds['inconclusive']} "
                  f"(of which the load {unfair}); second look {second}; "
                  f"others {statistics.median(r['others_cores'] or 0 for r in rows):.2f} cores (median), "
                  f"load gap max {max(abs(r['load_gap_pct'] or 0) for r in rows):.0f}")
            pooled = {k: sum(r["pooled_first_look"] == k for r in rows) for k in ("confirmed", "slower")}
            print(f"  {'':<8} the same runs' first look with steps pooled as independent (before): "
                  f"confirmed {pooled['confirmed']}, called slower {pooled['slower']}")
            results[f"aa_{label}"] = {"sessions": n, **kinds, "load_inconclusive": unfair, "second_look": second,
                                      "pooled_confirmed": pooled["confirmed"], "pooled_slower": pooled["slower"]}
        n = len(aa)
        fc = sum(r["kind"] == "confirmed" for r in aa)
        if fc / n > 0.05:
            misses.append(f"A/A false confirms {fc}/{n} > 5%")
        if any(r["kind"] == "slower" for r in aa):
            misses.append("an A/A session was called slower")
        if sum(r["hog"] for r in aa) < n // 2:
            misses.append("fewer than half the A/A sessions had a hog")
    side = results.get("lopsided") or []
    if side:
        n = len(side)
        unfair = sum(bool(r["load_reason"]) for r in side)
        wrong = sum(r["kind"] in ("confirmed", "slower") for r in side)
        gaps = [r["load_gap_pct"] or 0 for r in side]
        print(f"\nA load on one side only (the hog beside the fix's runs): {n} sessions, inconclusive for the load "
              f"{unfair}, confirmed or called slower {wrong}; others' CPU gap {min(gaps):+.0f} to {max(gaps):+.0f} "
              "(100 = one core)")
        results["lopsided_summary"] = {"sessions": n, "load_inconclusive": unfair, "wrong": wrong}
        if wrong:
            misses.append(f"{wrong} lopsided session(s) confirmed or called slower")
    planted = results["planted"]
    cal = results.get("calibration") or {}
    if planted:
        true = cal.get("true_ratio")
        print(f"\nPlanted effect: a {TAIL_MS:g} ms tail on every fifth step removed")
        if true:
            print(f"  true ratio {true:.3f}x (calibration: {cal['pairs']} interleaved pairs of runs, "
                  f"95% CI {cal['ci'][0]:.3f}-{cal['ci'][1]:.3f})")
        n = len(planted)
        confirmed = sum(r["status"] == "confirmed" for r in planted)
        covered = sum(bool(r["ci"]) and true is not None and r["ci"][0] <= true <= r["ci"][1] for r in planted)
        medians = [r["median_speedup"] for r in planted if r["median_speedup"]]
        widths = [r["ci"][1] / r["ci"][0] for r in planted if r["ci"]]
        print(f"  {n} repetitions: confirmed {confirmed}, interval covers the true ratio {covered} "
              f"({100 * covered / n:.0f}%); speed-up median {statistics.median(r['speedup'] or 0 for r in planted):.3f}x, "
              f"the median step's {statistics.median(medians) if medians else math.nan:.3f}x; interval width "
              f"(high/low) median {statistics.median(widths) if widths else math.nan:.3f}")
        results["planted_summary"] = {"repetitions": n, "confirmed": confirmed, "covered": covered}
        if confirmed < n:
            misses.append(f"planted effect confirmed in {confirmed}/{n}")
        if true is None or covered / n < 0.9:
            misses.append(f"planted coverage {covered}/{n} < 90%")
    if out is not None:
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print("\n" + ("targets met" if not misses else "MISSED: " + "; ".join(misses)))
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
