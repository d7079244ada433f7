"""README's exit codes hold whatever stdout is: a reader that went away, closed, unwritable places."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from faultlib import (
    WINDOW,
    close_stderr,
    close_stdout,
    env,
    gd,
    gd_cmd,
    gd_lines,
    gd_reader_gone,
    only_run_dir,
    read_only,
    write_train,
)

pytestmark = pytest.mark.slow

# `check` finds two warnings and an info in this script: exit 1 under --fail-on info
FINDINGS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.randn(100, 4))
model = torch.nn.Linear(4, 4).cuda()
for (x,) in DataLoader(ds, batch_size=8):
    loss = model(x.cuda()).sum()
    loss.backward()
    print(loss.item())
"""

NOISE = ("Traceback", "Exception ignored", "BrokenPipeError", "internal error")


def _quiet(stderr: str) -> None:
    for word in NOISE:
        assert word not in stderr, stderr


@pytest.fixture
def findings_script(tmp_path: Path) -> Path:
    p = tmp_path / "loop.py"
    p.write_text(FINDINGS)
    return p


# --------------------------------------------------------------------------- a reader that went away (| true)


def test_analyze_into_a_closed_pipe_exits_0(run_copy: Path, tmp_path: Path) -> None:
    rc, err = gd_reader_gone("analyze", run_copy, cwd=tmp_path)
    assert rc == 0, err
    _quiet(err)


def test_check_fail_on_into_a_closed_pipe_still_exits_1(findings_script: Path, tmp_path: Path) -> None:
    assert gd("check", findings_script, "--fail-on", "info", cwd=tmp_path).returncode == 1
    rc, err = gd_reader_gone("check", findings_script, "--fail-on", "info", cwd=tmp_path)
    assert rc == 1, err
    _quiet(err)
    rc, err = gd_reader_gone("check", findings_script, cwd=tmp_path)
    assert rc == 0, err


def test_profile_into_a_closed_pipe_exits_with_the_scripts_code(tmp_path: Path) -> None:
    write_train(tmp_path)
    rc, err = gd_reader_gone("profile", "--out", "runs", *WINDOW, "train.py", cwd=tmp_path,
                             extra_env={"EXIT_CODE": "7", "STEPS": "8"})
    assert rc == 7, err
    _quiet(err)
    assert "exit code 7" in err


def test_rules_into_a_closed_pipe_exits_0(tmp_path: Path) -> None:
    rc, err = gd_reader_gone("rules", cwd=tmp_path)
    assert rc == 0, err
    _quiet(err)


# --------------------------------------------------------------------------- stdout closed (>&-)


def test_closed_stdout_skips_the_report_with_one_line(run_copy: Path, findings_script: Path, tmp_path: Path) -> None:
    done = gd("analyze", run_copy, cwd=tmp_path, preexec=close_stdout)
    assert done.returncode == 0, done.stderr
    _quiet(done.stderr)
    lines = [ln for ln in gd_lines(done.stderr) if "stdout" in ln]
    assert len(lines) == 1 and "not printed" in lines[0], done.stderr
    done = gd("check", findings_script, "--fail-on", "warning", cwd=tmp_path, preexec=close_stdout)
    assert done.returncode == 1, done.stderr
    _quiet(done.stderr)


def test_closed_stdout_leaves_the_scripts_stdout_closed_too(tmp_path: Path) -> None:
    """gpudoctor's own pipes must not take fd 1: the script sees a closed stdout, as under python."""
    (tmp_path / "fd1.py").write_text(
        "import os, sys, torch\n"
        "m = torch.nn.Linear(2, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(4):\n"
        "    opt.zero_grad(); m(torch.ones(1, 2)).sum().backward(); opt.step()\n"
        "assert sys.stdout is None, sys.stdout\n"
        "try:\n"
        "    os.write(1, b'written to fd 1\\n')  # what a subprocess of the script would do\n"
        "except OSError:\n"
        "    pass\n"
    )
    done = gd("profile", "--out", "runs", *WINDOW, "--no-report", "fd1.py", cwd=tmp_path, preexec=close_stdout)
    assert done.returncode == 0, done.stderr
    _quiet(done.stderr)
    run = only_run_dir(tmp_path / "runs")
    for p in run.iterdir():
        assert b"written to fd 1" not in p.read_bytes(), p.name
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "completed", m["status_detail"]


