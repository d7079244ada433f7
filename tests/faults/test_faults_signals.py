"""Signals: to gpudoctor alone, at every moment of start-up, a parent killed outright, `view` stopped or killed.

The start-up moments are pinned with gpudoctor's start-up hook (``GPUDOCTOR_STARTUP_HOOK``,
``faultlib.start_paused``): gpudoctor writes a marker at the named point and waits there
for the signal, so each case lands exactly where it says, on a loaded machine too.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from faultlib import (
    ROOT,
    WINDOW,
    env,
    gd,
    gd_cmd,
    gd_lines,
    manifest,
    only_run_dir,
    start_paused,
    wait_for,
    wait_paused,
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


SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
STOP_LINE = {signal.SIGINT: "gpudoctor: interrupted", signal.SIGTERM: "gpudoctor: stopped by SIGTERM",
             signal.SIGHUP: "gpudoctor: stopped by SIGHUP"}
OURS = re.compile(r"gpudoctor[/\\](collect|cli|signals|__main__)")  # a frame of gpudoctor's in a traceback


def _send(proc: subprocess.Popen[str], sig: int, to: str) -> None:
    if to == "group":  # a terminal's Ctrl-C or hang-up: gpudoctor and the training process together
        os.killpg(proc.pid, sig)
    else:  # kill PID, a scheduler, a container runtime: gpudoctor's process only
        os.kill(proc.pid, sig)


@pytest.mark.parametrize("to", ["gpudoctor", "group"])
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "killed"),
                                             (signal.SIGHUP, "killed")])
def test_a_signal_while_the_script_runs_reaches_it(sig: int, status: str, to: str, tmp_path: Path) -> None:
    proc = _start(tmp_path)
    wait_for(lambda: _marks(tmp_path) >= 5, timeout=90, what="5 steps")
    _send(proc, sig, to)
    out, err = _finish(proc)
    code = 128 + sig
    assert proc.returncode == code, err
    ran = _marks(tmp_path)
    assert ran < 400, "the script ran to its end: the signal never reached it"
    m = manifest(only_run_dir(tmp_path / "runs"))
    assert m["status"] == status and m["exit_code"] == code, m["status_detail"]
    assert m["signal"] == sig
    assert not OURS.search(err), err  # the script's own KeyboardInterrupt is Python's, without gpudoctor's frames
    if to == "gpudoctor":
        assert f"passing {signal.Signals(sig).name} on to the script" in err
    else:  # it reached the script directly: passing it on again would deliver it twice
        assert "passing" not in err


# --------------------------------------------------------------------------- start-up, moment by moment


@pytest.mark.parametrize("point", ["entry", "command", "parsed"])
@pytest.mark.parametrize("sig", SIGNALS)
def test_a_signal_before_the_run_directory_exists_is_one_line(sig: int, point: str, tmp_path: Path) -> None:
    """Before click is imported, once the command is chosen, once profile's options are checked."""
    write_train(tmp_path)
    proc = start_paused(point, "profile", "--out", "runs", *WINDOW, "train.py", cwd=tmp_path, hooks=tmp_path / "hooks")
    wait_paused(proc, tmp_path / "hooks", point)
    os.kill(proc.pid, sig)
    out, err = _finish(proc)
    assert proc.returncode == 128 + sig, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [STOP_LINE[sig]], err
    assert out == ""
    assert not (tmp_path / "runs").exists()


# (point(s) the hook pauses at, the one the signal is sent at): at "spawned" the training process
# also waits before its script ("child-script"), so a signal passed on half a second later still
# finds it in start-up whatever the machine's speed
# (before the training process exists, the group is gpudoctor alone)
START_UP = [("run-dir", "run-dir", "gpudoctor")] + [
    (points, point, to)
    for points, point in [("spawned,child-script", "spawned"), ("child-start", "child-start"),
                          ("child-setup", "child-setup"), ("child-script", "child-script")]
    for to in ("gpudoctor", "group")
]


