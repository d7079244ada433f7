"""Helpers shared by the collect tests: run `gpudoctor profile`, read a run directory."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ROOT = Path(__file__).resolve().parents[2]

# small windows so that a 16-step script is profiled twice
FAST_SCHEDULE = ("--skip-first", "2", "--warmup", "1", "--active", "3", "--wait", "2", "--repeat", "2")


def env() -> dict[str, str]:
    e = os.environ.copy()
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def profile_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpudoctor", "profile", *args]


def run_profile(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(profile_cmd(*args), cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)


def copy_script(name: str, dest: Path) -> Path:
    src = SCRIPTS / name
    if src.is_dir():
        shutil.copytree(src, dest / name)
    else:
        shutil.copy(src, dest / name)
    return dest / name


def only_run_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def manifest(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "manifest.json").read_text())


def settings(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "settings.json").read_text())


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps(run_dir: Path) -> list[dict[str, Any]]:
    return jsonl(run_dir / "steps.jsonl")


def samples(run_dir: Path) -> list[dict[str, Any]]:
    return jsonl(run_dir / "samples.jsonl")


def trace_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"]


def profiler_steps(path: Path) -> list[int]:
    return sorted(
        int(e["name"].split("#", 1)[1])
        for e in trace_events(path)
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    )


def collected(m: dict[str, Any], name: str) -> dict[str, Any]:
    hits = [c for c in m["collected"] if c["name"] == name]
    assert hits, (name, m["collected"])
    return hits[0]


def site_lines(script: Path) -> dict[str, int]:
    """Line numbers of ``# SITE:<name>`` tags in a test script."""
    out = {}
    for i, line in enumerate(script.read_text().splitlines(), 1):
        if "# SITE:" in line:
            out[line.split("# SITE:", 1)[1].strip()] = i
    return out


def wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def median_window_pct(run_dir: Path, component: str) -> float:
    """The median share of ``component`` (%) over every profiled window of the run's traces: on a shared
    machine a preempted instant lands in whatever part ran, and a few such windows do not move the median."""
    import statistics

    from gpudoctor.analysis import analyze_trace
    from gpudoctor.parse.inputs import load_trace

    shares = [100.0 * b.parts_ns.get(component, 0) / b.dur_ns
              for path in sorted(run_dir.glob("*.pt.trace.json.gz"))
              for b in analyze_trace(load_trace(path)).breakdown if b.dur_ns]
    assert len(shares) >= 5, shares
    return statistics.median(shares)
