"""The run's figures are computed in one place (DESIGN.md, "The run's figures"), beside the layer table's test.

``model/steady.py`` holds the definitions (the step populations, the step time and its spread, pure functions
of the step records) and ``analysis/figures.py`` applies them once per diagnosis; every other module reads
the result (``RuleContext.figures``, ``RunFigures``). A grep of the package's source finds what computes a step
time or a step population elsewhere: a call of the definitions, a sum, mean or median over the steps' times,
a choice of the steps no instrument ran in. The few callers that may not read the run's figures, and the sums
of ``wall_ns`` that are not a step time, are listed with why.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpudoctor"

HOME = {"model/steady.py", "analysis/figures.py"}

# what computes a step time or a step population, in words
COMPUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bloop_times\("), "times the steps at the rate the loop sustains"),
    # (a call of the module's function, ``steady.figure_steps(``, not a read of RuleContext's, ``ctx.steady_steps()``)
    (re.compile(r"(?<!self\.)(?<!ctx\.)(?<!\w)(unprofiled_steps|figure_steps|steady_steps|marked_steps|step_figures|"
                r"times_figures)\("), "makes a step population or the step figures"),
    (re.compile(r"\b(sum|median_int|median|fmean|mean|percentile_int|percentile)\(\s*\w+\.(wall_ns|gpu_ns)\s+for\b"),
     "sums, averages or takes a median of the steps' times"),
    (re.compile(r"\bif not \w+\.window\b"), "picks the steps no instrument ran in"),
    # the copies the run's figures replaced (a branch merged onto this one may still call them)
    (re.compile(r"\.step_time_ns\(|\.step_time_p90_ns\(|\b_MIN_MODEL_STEPS\b|\b_step_time\("),
     "calls a step time the run's figures replaced (RuleContext.step_time_ns, account._step_time, GD201's own)"),
)

# (module, the line's code) -> why it may: callers that cannot read the run's figures, and sums that are no step time
ALLOWED: dict[tuple[str, str], str] = {
    ("collect/summary.py", "figs = step_figures(steady_steps(records, step_source, loader, compiled))"):
        "the stderr line of `gpudoctor profile`: collect may not import analysis, so it calls the definitions "
        "(model.steady) on steps.jsonl as written: the report's values",
    ("verify/judging.py", "return times_figures([s.wall_ns for s in steps], StepSource.WALL, steps)"):
        "a trial run's time per step, by the function that computes the profiled run's",
    ("analysis/ledger.py", "total_ns = sum(s.wall_ns for s in steps)"):
        "the steps ledger's total: the account's window, which analysis.figures hands it",
    ("analysis/loader.py", "wall_ns=sum(x.wall_ns for x in covered),"):
        "a CPU reading's span (the steps a getrusage row covers), not a step time",
    ("rules/gd503_host_allocator_churn.py", "wall = sum(r.wall_ns for r in readings)"):
        "the CPU readings' span for a fault rate, not a step time",
}


def offences(relpath: str, text: str) -> list[str]:
    """Every line of a module that computes a step time or a step population outside the run's figures."""
    if relpath in HOME:
        return []
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0].strip()
        if not code or code.startswith("def ") or (relpath, code) in ALLOWED:
            continue
        for pattern, what in COMPUTES:
            if pattern.search(code):
                out.append(f"gpudoctor/{relpath}:{n} {what}: {code}")
    return out


def test_no_module_outside_the_run_s_figures_computes_a_step_time_or_a_population() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        found += offences(rel, path.read_text(encoding="utf-8"))
    assert found == [], "read the run's figures (RuleContext.figures, analysis.figures.run_figures):\n" + "\n".join(found)


def test_every_allowance_is_still_needed() -> None:
    """An allowance whose line is gone goes too: the list says what is left, no more."""
    for (rel, code), why in ALLOWED.items():
        text = (PACKAGE / rel).read_text(encoding="utf-8")
        assert any(line.split("#", 1)[0].strip() == code for line in text.splitlines()), (rel, code, why)


def test_the_grep_finds_each_kind_of_computation() -> None:
    """The checker itself: the copies the run's figures replaced are found."""
    copies = {
        "step = sum(s.wall_ns for s in steps) / batches": "sums",
        "step_med = median_int(st.wall_ns for st in others) or 0": "median",
        "plain = tuple(s for s in steps if not s.window)": "no instrument",
        "times, source = loop_times(steps)": "rate the loop",
        "return steady.figure_steps(self.steady_steps())": "population",
        "bare = unprofiled_steps(steady)": "population",
        "per = statistics.fmean(s.wall_ns for s in bare)": "sums",
        "step_ns = ctx.step_time_ns()": "replaced",
    }
    for code, what in copies.items():
        got = offences("rules/gdXXX.py", code)
        assert len(got) == 1 and what in got[0], (code, got)
    # reading the figures is no computation, nor is the run's figures' own module
    assert offences("rules/gdXXX.py", "steps = ctx.steady_steps()") == []
    assert offences("rules/gdXXX.py", "step = ctx.figures.job.step.step_ns") == []
    assert offences("analysis/figures.py", "times, source = loop_times(steps)") == []
