"""End to end on the CPU: `gpudoctor profile` of the compiled sample scripts.

The recompiling sample (``torch.compile(dynamic=False)`` on a length that changes every batch) is
diagnosed GD105 with each recompilation's step and reason, its summary names the warm-up, the
recompilations and the recompile limit, and its compile steps are left out of the steady steps;
the compiled sample's summary says it runs compiled, and no finding tells it to compile.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_scripts"


def _profile(tmp_path: Path, script: str, *args: str) -> dict:
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "profile", "--out", str(out),
         "--skip-first", "12", "--wait", "0", "--warmup", "1", "--active", "3", "--repeat", "1",
         "--no-cprofile", "--format", "json", str(SAMPLES / script), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    report = json.loads((run_dir / "report.json").read_text())
    report["_settings"] = json.loads((run_dir / "settings.json").read_text())
    report["_steps"] = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines() if line]
    return report


def _stat(report: dict, key: str):
    return next((s["value"] for s in report["summary"] if s["key"] == key), None)


@pytest.mark.slow
def test_the_recompiling_sample_is_diagnosed(tmp_path):
    report = _profile(tmp_path, "recompiles_every_step.py", "--samples", "800")  # 25 steps
    codes = [f["code"] for f in report["findings"]]
    assert "GD105" in codes, codes
    f = next(f for f in report["findings"] if f["code"] == "GD105")
    assert f["severity"] in ("error", "warning")
    assert "size mismatch at index 1" in f["message"] and "recompile limit (8) was reached" in f["message"]
    assert f["location"]["file"].endswith("recompiles_every_step.py")
    assert any(n.startswith("step 1: compile 0/1") for n in f["evidence"]["notes"])
    compiled = _stat(report, "compiled")
    assert "torch.compile(backend=aot_eager, dynamic=False)" in compiled
    assert "warm-up" in compiled and "recompilations in steps 1-7" in compiled and "recompile limit (8)" in compiled
    state = report["_settings"]["compile"]
    fwd = [e for e in state["events"] if e["trigger"] == "dynamo" and not e["failed"]]
    assert [e["step"] for e in fwd] == list(range(8))
    assert state["limit_hits"] == 1
    # the steady steps (the summary's step time) leave the compile steps out: 25 steps less steps 0-8, and of
    # those the profiler's windows and the step after each (the unprofiled ones: docs/account.md)
    steady = next(s for s in report["summary"] if s["key"] == "step_time_median")
    rows = report["_steps"]
    after = {r["index"] for r in rows if r["index"] >= 9}
    bare = [i for i in sorted(after) if not rows[i]["window"] and not (i - 1 in after and rows[i - 1]["window"])]
    assert len(after) == 16 and steady["window"] == f"{len(bare)} unprofiled steady steps", steady


@pytest.mark.slow
def test_the_compiled_sample_runs_compiled_and_is_never_told_to_compile(tmp_path):
    report = _profile(tmp_path, "compiled_tiny_batch.py", "--samples", "96")  # 24 steps of 4
    compiled = _stat(report, "compiled")
    assert compiled is not None and "torch.compile(backend=aot_eager)" in compiled
    assert "compiled regions per step" in compiled and "warm-up" in compiled
    assert "GD105" not in [f["code"] for f in report["findings"]]  # one shape: no recompilation
    for f in report["findings"]:
        text = f"{f['fix']['instruction']}\n{f['fix']['after']}"
        assert "compile the model with `torch.compile`" not in text, f["code"]
        assert "model = torch.compile(model)" not in f["fix"]["after"], f["code"]
    item = next(i for i in report["checklist"] if i["key"] == "torch-compile")
    assert item["status"] == "applied"
