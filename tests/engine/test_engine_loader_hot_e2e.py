"""End to end on the CPU: GD201's "hot functions of the fetch" are the loading's own calls (issue 38).

On pytorch/examples' mnist they were the model's forward (``torch.conv2d 47.0%, torch.dropout 14.8%,
torch.max_pool2d 11.2%; your code in it: main.py:20(forward) 86.7%``): cProfile keeps one total per
function and caller, and ``nn.Module.__call__`` runs torchvision's ``Normalize`` and the model's layers
alike, so shares spread from the fetch along caller edges reached the model. The DataLoader's calls are
now profiled apart (``loader.pstats``, ``collect.loaderprof``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.analysis.cprofile import entry_name
from gpudoctor.analysis.loader import loader_profile
from gpudoctor.parse.rundir import read_pstats

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "mnist_like.py"
MODEL_OPS = ("conv2d", "dropout", "max_pool2d", "linear", "log_softmax", "relu", "nll_loss")


def _lines(script: Path) -> dict[str, int]:
    return {line.split("# SITE:", 1)[1].strip(): i for i, line in enumerate(script.read_text().splitlines(), 1)
            if "# SITE:" in line}


def _profile(tmp_path: Path, aug: int) -> tuple[Path, dict[str, Any]]:
    shutil.copy(SCRIPT, tmp_path / "train.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AUG": str(aug)}
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "profile", "--out", str(tmp_path / "runs"), "--steps", "40",
         "-o", str(tmp_path / "report.json"), "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env, preexec_fn=_two_cores,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    return run_dir, json.loads((tmp_path / "report.json").read_text())


def _two_cores() -> None:
    """At most two cores for the run (its settings read the affinity): one usable for loading, on any machine."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores[:2])


def _model_code(name: str, lines: dict[str, int]) -> bool:
    return f"train.py:{lines['model_forward']}(" in name or any(op in name for op in MODEL_OPS)


def test_the_fetch_holds_the_loading_and_none_of_the_model(tmp_path: Path) -> None:
    """The model's step dominates (as on mnist): every function the parse puts inside the fetch is the
    loading's (to_tensor, Normalize's forward, numpy, collate), none the model's."""
    run_dir, _report = _profile(tmp_path, aug=0)
    assert (run_dir / "loader.pstats").is_file()  # on every Python (3.12: the profiler slot, issue 35)
    p = loader_profile(read_pstats(run_dir, []), top=100)
    assert p is not None and p.fetch_s > 0
    lines = _lines(tmp_path / "train.py")
    names = [entry_name(e) for e in (*p.hot, *p.own)]
    assert not [n for n in names if _model_code(n, lines)], names
    assert f"train.py:{lines['normalize']}(forward)" in names and any("to_tensor" in n for n in names), names
    # the two files add up to the process's profile: the model's calls are there, outside the fetch
    rows = read_pstats(run_dir, [], top=400)
    conv = [e for e in rows if "conv2d" in e.function]
    assert conv and all(e.loader_cumtime_s == 0.0 for e in conv)


def test_gd201_names_the_loadings_hot_code(tmp_path: Path) -> None:
    """A loading the usable cores cannot hide: the finding's "make each batch cheaper" names the loading's
    code (the augmentation), not the model's."""
    _run_dir, report = _profile(tmp_path, aug=100_000)  # ~3x the model's step per batch, in Python
    (f,) = [f for f in report["findings"] if f["code"] == "GD201"]
    text = f["fix"]["instruction"]
    assert "cannot hide this load" in text, text
    lines = _lines(tmp_path / "train.py")
    hot = text.split("the loading's hot functions", 1)[1]
    assert "jitter" in hot and "__getitem__" in hot, hot
    assert not _model_code(hot.replace("torch.from_numpy", ""), lines), hot
