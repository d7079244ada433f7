"""Whatever the script does, the run directory is readable and the manifest says how it ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import psutil
import pytest
from collect_testlib import (
    collected,
    copy_script,
    env,
    manifest,
    only_run_dir,
    profile_cmd,
    profiler_steps,
    run_profile,
    samples,
    steps,
    wait_for,
)

from gpudoctor.collect import ProfileOptions, profile_run

pytestmark = pytest.mark.slow

# a window that is recording when the signal arrives
OPEN_WINDOW = ("--skip-first", "2", "--warmup", "0", "--active", "1000", "--no-cprofile")


def test_a_raising_script_fails_with_its_own_traceback(tmp_path):
    script = copy_script("train_small.py", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", "train_small.py", "--", "--raise-at", "3", cwd=tmp_path)
    assert proc.returncode == 1
    err = proc.stderr
    assert "Traceback (most recent call last):" in err
    assert "ValueError: planted failure at step 3" in err
    assert 'File "' + str(script) + '"' in err and "in check_batch" in err
    tb = err[err.index("Traceback"): err.index("ValueError: planted")]
    assert "gpudoctor" not in tb and "runpy" not in tb  # the traceback reads as python's own
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["status"] == "failed" and m["exit_code"] == 1
    exc = m["exception"]
    assert exc["type"] == "ValueError" and exc["message"] == "planted failure at step 3"
    raise_line = next(i for i, line in enumerate(script.read_text().splitlines(), 1) if line.strip().startswith("raise ValueError("))
    assert exc["call_site"] == {"file": "train_small.py", "line": raise_line, "function": "check_batch"}
    assert len(steps(run_dir)) == 3
    assert (run_dir / "settings.json").is_file() and (run_dir / "samples.jsonl").is_file()


def test_a_syntax_error_is_reported_like_python(tmp_path):
    (tmp_path / "bad.py").write_text("import torch\nx = (1,\n")
    proc = run_profile("--no-report", "--out", "runs", "bad.py", cwd=tmp_path)
    assert proc.returncode == 1
    assert "SyntaxError" in proc.stderr and "gpudoctor/collect" not in proc.stderr
    m = manifest(only_run_dir(tmp_path / "runs"))
    assert m["status"] == "failed" and m["exception"]["type"] == "SyntaxError"
    assert m["exception"]["call_site"]["file"] == "bad.py"


def _start(tmp_path: Path, *script_args: str, workers: str = "0") -> subprocess.Popen[str]:
    copy_script("train_small.py", tmp_path)
    cmd = profile_cmd("--no-report", "--out", "runs", *OPEN_WINDOW, "train_small.py", "--",
                      "--epochs", "200", "--sleep", "0.02", "--marker", "started", "--workers", workers, *script_args)
    return subprocess.Popen(cmd, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _wait_steps(tmp_path: Path, n: int) -> None:
    def enough() -> bool:
        runs = tmp_path / "runs"
        if not runs.is_dir():
            return False
        dirs = list(runs.iterdir())
        return bool(dirs) and (dirs[0] / "steps.jsonl").is_file() and len((dirs[0] / "steps.jsonl").read_text().splitlines()) >= n

    wait_for(enough, timeout=90, what=f"{n} steps")


def test_ctrl_c_interrupts_flushes_the_trace_and_exits_130(tmp_path):
    proc = _start(tmp_path)
    try:
        _wait_steps(tmp_path, 8)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "KeyboardInterrupt" in err
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["status"] == "interrupted" and m["exit_code"] == 130
    n = len(steps(run_dir))
    assert n >= 8 and m["steps_seen"] == n
    (trace,) = m["traces"]
    recorded = profiler_steps(run_dir / trace)
    assert recorded[0] == 2 and recorded[-1] >= 7  # the open window was exported
    assert "gpudoctor: run interrupted" in err


def test_killed_child_still_leaves_a_manifest_and_samples(tmp_path):
    proc = _start(tmp_path, workers="1")
    try:
        _wait_steps(tmp_path, 6)
        parent = psutil.Process(proc.pid)
        wait_for(lambda: len(samples(only_run_dir(tmp_path / "runs"))) >= 3, timeout=30, what="samples")
        (child,) = [c for c in parent.children() if "gpudoctor.collect._child" in " ".join(c.cmdline())]
        child.send_signal(signal.SIGKILL)  # as the out-of-memory killer would
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 137, err
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["status"] == "killed" and m["signal"] == 9 and m["exit_code"] == 137
    assert m["status_detail"].startswith("killed by signal 9")
    rows = samples(run_dir)
    assert any(r["kind"] == "process" and r["pid"] == child.pid and r["role"] == "main" for r in rows)
    assert len(steps(run_dir)) >= 6 and m["steps_seen"] >= 6
    assert collected(m, "steps")["ok"] and not collected(m, "cuda")["ok"]
    assert m["ended_at"] and not any(p.name.startswith(".") for p in run_dir.iterdir())


def test_a_native_crash_leaves_the_python_stack_and_says_where(tmp_path):
    """A SIGSEGV in native code (a compiler, a driver, an extension; compiled_tiny_batch on the H200) is
    killed by the kernel before Python can report: faulthandler writes every thread's stack to crash.txt,
    and the manifest's detail names where the crashing thread was, in the library and in the script."""
    (tmp_path / "segv.py").write_text(
        "import ctypes, torch\n"
        "m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "def deep_native_crash():\n"
        "    ctypes.string_at(0)\n"
        "for i in range(20):\n"
        "    m(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "    if i == 12:\n"
        "        deep_native_crash()\n"
    )
    proc = run_profile("--no-report", "--out", "runs", "segv.py", cwd=tmp_path)
    assert proc.returncode == 139, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["status"] == "killed" and m["signal"] == 11
    crash = (run_dir / "crash.txt").read_text()
    assert "Segmentation fault" in crash and "deep_native_crash" in crash
    assert "crash.txt" in m["status_detail"] and "in string_at" in m["status_detail"]
    assert "segv.py:4 in deep_native_crash" in m["status_detail"]
    assert "crash.txt" in proc.stderr