@pytest.mark.parametrize(("points", "point", "to"), START_UP, ids=[f"{p}-to-{t}" for _, p, t in START_UP])
@pytest.mark.parametrize("sig", SIGNALS)
def test_a_signal_during_start_up_leaves_a_manifest_that_says_so(sig: int, points: str, point: str, to: str,
                                                                  tmp_path: Path) -> None:
    """Once the run directory exists: before the training process starts, while it starts (Python,
    then torch's import and the instruments, where the signal is held back), just before the script."""
    write_train(tmp_path)
    proc = start_paused(points, "profile", "--out", "runs", *WINDOW, "train.py", cwd=tmp_path,
                        hooks=tmp_path / "hooks", MARK=str(tmp_path / "marks"))
    wait_paused(proc, tmp_path / "hooks", point)
    _send(proc, sig, to)
    out, err = _finish(proc)
    code = 128 + sig
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    assert out == "", "the script never ran: there is nothing to diagnose"
    assert _marks(tmp_path) == 0
    m = manifest(only_run_dir(tmp_path / "runs"))
    assert m["status"] == "interrupted" and m["exit_code"] == code and m["signal"] == sig, m
    assert m["status_detail"].endswith("during start-up, before the script ran"), m["status_detail"]
    assert "instruments" not in m["status_detail"]
    if point != "run-dir":  # held back, not raised inside torch's import (which can swallow it): the import finished
        assert "torch" in m["versions"], m["versions"]


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_signal_once_the_script_has_ended_stops_gpudoctor_after_the_manifest(sig: int, tmp_path: Path) -> None:
    """While gpudoctor finishes the run directory: it finishes it, then stops (no report)."""
    write_train(tmp_path)
    proc = start_paused("ended", "profile", "--out", "runs", *WINDOW, "train.py", cwd=tmp_path,
                        hooks=tmp_path / "hooks", MARK=str(tmp_path / "marks"))
    wait_paused(proc, tmp_path / "hooks", "ended")
    os.kill(proc.pid, sig)
    out, err = _finish(proc)
    assert proc.returncode == 128 + sig, err
    assert out == "" and gd_lines(err)[-1] == STOP_LINE[sig], err
    m = manifest(only_run_dir(tmp_path / "runs"))
    assert m["status"] == "completed" and m["exit_code"] == 0, m  # the script's own end
    assert f"{signal.Signals(sig).name} reached gpudoctor after the script had ended" in m["status_detail"]
    assert _marks(tmp_path) == 30


@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("command", ["analyze", "report", "compare", "check"])
def test_every_command_stops_on_a_signal_with_one_line(command: str, sig: int, profiled_run: Path,
                                                       tmp_path: Path) -> None:
    args = {"analyze": [profiled_run], "report": [profiled_run, "--format", "md"],
            "compare": [profiled_run, profiled_run], "check": [write_train(tmp_path)]}[command]
    proc = start_paused("command", command, *args, cwd=tmp_path, hooks=tmp_path / "hooks")
    wait_paused(proc, tmp_path / "hooks", "command")
    os.kill(proc.pid, sig)
    out, err = _finish(proc)
    assert proc.returncode == 128 + sig, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [STOP_LINE[sig]], err
    assert out == ""


def test_the_console_script_handles_signals_before_click_is_imported(tmp_path: Path) -> None:
    """`gpudoctor` as pip installs it: a wrapper that imports pyproject's entry point and calls it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the test extra pulls tomli on 3.10
        import tomli as tomllib
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]["gpudoctor"]
    module, func = entry.split(":")
    wrapper = tmp_path / "gpudoctor"
    wrapper.write_text(f"import sys\nfrom {module} import {func}\nif __name__ == '__main__':\n    sys.exit({func}())\n")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for sig in SIGNALS:
        proc = subprocess.Popen([sys.executable, str(wrapper), "rules"], cwd=tmp_path,
                                env=env(GPUDOCTOR_STARTUP_HOOK=f"entry:{hooks}"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        wait_paused(proc, hooks, "entry")
        (hooks / "entry").unlink()
        os.kill(proc.pid, sig)
        out, err = _finish(proc)
        assert proc.returncode == 128 + sig, err
        assert err == STOP_LINE[sig] + "\n" and out == ""


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


# DataLoader workers: torch's SIGCHLD handler in the training process (each worker's exit is a signal there)
LOADER = """
import os, time, torch
from torch.utils.data import DataLoader
m = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
dl = DataLoader([[float(i)] * 16 for i in range(160)], batch_size=8, num_workers=2, collate_fn=list,
                persistent_workers=True)
