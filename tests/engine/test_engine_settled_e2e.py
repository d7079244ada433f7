"""End to end on the CPU: `gpudoctor profile --steps 40` of a loop that sleeps 150 ms in each of its first
20 steps and then settles (the sleep stops) takes its step time, account and findings from the settled
steps, and its report names the change (model/settle.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from gpudoctor.model.units import duration_text

SCRIPT = textwrap.dedent(
    """
    import time

    import torch

    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    for step in range(1000):
        if step < 20:
            time.sleep(0.15)  # a warm-up: slow steps that stop at step 20
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.005)
    """
)


@pytest.mark.slow
def test_a_loop_that_settles_at_step_20_is_diagnosed_from_the_settled_steps(tmp_path):
    script = tmp_path / "settles.py"
    script.write_text(SCRIPT)
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "profile", "--out", str(out), "--steps", "40", "--format", "json",
         str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    report = json.loads((run_dir / "report.json").read_text())
    stats = {s["key"]: s for s in report["summary"]}
    change = stats["step_time_change"]["value"]
    # the split falls where the sleep stops (the first step is a one-off of its own)
    assert change.startswith("steps 1–19 ran 1") and "the loop settled at step 20" in change, change
    assert "the figures are the settled part's" in change
    # slow steps take 150 ms or more; the settled ones a few ms (under 100 ms even on a loaded machine): the step
    # time (the mean) and its median are both of the settled steps
    assert stats["step_time"]["value"] < 100.0, stats["step_time"]
    assert stats["step_time_median"]["value"] < 100.0, stats["step_time_median"]
    account = report["account"]
    assert account["step_ns"] < 100_000_000
    assert any(n.startswith("step time changed: steps 1–19") for n in account["notes"])
    # the account's window is the timings-only one of steps 35-39, inside the settled part
    assert not any("before the loop settled" in n for n in account["notes"])
    # the stderr line of `gpudoctor profile` prints the same step time (the mean) and median as the report (one
    # definition, the settled part's)
    line = next(x for x in proc.stderr.splitlines() if " steps (" in x and "step time " in x)
    step, median = (duration_text(stats[k]["value"] * 1e6) for k in ("step_time", "step_time_median"))
    assert f"step time {step} (mean), median {median}," in line, line