def test_stdout_on_a_full_device_keeps_the_exit_code(run_copy: Path, findings_script: Path, tmp_path: Path) -> None:
    full = Path("/dev/full")
    if not full.exists():
        pytest.skip("no /dev/full here")
    with full.open("w") as sink:
        done = subprocess.run(gd_cmd("analyze", run_copy), cwd=tmp_path, env=env(), stdout=sink, stderr=subprocess.PIPE,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "No space left on device" in done.stderr
        _quiet(done.stderr)
        done = subprocess.run(gd_cmd("check", findings_script, "--fail-on", "info"), cwd=tmp_path, env=env(),
                              stdout=sink, stderr=subprocess.PIPE, text=True, timeout=120)
        assert done.returncode == 1, done.stderr


def test_closed_stdout_with_o_writes_the_file(run_copy: Path, tmp_path: Path) -> None:
    done = gd("analyze", run_copy, "-o", tmp_path / "r.md", cwd=tmp_path, preexec=close_stdout)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.md").read_text().startswith("#")


def test_closed_stderr_keeps_the_error_exit_code(tmp_path: Path) -> None:
    done = gd("analyze", tmp_path / "missing", cwd=tmp_path, preexec=close_stderr)
    assert done.returncode == 2


# --------------------------------------------------------------------------- -o where nothing can be written


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_o_in_a_missing_folder_is_a_usage_error(command: str, run_copy: Path, tmp_path: Path) -> None:
    target = tmp_path / "nope" / "r.md"
    done = gd(command, run_copy, "-o", target, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = gd_lines(done.stderr)
    assert str(target) in line and "No such file or directory" in line, line
    _quiet(done.stderr)


def test_check_o_on_a_read_only_folder_is_a_usage_error(findings_script: Path, tmp_path: Path) -> None:
    out = tmp_path / "ro"
    out.mkdir()
    with read_only(out):
        done = gd("check", findings_script, "--fail-on", "info", "-o", out / "r.sarif", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = gd_lines(done.stderr)
    assert "r.sarif" in line and ("Read-only file system" in line or "Permission denied" in line), line


def test_compare_o_in_a_missing_folder_is_a_usage_error(run_copy: Path, tmp_path: Path) -> None:
    done = gd("compare", run_copy, run_copy, "-o", tmp_path / "nope" / "c.md", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "No such file or directory" in done.stderr
    _quiet(done.stderr)


def test_profile_o_unwritable_stops_before_running_the_script(tmp_path: Path) -> None:
    write_train(tmp_path)
    done = gd("profile", "--out", "runs", *WINDOW, "-o", tmp_path / "nope" / "r.md", "train.py", cwd=tmp_path,
              extra_env={"MARK": str(tmp_path / "ran")})
    assert done.returncode == 2, done.stderr
    assert "No such file or directory" in done.stderr
    assert not (tmp_path / "ran").exists()  # the script never ran: nothing spent for a report that cannot land
    _quiet(done.stderr)


# --------------------------------------------------------------------------- a read-only run directory


def test_analyze_a_read_only_run_directory_prints_the_report(run_copy: Path, tmp_path: Path) -> None:
    (run_copy / "report.json").unlink()
    with read_only(run_copy):
        done = gd("analyze", run_copy, cwd=tmp_path)
        assert not (run_copy / "report.json").exists()
    assert done.returncode == 0, done.stderr
    assert "gpudoctor" in done.stdout and "Findings" in done.stdout
    notes = [ln for ln in gd_lines(done.stderr) if "report.json" in ln]
    assert len(notes) == 1, done.stderr
    _quiet(done.stderr)


def test_profile_out_on_a_read_only_folder_is_a_usage_error(tmp_path: Path) -> None:
    write_train(tmp_path)
    out = tmp_path / "ro"
    out.mkdir()
    with read_only(out):
        done = gd("profile", "--out", out, "train.py", cwd=tmp_path, extra_env={"MARK": str(tmp_path / "ran")})
    assert done.returncode == 2, done.stderr
    assert not (tmp_path / "ran").exists()
    _quiet(done.stderr)


def test_profile_report_into_a_closed_pipe_keeps_run_directory(tmp_path: Path) -> None:
    write_train(tmp_path)
    rc, err = gd_reader_gone("profile", "--out", "runs", *WINDOW, "train.py", cwd=tmp_path, extra_env={"STEPS": "8"})
    assert rc == 0, err
    run = only_run_dir(tmp_path / "runs")
    assert (run / "report.json").is_file() and (run / "manifest.json").is_file()
