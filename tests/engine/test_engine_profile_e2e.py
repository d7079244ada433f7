"""End to end on the CPU: `gpudoctor profile` of a script with a slow Dataset and num_workers=0
ends with GD201 as its top finding, pointing at the DataLoader's line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset


    class SlowDataset(Dataset):
        def __len__(self):
            return 4096

        def __getitem__(self, i):
            time.sleep(0.002)  # a slow read: 64 ms per batch of 32
            return torch.randn(16), torch.tensor(i % 2)


    model = nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(SlowDataset(), batch_size=32, num_workers=0)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    """
)
DATALOADER_LINE = 1 + SCRIPT.splitlines().index(
    "loader = DataLoader(SlowDataset(), batch_size=32, num_workers=0)"
)


@pytest.mark.slow
def test_profile_slow_dataset_gives_gd201_first(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "profile", "--out", str(out), "--steps", "14",
         "--skip-first", "2", "--wait", "0", "--warmup", "1", "--active", "3", "--repeat", "1",
         "--format", "json", str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    report = json.loads((run_dir / "report.json").read_text())
    top = report["findings"][0]
    assert top["code"] == "GD201", [f["code"] for f in report["findings"]]
    assert top["location"]["line"] == DATALOADER_LINE
    assert top["location"]["file"].endswith("train.py")
    assert "num_workers=" in top["fix"]["instruction"]
    techniques = {i["technique"] for i in report["checklist"] if i["technique"]}
    assert techniques == set(range(1, 14))
