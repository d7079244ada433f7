"""gpudoctor on a machine without PyTorch: ``profile`` says how to install it; the rest works.

DESIGN: only ``gpudoctor/collect/`` imports torch, so a saved run or a colleague's trace
can be analysed anywhere. The run analysed here was recorded with torch (by ``profile``),
then every other command runs with ``import torch`` failing as on a machine without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from installlib import ROOT, WINDOW, blocker, env, gd, write_train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory) -> Path:
    folder = blocker(tmp_path_factory.mktemp("no_torch"))
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env(folder), capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr  # the blocker works
    return folder


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A run directory recorded with torch (the machine that trained)."""
    work = tmp_path_factory.mktemp("recorded")
    write_train(work)
    res = gd("profile", "--out", "runs", "--steps", "12", *WINDOW, "--no-report", "train.py", cwd=work,
             extra_env={"STEPS": "12"})
    assert res.returncode == 0, res.stderr
    (run,) = (work / "runs").iterdir()
    assert list(run.glob("*.pt.trace.json.gz")), "the run recorded no trace"
    return run


def test_profile_without_torch_is_one_line_saying_how_to_install_it(tmp_path, no_torch) -> None:
    write_train(tmp_path)
    res = gd("profile", "--out", "runs", "train.py", cwd=tmp_path, blocked=no_torch)
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudoctor: error: PyTorch is not installed"), res.stderr
    assert "pip install torch" in lines[0] and "https://pytorch.org/get-started" in lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert not (tmp_path / "runs").exists()  # nothing created, nothing run


def test_verify_without_torch_says_the_same(recorded, no_torch, tmp_path) -> None:
    res = gd("verify", recorded, "--verify-trials", "1", "--verify-steps", "10", cwd=tmp_path, blocked=no_torch)
    assert res.returncode == 2
    assert "PyTorch is not installed" in res.stderr and "Traceback" not in res.stderr
    assert not (recorded / "verify").exists()


@pytest.mark.parametrize("args", [(), ("--help",), ("--version",), ("rules",), ("explain", "GD201"),
                                  ("profile", "--help"), ("view", "--help")])
def test_help_and_the_catalogue_need_no_torch(args, no_torch, tmp_path) -> None:
    res = gd(*args, cwd=tmp_path, blocked=no_torch)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() and res.stderr == ""


def test_check_needs_no_torch(no_torch, tmp_path) -> None:
    script = write_train(tmp_path)
    res = gd("check", script, "--format", "json", cwd=tmp_path, blocked=no_torch)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kind"] == "check"


def test_analyze_report_and_compare_of_a_recorded_run_need_no_torch(recorded, no_torch, tmp_path) -> None:
    res = gd("analyze", recorded, "--format", "json", "-j", "2", cwd=tmp_path, blocked=no_torch)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kind"] == "analyze"
    trace = next(recorded.glob("*.pt.trace.json.gz"))
    for args in (("analyze", trace), ("report", recorded, "-o", tmp_path / "review.md"),
                 ("report", recorded, "--format", "html", "-o", tmp_path / "r.html"),
                 ("report", recorded, "--format", "sarif"), ("compare", recorded, recorded, "--format", "json")):
        res = gd(*args, cwd=tmp_path, blocked=no_torch)
        assert res.returncode == 0, (args, res.stderr)
        assert "Traceback" not in res.stderr and "torch" not in res.stderr.lower(), (args, res.stderr)
    assert (tmp_path / "review.md").read_text(encoding="utf-8").strip()
    assert json.loads(gd("compare", recorded, recorded, "--format", "json", cwd=tmp_path,
                         blocked=no_torch).stdout)["kind"] == "compare"


def test_no_module_outside_collect_imports_torch_at_the_top() -> None:
    """The static half of the promise: torch appears in import statements under collect/ only."""
    import ast

    offenders = []
    for path in sorted((ROOT / "gpudoctor").rglob("*.py")):
        if "collect" in path.relative_to(ROOT / "gpudoctor").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}" for m in mods if m.split(".")[0] == "torch"]
    assert offenders == []
