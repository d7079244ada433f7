"""`gpudoctor profile` refuses bad input with one line and exit 2, and leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys

import pytest
from collect_testlib import env, run_profile

from gpudoctor.collect.options import ProfileOptions, validate
from gpudoctor.errors import UsageError


def _refused(tmp_path, *args: str) -> str:
    out = tmp_path / "runs"
    proc = run_profile("--no-report", "--out", str(out), *args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudoctor: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())
    return lines[0]


def test_missing_script(tmp_path):
    assert "no such file" in _refused(tmp_path, "nope.py")


def test_a_directory(tmp_path):
    (tmp_path / "proj").mkdir()
    assert "is a directory" in _refused(tmp_path, "proj")


def test_a_file_that_is_not_python(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    assert "not a Python script" in _refused(tmp_path, "data.csv")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02torch")
    assert "not a Python script" in _refused(tmp_path, "blob.bin")


def test_unknown_option(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    msg = _refused(tmp_path, "--bogus", "train.py")
    assert "--bogus" in msg


def test_unknown_module(tmp_path):
    assert "no module named" in _refused(tmp_path, "-m", "surely_not_a_module_xyz.train")


def test_bad_distributed_options_are_refused(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert "--rdzv-endpoint HOST:PORT" in _refused(tmp_path, "--nproc-per-node", "2", "--nnodes", "2", "train.py")
    assert "go with --nproc-per-node" in _refused(tmp_path, "--master-port", "29500", "train.py")


def test_validate_accepts_python_without_suffix_and_modules(tmp_path):
    script = tmp_path / "train"
    script.write_text("#!/usr/bin/env python\nprint('hi')\n")
    t = validate(ProfileOptions(script="train", args=("--x",)), cwd=str(tmp_path))
    assert t.script_path == str(script) and t.argv == ("train", "--x")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "run.py").write_text("print('hi')\n")
    m = validate(ProfileOptions(module="pkg.run", args=("a",)), cwd=str(tmp_path))
    assert m.module_origin == str(tmp_path / "pkg" / "run.py") and m.argv == (m.module_origin, "a")
    with pytest.raises(UsageError):
        validate(ProfileOptions(script="train", module="pkg.run"), cwd=str(tmp_path))
    with pytest.raises(UsageError):
        validate(ProfileOptions(), cwd=str(tmp_path))


def test_help_shows_the_schedule_options():
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "profile", "--help"], env=env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for opt in ("--skip-first", "--wait", "--warmup", "--active", "--repeat", "--steps", "--no-report"):
        assert opt in text
    defaults = ProfileOptions()
    assert f"--skip-first INTEGER RANGE Steps run before the first profiled window (it starts right after). [default: {defaults.skip_first}" in text
    assert f"[default: {defaults.wait}" in text and f"[default: {defaults.active}" in text


def test_the_parent_never_imports_torch():
    code = "import sys, gpudoctor.cli, gpudoctor.collect; import gpudoctor.collect.runner; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
