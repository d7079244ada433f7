"""End to end on the CPU: `gpudoctor profile` sizes GD201's workers for the load it measured (issue 24).

- a collate_fn that sleeps 20 ms per batch (a waiting load, no CPU) over a step of a few ms:
  more workers than the cores, whatever their number, with the expected gain of that count;
- a collate_fn that computes ~25 ms per batch in Python: at most the usable cores, and the finding
  names the hot function from the cProfile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

LOOP = textwrap.dedent(
    """
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def sleepy_collate(batch):
        time.sleep(0.02)  # a storage read: 20 ms per batch, no CPU
        xs, ys = zip(*batch)
        return torch.stack(xs), torch.stack(ys)


    def busy_transform(n):
        return sum(i * i for i in range(n))


    def busy_collate(batch):
        busy_transform(300_000)  # decoding in Python: CPU for the whole batch
        xs, ys = zip(*batch)
        return torch.stack(xs), torch.stack(ys)


    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8192, 64), torch.randint(0, 4, (8192,)))
    loader = DataLoader(data, batch_size=32, shuffle=True, collate_fn=COLLATE)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    """
)


def _profile(tmp_path: Path, collate: str) -> dict[str, Any]:
    script = tmp_path / "train.py"
    script.write_text(LOOP.replace("collate_fn=COLLATE", f"collate_fn={collate}"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "profile", "--out", str(tmp_path / "runs"), "--steps", "60",
         "--format", "json", str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    report = json.loads((run_dir / "report.json").read_text())
    (f,) = [f for f in report["findings"] if f["code"] == "GD201"]
    return f


def _metrics(f: dict[str, Any]) -> dict[str, Any]:
    return {m["name"]: m["value"] for m in f["evidence"]["metrics"]}


def test_a_sleeping_collate_gets_more_workers_than_the_cores(tmp_path: Path) -> None:
    f = _profile(tmp_path, "sleepy_collate")
    m = _metrics(f)
    cores = os.cpu_count() or 1
    assert m["load_kind"] == "waiting", f["evidence"]["notes"]
    # 20 ms of waiting per batch over a step of a few ms: at least 3 workers, more than the usable cores
    assert m["suggested_num_workers"] >= 3 and m["suggested_num_workers"] > cores - 1
    assert f"num_workers={m['suggested_num_workers']}" in f["fix"]["instruction"]
    assert any("time.sleep" in n for n in f["evidence"]["notes"])  # cProfile saw the wait inside the fetch
    g = f["gain"]
    assert 0.0 < g["expected_fraction"] <= 1.0 and g["expected_share_pct"] <= g["share_pct"]
    assert f"{m['suggested_num_workers']} workers (waiting load)" in g["expected_note"]


def test_a_computing_collate_is_capped_at_the_usable_cores_and_named(tmp_path: Path) -> None:
    f = _profile(tmp_path, "busy_collate")
    m = _metrics(f)
    cores = os.cpu_count() or 1
    assert m["load_kind"] == "computing", f["evidence"]["notes"]
    assert 1 <= m["suggested_num_workers"] <= max(1, cores - 1)
    g = f["gain"]
    assert 0.0 <= g["expected_fraction"] <= 1.0 and g["expected_share_pct"] <= g["share_pct"]
    # where the usable cores cannot hide the load (a small machine), the fix names the loading's hot code
    if m["per_batch_load_ns"] / max(1, cores - 1) > 1.5 * m["compute_per_step_ns"]:
        assert "cannot hide this load" in f["fix"]["instruction"]
        assert "busy_transform" in f["fix"]["instruction"] or "genexpr" in f["fix"]["instruction"]
