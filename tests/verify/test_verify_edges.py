"""verify at the edges (issue: hold the contract at the edges, items 2, 6 and 7): an untrusted run
directory, a changed script, a read-only run, two verifies of one run, budgets that are not numbers,
and a SIGTERM that must stop the trials at once."""

from __future__ import annotations

import dataclasses
import hashlib
import signal
import threading
from pathlib import Path

import pytest
from test_verify_measure import _data, _fake, _workers

from gpudoctor import verify
from gpudoctor.config import Config
from gpudoctor.errors import UsageError
from gpudoctor.model import VerifyStatus
from gpudoctor.verify import VerifyOptions, _Arm, _Run, _verify_lock, measure, trial_command

OPTS = VerifyOptions(steps=30, trials=3)


def _with(run, **manifest_changes):
    return dataclasses.replace(run, manifest=dataclasses.replace(run.manifest, **manifest_changes))


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), 0.0, -5.0])
def test_a_budget_that_is_not_a_finite_positive_number_is_refused(budget: float) -> None:
    with pytest.raises(UsageError, match="--verify-budget"):
        VerifyOptions(budget_s=budget).check()


def test_a_script_outside_the_recorded_working_directory_is_refused_without_yes(tmp_path, monkeypatch) -> None:
    """verify runs whatever script the manifest names: a hostile run directory could name any file."""
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "evil.py").write_text("pass\n")
    (tmp_path / "work").mkdir()
    data = _with(_data(tmp_path / "work"), script=str(elsewhere / "evil.py"), argv=(str(elsewhere / "evil.py"),))
    with pytest.raises(UsageError, match="outside its working directory.*--yes"):
        measure(data, [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    assert calls == []  # nothing ran
    out, _ = measure(data, [_Arm("GD201", (_workers(1),))], Config(), dataclasses.replace(OPTS, allow_outside=True))
    assert out["GD201"].status == VerifyStatus.CONFIRMED


def test_a_script_that_changed_since_it_was_profiled_is_refused_without_allow_changed(tmp_path, monkeypatch) -> None:
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    data = _data(tmp_path)
    script = Path(data.manifest.script)
    data = _with(data, script_sha256=hashlib.sha256(script.read_bytes()).hexdigest())
    measure(data, [_Arm("GD201", (_workers(1),))], Config(), OPTS)  # unchanged: runs
    ran = len(calls)
    script.write_text("print('edited')\n")
    with pytest.raises(UsageError, match="changed since it was profiled.*--allow-changed"):
        measure(data, [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    assert len(calls) == ran
    measure(data, [_Arm("GD201", (_workers(1),))], Config(), dataclasses.replace(OPTS, allow_changed=True))
    assert len(calls) > ran


def test_the_trials_go_to_out_and_are_named_there(tmp_path, monkeypatch) -> None:
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    out_dir = tmp_path / "trials"
    out, _ = measure(_data(tmp_path), [_Arm("GD201", (_workers(1),))], Config(),
                     dataclasses.replace(OPTS, out_dir=out_dir))
    assert (out_dir / verify.MARKER).is_file()
    assert all(Path(rel).is_absolute() and Path(rel).parent.parent == out_dir.resolve() for rel, _ in calls)
    assert not (tmp_path / "run" / "verify").exists()


def test_an_unwritable_trial_folder_says_pass_out(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the folder's parent should be: no write can go there
    with pytest.raises(UsageError, match="pass --out DIR"):
        verify._verify_dir(blocker / "verify")


def test_two_verifies_of_one_folder_do_not_run_at_once(tmp_path) -> None:
    d = tmp_path / "run" / "verify"
    inside = threading.Event()
    release = threading.Event()

    def first() -> None:
        with _verify_lock(d):
            inside.set()
            release.wait(10)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    try:
        with pytest.raises(UsageError, match="another `gpudoctor verify` is running"), _verify_lock(d):
            pass
    finally:
        release.set()
        t.join(10)
    with _verify_lock(d):  # free again once the first is done
        pass


def test_a_sigterm_passed_on_to_a_trial_stops_verify_at_once(tmp_path, monkeypatch) -> None:
    """verify printed "passing SIGTERM on to the script", then ran every remaining round and exited 0."""
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)

    def stopped(manifest, run_dir, rel, changes, opts, timeout_s, rnd=0):
        r = trial(manifest, run_dir, rel, changes, opts, timeout_s, rnd)
        if len(calls) == 2:  # the second trial got the SIGTERM gpudoctor passed on
            return dataclasses.replace(r, ok=False, status="killed", signals=(int(signal.SIGTERM),),
                                       error=f"{rel}: killed: terminated by signal 15 (SIGTERM)")
        return r

    monkeypatch.setattr(verify.trials, "_trial", stopped)
    out, session = measure(_data(tmp_path), [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    assert len(calls) == 2 and session.interrupted and session.signum == signal.SIGTERM
    assert all(isinstance(r, _Run) for r in session.baseline.runs)


def test_the_command_each_trial_runs_is_shown_as_a_shell_would(tmp_path) -> None:
    m = _data(tmp_path).manifest
    m = dataclasses.replace(m, argv=(m.script, "--epochs", "1", "it's"))
    assert trial_command(m) == f"python {m.script} --epochs 1 'it'\"'\"'s'"
