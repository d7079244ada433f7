"""Signals: to gpudoctor alone, during start-up, a parent killed outright, `view` stopped or killed."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from faultlib import (
    WINDOW,
    env,
    gd,
    gd_cmd,
    gd_lines,
    manifest,
    only_run_dir,
    wait_for,
    write_train,
)

pytestmark = pytest.mark.slow

LONG = {"STEPS": "400", "SLEEP": "0.03"}  # 12 s or more: the signal always lands mid-run


def _start(tmp_path: Path, *args: str, **extra: str) -> subprocess.Popen[str]:
    write_train(tmp_path)
    return subprocess.Popen(
        gd_cmd("profile", "--out", "runs", *WINDOW, "--no-report", *args, "train.py"),
        cwd=tmp_path, env=env(MARK=str(tmp_path / "marks"), **{**LONG, **extra}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True,  # its own process group: what reaches it is only what the test sends
    )


def _marks(tmp_path: Path) -> int:
    try:
        return len((tmp_path / "marks").read_text().splitlines())
    except OSError:
        return 0


def _child(proc: subprocess.Popen[str]) -> psutil.Process:
    def find() -> psutil.Process | None:
        assert proc.poll() is None, f"gpudoctor ended first: {proc.communicate()}"
        try:
            for c in psutil.Process(proc.pid).children():
                if "gpudoctor.collect._child" in " ".join(c.cmdline()):
                    return c
        except psutil.Error:  # a process that has just ended
            return None
        return None

    return wait_for(find, timeout=60, what="the training process")


def _finish(proc: subprocess.Popen[str], timeout: float = 90) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize(("sig", "code", "status"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "killed")])
def test_a_signal_to_gpudoctor_alone_reaches_the_script(sig: int, code: int, status: str, tmp_path: Path) -> None:
    proc = _start(tmp_path)
    wait_for(lambda: _marks(tmp_path) >= 5, timeout=90, what="5 steps")
    os.kill(proc.pid, sig)  # to gpudoctor's process only, not its group
    out, err = _finish(proc)
    assert proc.returncode == code, err
    ran = _marks(tmp_path)
    assert ran < 400, "the script ran to its end: the signal never reached it"
    m = manifest(only_run_dir(tmp_path / "runs"))
    assert m["status"] == status and m["exit_code"] == code, m["status_detail"]
    assert m["signal"] == sig
    assert "Traceback" not in "\n".join(gd_lines(err))


def test_the_scripts_handler_decides_and_the_manifest_says_so(tmp_path: Path) -> None:
    """A script that catches Ctrl-C and ends cleanly: interrupted, with its own exit code."""
    script = tmp_path / "catch.py"
    script.write_text(
        "import os, time, torch\n"
        "m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "try:\n"
        "    for i in range(400):\n"
        "        opt.zero_grad(); m(torch.ones(2, 4)).sum().backward(); opt.step(); time.sleep(0.03)\n"
        "        open(os.environ['MARK'], 'a').write('x\\n')\n"
        "except KeyboardInterrupt:\n"
        "    print('saved a checkpoint')\n"
    )
    proc = subprocess.Popen(gd_cmd("profile", "--out", "runs", *WINDOW, "--no-report", "catch.py"), cwd=tmp_path,
                            env=env(MARK=str(tmp_path / "marks")), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    wait_for(lambda: _marks(tmp_path) >= 5, timeout=90, what="5 steps")
    os.kill(proc.pid, signal.SIGINT)
    out, err = _finish(proc)
    assert proc.returncode == 0, err
    assert "saved a checkpoint" in out
    m = manifest(only_run_dir(tmp_path / "runs"))
    assert m["status"] == "interrupted" and m["exit_code"] == 0
    assert _marks(tmp_path) < 400


def test_ctrl_c_to_the_group_is_delivered_once(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches gpudoctor and the script together: the script must not get it twice."""
    script = tmp_path / "count.py"
    script.write_text(
        "import os, signal, time, torch\n"
        "seen = []\n"
        "signal.signal(signal.SIGINT, lambda s, f: seen.append(s))\n"
        "m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(400):\n"
        "    opt.zero_grad(); m(torch.ones(2, 4)).sum().backward(); opt.step(); time.sleep(0.03)\n"
        "    open(os.environ['MARK'], 'a').write('x\\n')\n"
        "    if seen and i > int(os.environ.get('AFTER', '0')):\n"
        "        break\n"
        "    if seen and not os.environ.get('AFTER'):\n"
        "        os.environ['AFTER'] = str(i + 40)\n"
        "print('sigints', len(seen))\n"
    )
    proc = subprocess.Popen(gd_cmd("profile", "--out", "runs", *WINDOW, "--no-report", "count.py"), cwd=tmp_path,
                            env=env(MARK=str(tmp_path / "marks")), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    wait_for(lambda: _marks(tmp_path) >= 5, timeout=90, what="5 steps")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, err = _finish(proc)
    assert "sigints 1" in out, (out, err)
    assert proc.returncode == 0, err


def _importing_torch(child: psutil.Process) -> bool:
    try:
        return any("libtorch" in m.path for m in child.memory_maps())
    except psutil.Error:
        return False


@pytest.mark.parametrize("moment", ["run directory created", "training process started", "torch being imported"])
def test_ctrl_c_during_start_up_exits_130_without_a_traceback(moment: str, tmp_path: Path) -> None:
    """Ctrl-C once gpudoctor runs (before, Python's own start-up decides): while it prepares the run,
    or while the training process starts (Python's start-up, then torch's import, a second or more)."""
    write_train(tmp_path)
    proc = subprocess.Popen(gd_cmd("profile", "--out", "runs", *WINDOW, "train.py"), cwd=tmp_path,
                            env=env(MARK=str(tmp_path / "marks")), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    if moment == "run directory created":
        wait_for(lambda: (tmp_path / "runs").is_dir() and any((tmp_path / "runs").iterdir()), timeout=60,
                 what="the run directory")
    elif moment == "training process started":
        _child(proc)  # the training process exists: Python starting, or gpudoctor's set-up
    else:
        child = _child(proc)
        wait_for(lambda: _importing_torch(child), timeout=60, what="torch's libraries loading")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = _finish(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert _marks(tmp_path) == 0
    run = only_run_dir(tmp_path / "runs")
    wait_for(lambda: (run / "manifest.json").is_file(), timeout=5, what="the manifest")
    m = manifest(run)
    assert m["status"] == "interrupted" and m["exit_code"] == 130, m


def test_a_run_whose_parent_died_is_reported_from_the_childs_state(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    child = _child(proc)
    wait_for(lambda: _marks(tmp_path) >= 5, timeout=90, what="5 steps")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    child.wait(timeout=60)  # the training process follows its parent (and writes what it has)
    run = only_run_dir(tmp_path / "runs")
    assert manifest(run)["status"] == "running"  # nobody finished it
    assert (run / ".child-state.json").is_file()
    done = gd("analyze", run, "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    m = report["run"]["manifest"]
    assert m["status"] == "killed", m
    assert "parent lost" in m["status_detail"], m["status_detail"]
    assert m["steps_seen"] >= 5
    text = gd("analyze", run, cwd=tmp_path).stdout
    assert "killed (parent lost" in text


# --------------------------------------------------------------------------- view


def _view(tmp_path: Path, run: Path) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    proc = subprocess.Popen(gd_cmd("view", run), cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr], daemon=True).start()
    deadline = time.monotonic() + 150
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert proc.poll() is None, f"view ended early: {seen}"
            continue
        seen.append(line)
        if "Press Ctrl-C to stop" in line:
            return proc, lines
    raise AssertionError(f"view did not serve: {seen}")


def _tensorboard(view: subprocess.Popen[str]) -> tuple[psutil.Process, Path]:
    for p in psutil.Process(view.pid).children(recursive=True):
        cmd = p.cmdline()
        if "tensorboard.main" in " ".join(cmd):
            logdir = Path(cmd[cmd.index("--logdir") + 1])
            return p, logdir.parent
    raise AssertionError("no tensorboard process")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_view_cleans_up_on_sigterm_and_sighup(sig: int, profiled_run: Path, tmp_path: Path) -> None:
    proc, _ = _view(tmp_path, profiled_run)
    tb, tmp = _tensorboard(proc)
    assert tmp.is_dir()
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    assert proc.returncode == 0
    wait_for(lambda: not tb.is_running() or tb.status() == psutil.STATUS_ZOMBIE, timeout=30, what="TensorBoard to stop")
    assert not tmp.exists()


def test_a_killed_view_takes_tensorboard_along_and_the_next_view_reclaims_its_folder(profiled_run: Path, tmp_path: Path) -> None:
    proc, _ = _view(tmp_path, profiled_run)
    tb, tmp = _tensorboard(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    wait_for(lambda: not tb.is_running() or tb.status() == psutil.STATUS_ZOMBIE, timeout=60, what="TensorBoard to stop")
    assert tmp.is_dir()  # nothing could remove it: a SIGKILL runs no handler
    proc2, _ = _view(tmp_path, profiled_run)
    try:
        assert not tmp.exists(), "the next view left the stale folder"
    finally:
        os.kill(proc2.pid, signal.SIGTERM)
        proc2.wait(timeout=60)