def test_a_run_without_a_crash_leaves_no_crash_file(tmp_path):
    copy_script("train_small.py", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", "train_small.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (only_run_dir(tmp_path / "runs") / "crash.txt").exists()


# --------------------------------------------------------------------------- NVML refusals, in-process API


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def _tiny(tmp_path: Path) -> ProfileOptions:
    (tmp_path / "tiny.py").write_text(
        "import time, torch\n"
        "m = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(4):\n"
        "    opt.zero_grad(); m(torch.ones(2, 2)).sum().backward(); opt.step(); time.sleep(0.15)\n"
    )
    return ProfileOptions(script=str(tmp_path / "tiny.py"), out_dir=tmp_path / "runs", skip_first=1, active=2, summary=False)


def test_nvml_permission_denied_does_not_stop_the_run(tmp_path, monkeypatch):
    def refuse():
        raise _NVMLError(4)

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=refuse, nvmlShutdown=lambda: None))
    result = profile_run(_tiny(tmp_path))
    assert result.exit_code == 0
    m = result.manifest
    assert m.status.value == "completed" and m.steps_seen == 4
    assert not m.collected_ok("nvml") and "permission denied" in m.not_collected_reason("nvml")
    assert m.collected_ok("psutil") and m.collected_ok("torch.profiler")
    assert manifest(result.run_dir)["collected"] == [c.to_dict() for c in m.collected]


def test_nvml_samples_when_a_gpu_answers(tmp_path, monkeypatch):
    from test_collect_units import _fake_nvml

    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    result = profile_run(_tiny(tmp_path))
    m = result.manifest
    assert m.collected_ok("nvml") and m.versions["driver"] == "550.54"
    (dev,) = m.devices
    assert dev.name == "Fake GPU" and dev.compute_capability == "8.0"
    gpu = [r for r in samples(result.run_dir) if r["kind"] == "gpu"]
    assert len(gpu) >= 2
    assert gpu[0]["util_pct"] == 87.0 and gpu[0]["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert gpu[0]["power_w"] == 250.0 and gpu[0]["pcie_rx_kbps"] == 2000.0
    assert [g["t_ns"] for g in gpu] == sorted(g["t_ns"] for g in gpu)


def test_no_nvml_library_is_a_reason_not_a_failure(tmp_path, monkeypatch):
    def missing():
        raise _NVMLError(12)

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=missing, nvmlShutdown=lambda: None))
    result = profile_run(_tiny(tmp_path))
    assert result.exit_code == 0
    assert "no NVIDIA driver" in result.manifest.not_collected_reason("nvml")
    cuda = result.manifest.not_collected_reason("cuda")
    assert cuda  # this CPU machine: a CPU-only torch or no device, said in words
    assert result.manifest.devices == ()

