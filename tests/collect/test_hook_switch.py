"""``benchmarks/hook_loop.py --ab-hooks``, the judged hook-cost measure of ``benchmarks/overhead.py``:
under ``gpudoctor profile`` it finds gpudoctor's step hooks, switches them off and on in blocks,
and the tracker sees steps only while they are on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from collect_testlib import ROOT, only_run_dir, run_profile, steps

pytestmark = pytest.mark.slow

HOOK_LOOP = ROOT / "benchmarks" / "hook_loop.py"


@pytest.mark.parametrize(("shape", "switched"), [
    ("optimizer", {"torch.autograd.backward", "_BaseDataLoaderIter.__next__", "autocast.__init__", "SGD.step",
                   "MLP.forward"}),
    ("sequential", {"torch.autograd.backward", "_BaseDataLoaderIter.__next__", "autocast.__init__", "SGD.step",
                    "Sequential instance _forward_pre_hooks", "Sequential instance _forward_hooks"}),
])
def test_hooks_are_switched_off_and_on_in_blocks(tmp_path, shape, switched):
    out = tmp_path / "times.json"
    proc = run_profile("--no-report", "--out", "runs", "--skip-first", "1000000000", "--no-cprofile",
                       "--time-window", "off", str(HOOK_LOOP), "--", "--shape", shape, "--steps", "300",
                       "--ab-hooks", "--ab-warmup", "100", "--ab-block", "50", "--step-times", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(out.read_text())
    assert set(got["switched"]) == switched
    # warm-up, then blocks of 50 (on, off, on, off): the first step of each straddles the switch
    block = [-1] + [1] * 49, [-1] + [0] * 49
    assert got["on"] == [-1] * 100 + block[0] + block[1] + block[0] + block[1]
    rows = steps(only_run_dir(tmp_path / "runs"))
    # the optimizer's hook ends no step while it is off: each off block and the step after it are one step
    assert len(rows) == 300 - 2 * 50 and {r["marker"] for r in rows} == {"optimizer"}


def test_without_gpudoctor_nothing_is_switched(tmp_path):
    """torch's own optimizer.step wrapper carries __wrapped__ too: only gpudoctor's count."""
    out = tmp_path / "times.json"
    subprocess.run([sys.executable, str(HOOK_LOOP), "--shape", "optimizer", "--steps", "160", "--ab-hooks",
                    "--ab-warmup", "100", "--ab-block", "20", "--step-times", str(out)], check=True, timeout=120)
    assert json.loads(out.read_text())["switched"] == []
