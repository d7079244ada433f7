"""Helpers of the install suite: the real CLI in a subprocess, with or without torch importable.

``blocker(folder)`` writes a ``sitecustomize.py`` that makes ``import torch`` (and any
``torch.*``) fail exactly as on a machine without PyTorch (``ModuleNotFoundError: No
module named 'torch'``), and ``importlib.util.find_spec("torch")`` with it; other
packages (tensorboard) can be blocked the same way. Put first on
``PYTHONPATH`` it applies to gpudoctor and to every process it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BLOCKER = '''
import sys

BLOCKED = {blocked!r}


class _NotInstalled:
    """A machine without these packages: every import of them fails as a missing module does."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''

# A small training loop: 10 ms steps, with a knob for how many.
TRAIN = '''
import os, time, torch
m = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for i in range(int(os.environ.get("STEPS", "40"))):
    opt.zero_grad(); m(torch.randn(8, 16)).sum().backward(); opt.step()
    time.sleep(0.01)
'''

# the profiler window of the suite: small, early
WINDOW = ("--skip-first", "2", "--warmup", "1", "--active", "3", "--repeat", "1")


def blocker(folder: Path, modules: tuple[str, ...] = ("torch",)) -> Path:
    """A folder to put first on PYTHONPATH: ``modules`` (top-level names) cannot be imported."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(BLOCKER.format(blocked=tuple(modules)), encoding="utf-8")
    return folder


def env(blocked: Path | None = None, **extra: str) -> dict[str, str]:
    """This checkout first on PYTHONPATH (and a blocker folder before it when given)."""
    e = os.environ.copy()
    paths = [str(blocked)] if blocked is not None else []
    paths.append(str(ROOT))
    if e.get("PYTHONPATH"):
        paths.append(e["PYTHONPATH"])
    e["PYTHONPATH"] = os.pathsep.join(paths)
    e.setdefault("OMP_NUM_THREADS", "1")
    for name in ("GPUDOCTOR_DEBUG", "NO_COLOR", "FORCE_COLOR"):
        e.pop(name, None)
    e.update(extra)
    return e


def gd_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "gpudoctor", *map(str, args)]


def gd(*args: object, cwd: Path, blocked: Path | None = None, timeout: float = 180,
       extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gd_cmd(*args), cwd=cwd, env=env(blocked, **(extra_env or {})), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def write_train(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.py"
    path.write_text(TRAIN, encoding="utf-8")
    return path
