"""Each sentence of a report takes its figures from one statistic (issue 38): a share and the two times
beside it agree, a model's "won" is its own "after" and "now", a speed-up is its share, a top action's
step after is its share of "now". Checked on synthetic runs through the engine, on real CPU runs of the
sample scripts, and on the recorded GPU runs of ../shared/gpu-runs when present."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from figures_agree import _action_checks, checked, disagreements, report_disagreements

ROOT = Path(__file__).resolve().parents[2]
GPU_RUNS = ROOT.parent / "shared" / "gpu-runs"
MS = 1_000_000


def test_the_check_catches_figures_of_two_statistics() -> None:
    """The issue's sentence: a share of sums beside a median wait of a median step (by its own figures,
    95.7%, not 87.4%); and each other kind of sentence, right and wrong."""
    bad = ("the loop waits 87.4% of step time for the next batch (30.64 ms of a 32.03 ms step, median over "
           "119 steps)")
    assert disagreements([bad])
    assert not disagreements([bad.replace("87.4%", "95.7%")])
    assert not disagreements(["GPU 0 idle 99.8% of the 1 step windows (223.80 ms of 224.19 ms)"])
    won = ("step per batch = max(compute 136.25 ms, load 55.56 ms ÷ 2 worker(s)) + hand-over 1.00 ms = 137.25 ms, "
           "against 191.81 ms now (means per batch over the 28 steps no instrument ran in): 98.2% of the 55.56 ms "
           "wait won")
    assert not disagreements([won])
    assert disagreements([won.replace("98.2%", "90.0%")])
    assert not disagreements(["expected −28.4% of step time, about 1.40× faster, at most 28.9% of step time at "
                              "stake, up to 1.41× faster"])
    assert disagreements(["expected −28.4% of step time, about 1.20× faster"])


def test_the_readme_example_agrees_with_itself() -> None:
    """The README's worked example is a real run's output: its sentences check out as a report's do."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## What you get", 1)[1].split("```", 2)[1]
    flat = " ".join(block.split())  # its lines are wrapped
    assert checked(flat) >= 4, flat
    assert disagreements([flat]) == [] and list(_action_checks(flat)) == []


def _skewed_cpu_run():
    """A CPU run whose steps wait unevenly (a loader that falls behind every third step): medians and
    means differ, as on real runs."""
    from rule_builders import (
        cpu_manifest,
        cpu_trace,
        dataloader,
        proc_samples,
        run,
        settings,
        steps,
    )

    from gpudoctor.model import Samples

    recs = list(steps(60, 100.0, 10.0))
    for i in range(0, 60, 3):
        recs[i] = dataclasses.replace(recs[i], wall_ns=190 * MS, data_wait_ns=100 * MS)
    return run(manifest=cpu_manifest(), settings=settings(device_type="cpu", dataloaders=(dataloader(),)),
               steps=tuple(recs), metrics=(cpu_trace(),), samples=Samples(process=proc_samples(100.0)))


@pytest.fixture(autouse=False)
def _rule_builders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "rules"))


@pytest.mark.usefixtures("_rule_builders")
def test_a_synthetic_run_s_report_agrees_with_itself() -> None:
    from gpudoctor.config import Config
    from gpudoctor.engine import diagnose

    report = diagnose(_skewed_cpu_run(), Config(), kind="profile")
    assert any(f.code == "GD201" for f in report.findings)  # the sentence the issue quotes is there
    assert report_disagreements(report) == []


def _profile(tmp_path: Path, script: str, *args: str) -> Path:
    shutil.copy(ROOT / "sample_scripts" / script, tmp_path / script)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "gpudoctor", "profile", "--out", "runs", "--steps", "40", "--quiet",
                           script, *args], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("script", ["starved_dataloader.py", "grad_accumulation_slow_collate.py"])
def test_real_cpu_runs_agree_with_themselves(script: str, tmp_path: Path) -> None:
    from gpudoctor.model import Report

    run_dir = _profile(tmp_path, script)
    report = Report.from_dict(json.loads((run_dir / "report.json").read_text()))
    assert report.findings
    assert report_disagreements(report) == []


@pytest.mark.slow
@pytest.mark.skipif(not GPU_RUNS.is_dir(), reason="no recorded GPU runs (../shared/gpu-runs)")
def test_the_recorded_gpu_runs_agree_with_themselves() -> None:
    from gpudoctor.config import Config
    from gpudoctor.engine import diagnose
    from gpudoctor.pipeline import analyze_paths

    runs = sorted(p.parent for p in GPU_RUNS.glob("*/*/manifest.json"))
    assert runs
    out = {}
    for d in runs:
        report = diagnose(analyze_paths([str(d)], jobs=1), Config(), kind="analyze")
        found = report_disagreements(report)
        if found:
            out[d.name] = found
    assert out == {}