for epoch in range(100000):
    for batch in dl:
        opt.zero_grad(); m(torch.tensor(batch)).sum().backward(); opt.step()
        time.sleep(0.01)
    open(os.environ["MARK"], "a").write(f"{epoch}\\n")
"""

# a finalizer that runs while the parent is killed: Python swallows an exception raised in __del__
IN_DEL = """
import os, time, torch
class Slow:
    def __del__(self):
        open(os.environ["MARK"], "a").write("in __del__\\n")
        time.sleep(3)
m = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for i in range(100000):
    opt.zero_grad(); m(torch.randn(8, 16)).sum().backward(); opt.step()
    if i == 20:
        Slow()
    time.sleep(0.01)
"""


@pytest.mark.parametrize("script", ["loader", "in_del"])
def test_a_killed_parent_leaves_no_traceback_in_the_scripts_output(script: str, tmp_path: Path) -> None:
    """gpudoctor's process SIGKILLed: the training process gets SIGTERM (PR_SET_PDEATHSIG), flushes and ends.
    Its signals met the wakeup pipe without a reader (a BrokenPipeError traceback for each: the SIGTERM, the
    workers' SIGCHLD), and a SIGTERM that landed in a __del__ was swallowed ("Exception ignored in") and lost."""
    (tmp_path / "train.py").write_text(LOADER if script == "loader" else IN_DEL)
    proc = subprocess.Popen(gd_cmd("profile", "--out", "runs", *WINDOW, "--no-report", "train.py"), cwd=tmp_path,
                            env=env(MARK=str(tmp_path / "marks")), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    child = _child(proc)
    wait_for(lambda: _marks(tmp_path) >= (3 if script == "loader" else 1), timeout=90, what="the script running")
    os.kill(proc.pid, signal.SIGKILL)
    child.wait(timeout=60)  # the training process follows its parent: SIGTERM, flush, exit
    _out, err = proc.communicate(timeout=30)
    for text in ("Traceback", "Exception ignored", "BrokenPipeError"):
        assert text not in err, err
    state = json.loads((only_run_dir(tmp_path / "runs") / ".child-state.json").read_text())
    assert state["status"] == "killed" and state["exit_code"] == 128 + signal.SIGTERM, state


# --------------------------------------------------------------------------- view


def _view(tmp_path: Path, run: Path) -> tuple[subprocess.Popen[str], queue.Queue[str | None]]:
    proc = subprocess.Popen(gd_cmd("view", run), cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for ln in proc.stderr:
            lines.put(ln)
        lines.put(None)  # stderr closed: view has ended

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 150
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert proc.poll() is None, f"view ended early: {seen}"
            continue
        assert line is not None, f"view ended early: {seen}"
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


@pytest.mark.parametrize("sig", SIGNALS)
def test_view_cleans_up_and_exits_as_the_signal_says(sig: int, profiled_run: Path, tmp_path: Path) -> None:
    proc, lines = _view(tmp_path, profiled_run)
    tb, tmp = _tensorboard(proc)
    assert tmp.is_dir()
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + sig
    wait_for(lambda: not tb.is_running() or tb.status() == psutil.STATUS_ZOMBIE, timeout=30, what="TensorBoard to stop")
    assert not tmp.exists()
    rest = []
    while (line := lines.get(timeout=60)) is not None:  # what view wrote after serving, to its end
        rest.append(line)
    said = [ln.strip() for ln in rest if ln.strip()]
    assert said[-2:] == ["Stopping TensorBoard.", STOP_LINE[sig]], said
    assert not any("Traceback" in ln for ln in rest)


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
