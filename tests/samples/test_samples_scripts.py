"""The bundled sample scripts: their docstrings, their command line, and that they run.

The docstring test reads the files only. ``--help`` and the quick runs go through
``quick_runner.py`` in one subprocess (torch imported once), so the scripts run
as ``python SCRIPT ARGS`` would, without touching this process's torch state.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_scripts"
RUNNER = Path(__file__).with_name("quick_runner.py")

# The scenarios of issue 6, with the code each must be diagnosed with.
SCENARIOS = {
    "starved_dataloader": ("GD201",),
    "worker_restart": ("GD202",),
    "cpu_preprocessing_in_loop": ("GD203",),
    "oversubscribed_threads": ("GD204",),
    "pageable_copies": ("GD301", "GD302"),
    "host_sync_every_step": ("GD102",),
    "tiny_batch_launch_bound": ("GD103",),
    "fp32_convnet": ("GD401",),
    "cudnn_benchmark_off": ("GD403",),
    "empty_cache_every_step": ("GD502",),
    "data_parallel": ("GD601",),
    "eval_without_no_grad": ("GD701",),
    "tuned_baseline": (),
    # issue 12: loops not shaped like the others (the step marker each exercises)
    "rnn_manual_updates": ("GD203",),  # backward(): parameters updated by hand, batches sliced from text
    "inference_over_tensors": ("GD701",),  # the root module's forward: inference over a list of tensors
    "grad_accumulation_slow_collate": ("GD201",),  # optimizer.step() over 4 micro-batches each
    # issue 26: compiled code (torch.compile, backend aot_eager on this CPU machine)
    "compiled_tiny_batch": ("GD103",),  # compiled and still launch-bound: a larger batch, never "compile it"
    "recompiles_every_step": ("GD105",),  # dynamic=False on a length that changes every batch
}
GPU_ONLY = {"pageable_copies", "host_sync_every_step", "fp32_convnet", "cudnn_benchmark_off", "empty_cache_every_step"}
SCRIPTS = sorted(p.stem for p in SAMPLES.glob("*.py") if not p.name.startswith("_"))


def _load_accuracy():
    spec = importlib.util.spec_from_file_location("gpudoctor_bench_accuracy", ROOT / "benchmarks" / "accuracy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _docstring(name: str) -> str:
    path = SAMPLES / f"{name}.py"
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def _run_cases(cases: list[tuple[str, list[str]]], tmp: Path, timeout_s: float) -> list[dict]:
    cases_path, results_path = tmp / "cases.json", tmp / "results.json"
    cases_path.write_text(json.dumps([[str(SAMPLES / f"{n}.py"), a] for n, a in cases]), encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, str(RUNNER), str(cases_path), str(results_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the runner and the DataLoader workers it started
        out, err = proc.communicate()
        pytest.fail(f"sample scripts still running after {timeout_s:.0f} s; last started:\n{err[-2000:]}")
    assert proc.returncode == 0, f"quick_runner failed:\n{out[-3000:]}\n{err[-3000:]}"
    return json.loads(results_path.read_text(encoding="utf-8"))


def test_every_scenario_of_the_issue_is_there():
    assert set(SCENARIOS) <= set(SCRIPTS), f"missing: {sorted(set(SCENARIOS) - set(SCRIPTS))}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_docstring_declares_problem_code_and_fix(name):
    doc = _docstring(name)
    assert doc, f"{name}.py has no module docstring"
    assert doc.splitlines()[0].strip().endswith("."), "the first line is a one-sentence summary"
    assert re.search(r"^Problem: \S", doc, re.MULTILINE), "a 'Problem:' paragraph"
    assert re.search(r"^Fix: \S", doc, re.MULTILINE), "a 'Fix:' paragraph"
    expected = re.findall(r"^Expected: (.+)$", doc, re.MULTILINE)
    assert len(expected) == 1, "exactly one 'Expected:' line"
    assert re.fullmatch(r"none|GD\d{3}(, GD\d{3})*", expected[0]), f"bad Expected line: {expected[0]!r}"
    needs = re.findall(r"^Needs: (.+)$", doc, re.MULTILINE)
    assert needs in ([], ["GPU"]), f"'Needs:' is 'GPU' or absent, got {needs}"
    if name in SCENARIOS:
        want = ", ".join(SCENARIOS[name]) or "none"
        assert expected[0] == want
        assert (needs == ["GPU"]) == (name in GPU_ONLY)
    # the benchmark reads the same lines
    scenario = _load_accuracy().parse_docstring(SAMPLES / f"{name}.py")
    assert scenario.expected == (() if expected[0] == "none" else tuple(expected[0].split(", ")))
    assert scenario.needs_gpu == bool(needs)


def test_expected_codes_exist_in_the_catalogue():
    """Every code a script expects is a rule of the catalogue."""
    from gpudoctor.rules import registry

    codes = {r.code for r in registry.all_rules()}
    wanted = {c for cs in SCENARIOS.values() for c in cs}
    assert wanted <= codes, f"codes not in the catalogue: {sorted(wanted - codes)}"


def test_help(tmp_path):
    results = _run_cases([(n, ["--help"]) for n in SCRIPTS], tmp_path, timeout_s=120)
    for name, r in zip(SCRIPTS, results, strict=True):
        assert r["exit_code"] == 0, f"{name} --help: {r['error']}"
        assert "--fixed" in r["stdout"] and "--quick" in r["stdout"], f"{name} --help lacks --fixed/--quick"


@pytest.mark.slow
def test_every_script_runs_planted_and_fixed_with_a_tiny_size(tmp_path):
    """Each script, CPU and GPU ones alike, runs to completion on this machine in both variants."""
    cases = [(n, ["--quick", *fixed]) for n in SCRIPTS for fixed in ([], ["--fixed"])]
    results = _run_cases(cases, tmp_path, timeout_s=600)
    failures = []
    for (name, args), r in zip(cases, results, strict=True):
        if r["exit_code"] != 0:
            failures.append(f"{name} {' '.join(args)}: exit {r['exit_code']}\n{r['error']}")
    assert not failures, "\n".join(failures)
