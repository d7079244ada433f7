"""Issue 42, item 6: a diagnosis that holds whatever else runs on the machine.

Every sample script whose planted problem is a DataLoader finding (GD201, GD202, GD204), and the
calibration loop whose collate waits 20 ms (the issue's case: GD201 vanished under load, GD205 alone
remained), runs under ``gpudoctor profile --steps N`` twice: on the machine as it is, and beside a CPU hog
of two busy processes that the test starts and stops. The planted finding, and its ``file:line``, must be
the same in both; only its sizing (and with it the expected gain and the severity that follows from it: a
computing load on cores others hold can gain little) and GD205 (the machine's load) may differ; where GD205
fires, GD201's message says how busy the machine was. A pair that misses is run
once more, and fails only when it misses again: one stall on a shared 2-core machine is not a wrong rule.
A pair that misses where the run without the hog was itself busy (GD205 fired there: other processes held the
cores) has no quiet side and is not judged; when both pairs are such, the test is skipped and says so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "accuracy.py"
STEPS = 40  # the README's quick run: every scenario's problem shows within it
HOG_PROCESSES = 2  # busy processes beside the run: on 2 cores, most of the machine
LOADER_CODES = {"GD201", "GD202", "GD204"}
RUN_TIMEOUT_S = 600


def _scenarios() -> list[tuple[str, Path, list[str], tuple[str, ...]]]:
    spec = importlib.util.spec_from_file_location("gpudoctor_bench_accuracy_load", BENCH)
    acc = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = acc
    spec.loader.exec_module(acc)
    out = [(s.name, s.path, [], tuple(c for c in s.expected if c in LOADER_CODES))
           for s in acc.discover() if not s.needs_gpu and LOADER_CODES & set(s.expected)]
    out.append(("waiting_collate_20ms", ROOT / "benchmarks" / "calibration" / "waiting_loader.py",
                ["--wait-ms", "20"], ("GD201",)))
    return out


SCENARIOS = _scenarios()


class Hog:
    """``n`` processes that keep a core busy each, from start to stop."""

    def __init__(self, n: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(timeout=30)


def _profile(script: Path, args: list[str], out: Path) -> dict:
    """The report of ``gpudoctor profile --steps STEPS`` of the script: {code: (file:line, severity, finding)}."""
    cmd = [sys.executable, "-m", "gpudoctor", "profile", "--out", str(out), "--steps", str(STEPS), str(script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT,
                          env={**os.environ, "NO_COLOR": "1"})
    runs = [d for d in out.iterdir() if (d / "report.json").is_file()]
    assert len(runs) == 1, f"no report ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    report = json.loads((runs[0] / "report.json").read_text(encoding="utf-8"))
    found = {}
    for f in report["findings"]:
        loc = f.get("location") or {}
        found.setdefault(f["code"], (f"{Path(loc.get('file', '')).name}:{loc.get('line')}", f["severity"], f))
    return found


def _misses(expected: tuple[str, ...], quiet: dict, busy: dict) -> list[str]:
    out = []
    for code in expected:
        if code not in quiet or code not in busy:
            out.append(f"{code}: {'fired' if code in quiet else 'absent'} on the machine as it is, "
                       f"{'fired' if code in busy else 'absent'} beside the hog (findings: {sorted(quiet)} / {sorted(busy)})")
            continue
        if quiet[code][0] != busy[code][0]:
            out.append(f"{code}: at {quiet[code][0]} on the machine as it is, at {busy[code][0]} beside the hog")
        if "GD205" in busy and code == "GD201" and "(GD205)" not in busy[code][2]["message"]:
            out.append(f"{code}: beside GD205 its message does not say how busy the machine was")
    return out


def _pair(script: Path, args: list[str], tmp: Path) -> tuple[dict, dict]:
    quiet = _profile(script, args, tmp / "quiet")
    hog = Hog(HOG_PROCESSES)
    try:
        busy = _profile(script, args, tmp / "busy")
    finally:
        hog.stop()
    return quiet, busy


def test_the_scenarios_are_the_dataloader_ones():
    names = {name for name, *_ in SCENARIOS}
    assert {"starved_dataloader", "worker_restart", "waiting_collate_20ms"} <= names
    assert all(codes for *_, codes in SCENARIOS)


def test_a_hog_keeps_cores_busy_until_stopped():
    hog = Hog(1)
    try:
        assert all(p.poll() is None for p in hog.procs)
    finally:
        hog.stop()
    assert all(p.poll() is not None for p in hog.procs)


@pytest.mark.slow
@pytest.mark.timeout(8 * RUN_TIMEOUT_S)
@pytest.mark.parametrize(("name", "script", "args", "expected"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_the_planted_finding_holds_beside_a_cpu_hog(name, script, args, expected, tmp_path):
    busy_anyway = []
    first: list[str] | None = None
    for attempt in ("1", "2"):
        quiet, busy = _pair(script, args, tmp_path / attempt)
        misses = _misses(expected, quiet, busy)
        if not misses:
            return
        if "GD205" in quiet:  # other processes held the cores without the hog: no quiet side to compare with
            busy_anyway.append(quiet["GD205"][2]["message"])
            continue
        if first is not None:
            pytest.fail(f"{name}: {'; '.join(misses)} (and in the first pair: {'; '.join(first)})")
        first = misses
    if first is not None:
        pytest.fail(f"{name}: {'; '.join(first)} (the other pair's run without the hog was busy)")
    pytest.skip(f"{name}: the machine was busy without the hog too (GD205: {busy_anyway[-1]}): not judged")
