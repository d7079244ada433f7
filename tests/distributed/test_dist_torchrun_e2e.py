"""End to end on the CPU with gloo: `gpudoctor profile --nproc-per-node N` through torchrun.

Two ranks that are equal (no GD603), three ranks with a planted sleep in one (GD603 names
it), and a rank that raises (the others' data survives and the manifest names the rank).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "ddp_train.py"
ROOT = Path(__file__).resolve().parents[2]
SCHEDULE = ("--skip-first", "2", "--warmup", "1", "--active", "5", "--repeat", "1")

pytestmark = pytest.mark.slow


def profile(tmp_path: Path, nproc: int, **knobs: str) -> tuple[subprocess.CompletedProcess[str], Path, dict]:
    env = os.environ.copy()
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(knobs)
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "profile", "--out", str(out), *SCHEDULE, "--nproc-per-node", str(nproc),
         "--format", "json", str(SCRIPT)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return proc, run_dir, json.loads((run_dir / "manifest.json").read_text())


def _report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


def test_two_equal_ranks(tmp_path):
    proc, run_dir, m = profile(tmp_path, 2, DDP_STEPS="10", DDP_SLEEP_MS="60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert m["launcher"] == "torchrun" and m["world_size"] == 2 and m["status"] == "completed"
    assert [e["rank"] for e in m["rank_ends"]] == [0, 1] and all(e["status"] == "completed" for e in m["rank_ends"])
    assert m["failed_rank"] is None
    for r in range(2):
        assert (run_dir / f"steps.rank{r}.jsonl").is_file() and (run_dir / f"settings.rank{r}.json").is_file()
    assert len(m["traces"]) == 2
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    roles = {(s["role"], s.get("rank")) for s in samples if s["kind"] == "process"}
    assert {("main", 0), ("main", 1), ("launcher", None)} <= roles
    rep = _report(run_dir)
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]
    assert all(r["profiled_steps"] == 5 and r["comm_ns"] > 0 for r in rep["ranks"])
    assert rep["rank_summary"]["basis"] == "work" and rep["rank_summary"]["straggler_rank"] is None, (rep["rank_summary"], rep["ranks"])
    assert "GD603" not in {f["code"] for f in rep["findings"]}
    ddp = json.loads((run_dir / "settings.rank0.json").read_text())["wrappers"][0]
    assert ddp["kind"] == "DistributedDataParallel" and ddp["options"]["backend"] == "gloo"
    assert ddp["options"]["unused_parameter_checks"] >= 1


def test_three_ranks_one_planted_straggler(tmp_path):
    proc, run_dir, m = profile(tmp_path, 3, DDP_STEPS="10", DDP_SLEEP_MS="60", DDP_SLOW_RANK="2", DDP_SLOW_MS="60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert m["world_size"] == 3 and len(m["rank_ends"]) == 3
    rep = _report(run_dir)
    (f,) = [f for f in rep["findings"] if f["code"] == "GD603"]
    assert f["rank"] == 2 and f["message"].startswith("rank 2 is the straggler")
    assert rep["rank_summary"]["straggler_rank"] == 2
    assert [r["straggler"] for r in rep["ranks"]] == [False, False, True]
    # the others wait for it in the all-reduce: their exposed communication is a large part of the step
    exposed = [r["comm_exposed_pct"] for r in rep["ranks"]]
    assert min(exposed[0], exposed[1]) > exposed[2] + 20, exposed


def test_a_rank_that_raises(tmp_path):
    proc, run_dir, m = profile(tmp_path, 2, DDP_STEPS="10", DDP_FAIL_RANK="1", DDP_FAIL_STEP="5")
    assert proc.returncode == 1
    assert "planted failure on rank 1" in proc.stderr  # the script's own traceback, as torchrun shows it
    assert m["status"] == "failed" and m["failed_rank"] == 1
    assert m["status_detail"].startswith("rank 1 failed: RuntimeError: planted failure on rank 1 at step 5")
    assert m["exception"]["type"] == "RuntimeError" and m["exception"]["call_site"]["file"].endswith("ddp_train.py")
    ends = {e["rank"]: e for e in m["rank_ends"]}
    assert ends[1]["status"] == "failed" and ends[0]["status"] in ("failed", "killed")
    # every rank's data survives: the steps before the failure, settings, the window in progress
    for r in range(2):
        steps = (run_dir / f"steps.rank{r}.jsonl").read_text().splitlines()
        assert len(steps) == 5 and json.loads(steps[-1])["index"] == 4
        assert (run_dir / f"settings.rank{r}.json").is_file()
        assert ends[r]["traces"] and (run_dir / ends[r]["traces"][0]).is_file()
    rep = _report(run_dir)
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]
